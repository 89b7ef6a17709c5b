package dispatcher

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/queue"
)

const (
	// maxFinish bounds the outcomes one finish stores, so one script call
	// stays short.
	maxFinish = 128
	// maxUnstored bounds the outcomes an upstream's workers have decided
	// and its finisher not yet stored: past it the fetch loop takes no
	// more jobs until the finisher catches up.
	maxUnstored = 2 * maxFinish
	// finishLinger is the longest an outcome waits for others to share its
	// finish while jobs still run. The worker that decided it has gone on
	// to its next job, so the wait costs no throughput; it only delays the
	// moment a producer sees the job final.
	finishLinger = 2 * time.Millisecond
)

// A finisher stores the outcomes of one upstream's jobs, many to a script
// call (jobstore.Finish), while the workers that decided them go on to
// their next jobs. A finish's fixed cost in Redis is several times its
// cost per job, so an outcome waits (up to finishLinger) for the others of
// the jobs running beside it and those being taken, unless there are
// none: then no other is coming soon. A job stays held until its outcome is stored: its lease
// extended (upstream.inFlight), counted among the jobs Run waits for.
//
// It has one goroutine (run), which Run starts and stops.
type finisher struct {
	kick chan struct{} // buffered 1: look at the queue again

	mu    sync.Mutex
	queue []ending
	since time.Time // when the oldest of queue came
	// unstored counts the outcomes queued or being stored.
	unstored int
}

// ending is a job's outcome on its way to Redis, with what the job still
// holds.
type ending struct {
	f jobstore.Finished
	// job, when it carries sensitive headers kept aside, is the job whose
	// headers are renewed (a retry) or deleted once the outcome is stored.
	job *queue.Job
	// giveUpAt is when a store that keeps failing gives it up; zero until
	// a store of it fails.
	giveUpAt time.Time
}

func newFinisher() finisher { return finisher{kick: make(chan struct{}, 1)} }

func (f *finisher) wake() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// add queues an outcome; target is how many make a finish worth sending
// at once.
func (f *finisher) add(e ending, target int) {
	f.mu.Lock()
	f.queue = append(f.queue, e)
	f.unstored++
	n := len(f.queue)
	if n == 1 {
		f.since = time.Now()
	}
	f.mu.Unlock()
	if n == 1 || n == target {
		f.wake()
	}
}

// room is how many more outcomes may be left to the finisher.
func (f *finisher) room() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maxUnstored - f.unstored
}

// next takes up to max queued outcomes, appended to batch.
func (f *finisher) next(batch []ending, max int) []ending {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := min(len(f.queue), max)
	batch = append(batch, f.queue[:n]...)
	rest := copy(f.queue, f.queue[n:])
	clear(f.queue[rest:])
	f.queue = f.queue[:rest]
	f.since = time.Now()
	return batch
}

// finishTarget is how many outcomes make a finish worth sending without
// lingering: as many as one take gives the upstream's workers.
func (u *upstream) finishTarget() int { return min(cap(u.slots), maxTake) }

// finishing runs u's finisher until stop is closed, which Run does once
// every job has ended (so nothing is left queued). From the moment ctx
// ends (shutdown) it no longer lingers.
func (d *Dispatcher) finishing(ctx context.Context, stop <-chan struct{}, u *upstream, workers *sync.WaitGroup) {
	f := &u.ends
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	ended := ctx.Done()
	var batch []ending
	for {
		f.mu.Lock()
		n, since := len(f.queue), f.since
		f.mu.Unlock()
		var fire <-chan time.Time
		if n > 0 {
			// Jobs running or being taken will bring outcomes soon:
			// linger for them, unless a finish's worth is here.
			wait := time.Duration(0)
			if n < u.finishTarget() && (len(u.slots) > 0 || !u.idling.Load()) && ended != nil {
				wait = finishLinger - time.Since(since)
			}
			if wait <= 0 {
				batch = d.store(u, f.next(batch[:0], maxFinish), workers)
				continue
			}
			timer.Reset(wait)
			fire = timer.C
		}
		select {
		case <-f.kick:
		case <-fire:
		case <-ended:
			ended = nil
		case <-stop:
			return
		}
		if fire != nil && !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// store writes a batch of outcomes, then lets go of their jobs. While
// Redis is unreachable it tries again, backing off, taking in outcomes
// that come meanwhile, and gives each up outcomeWait after its first
// failed store (its job, still held, keeps its lease meanwhile): an
// answered job is not sent again unless Redis stays away that long. It
// returns batch, emptied, for reuse.
func (d *Dispatcher) store(u *upstream, batch []ending, workers *sync.WaitGroup) []ending {
	name := u.cfg.Name
	items := make([]jobstore.Finished, 0, len(batch))
	warned, tried := false, false
	for pause := 50 * time.Millisecond; len(batch) > 0; pause = min(2*pause, time.Second) {
		items = items[:0]
		for i := range batch {
			items = append(items, batch[i].f)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		errs, err := u.finish(ctx, items)
		cancel()
		if err == nil {
			d.finished(u, batch, errs, tried)
			break
		}
		d.m.RedisErrors.WithLabelValues("results").Inc()
		if !unreachable(err) {
			refused := func(e ending, err error) {
				d.log.Error("could not record a job's outcome; when its lease runs out it is sent again", "upstream", name, "job", e.f.ID, "err", err)
			}
			if len(batch) == 1 {
				refused(batch[0], err)
				break
			}
			// One outcome Redis or the store refuses must not take the
			// others of its finish with it: each goes on its own.
			for i := range batch {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				errs, err := u.finish(ctx, items[i:i+1])
				cancel()
				if err != nil {
					d.m.RedisErrors.WithLabelValues("results").Inc()
					refused(batch[i], err)
					continue
				}
				d.finished(u, batch[i:i+1], errs, tried)
			}
			break
		}
		tried = true
		now := time.Now()
		kept := batch[:0]
		var lost []ending
		for _, e := range batch {
			if e.giveUpAt.IsZero() {
				e.giveUpAt = now.Add(outcomeWait)
			}
			if now.After(e.giveUpAt) {
				lost = append(lost, e)
				continue
			}
			kept = append(kept, e)
		}
		if len(lost) > 0 {
			d.log.Error("could not record jobs' outcomes; when their leases run out they are sent again", "upstream", name, "jobs", len(lost), "err", err)
			u.release(lost, workers)
		}
		batch = kept
		if len(batch) == 0 {
			break
		}
		if !warned {
			warned = true
			d.log.Warn("cannot record jobs' outcomes; holding the jobs until Redis answers", "upstream", name, "jobs", len(batch), "for_at_most", outcomeWait, "err", err)
		}
		time.Sleep(pause)
		batch = u.ends.next(batch, maxFinish-len(batch))
	}
	u.release(batch, workers)
	clear(batch)
	return batch[:0]
}

// finished takes a finish's answer for batch: errs[i] is set for an
// outcome whose job was no longer this worker's to finish (its lease ran
// out and recovery gave it back, or an earlier attempt of this finish,
// which timed out on the client, stored it after all: tried). What follows
// a stored outcome (the next due time, the sensitive headers) follows only
// those stored now: a job recovery gave back keeps its headers for its next
// attempt.
func (d *Dispatcher) finished(u *upstream, batch []ending, errs []error, tried bool) {
	done := batch
	if slices.ContainsFunc(errs, func(e error) bool { return e != nil }) {
		done = make([]ending, 0, len(batch))
		for i := range batch {
			if i >= len(errs) || errs[i] == nil {
				done = append(done, batch[i])
				continue
			}
			if tried {
				d.log.Info("a job's outcome was stored already, or its lease ran out meanwhile", "upstream", u.cfg.Name, "job", batch[i].f.ID)
			} else {
				d.log.Warn("a job's outcome came after its lease ran out; recovery already gave it back", "upstream", u.cfg.Name, "job", batch[i].f.ID)
			}
		}
	}
	d.stored(u, done)
}

// stored does what follows a batch of outcomes once it is in Redis.
func (d *Dispatcher) stored(u *upstream, batch []ending) {
	retry := false
	var secrets []ending
	for _, e := range batch {
		switch e.f.Outcome {
		case jobstore.Succeeded:
			u.due(jobstore.Completed, time.Now().Add(e.f.Retention))
		case jobstore.Dead:
			u.due(jobstore.Archived, time.Now().Add(u.cfg.DeadRetention))
		case jobstore.Retry:
			retry = true
		}
		if e.job != nil {
			secrets = append(secrets, e)
		}
	}
	if len(secrets) > 0 {
		d.settleSecrets(u, secrets)
	}
	if retry {
		// This replica knows when it comes due; wake in time for it.
		u.poke()
	}
}

// settleSecrets renews the sensitive headers of jobs that run again and
// deletes those of jobs that do not, in one round trip. A failure leaves
// them the TTL the worker's read gave them.
func (d *Dispatcher) settleSecrets(u *upstream, batch []ending) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	pipe := d.rdb.Pipeline()
	now := time.Now()
	for _, e := range batch {
		if e.f.Outcome == jobstore.Retry {
			_ = queue.RenewSecrets(ctx, pipe, d.cfg.Prefix, e.job, now, e.f.RetryAt.Sub(now))
		} else {
			_ = queue.DeleteSecrets(ctx, pipe, d.cfg.Prefix, e.job)
		}
	}
	cmds, err := pipe.Exec(ctx)
	if err == nil {
		return
	}
	failed := 0
	for _, c := range cmds {
		if c.Err() != nil {
			failed++
		}
	}
	d.m.RedisErrors.WithLabelValues("secrets").Add(float64(max(failed, 1)))
	d.log.Warn("could not renew or delete the sensitive headers of finished jobs; they expire with their TTL", "upstream", u.cfg.Name, "jobs", len(batch), "failed", failed, "err", err)
}

// release lets go of jobs whose outcomes are stored or given up, and
// wakes a fetch loop that waited for the finisher to catch up.
func (u *upstream) release(batch []ending, workers *sync.WaitGroup) {
	if len(batch) == 0 {
		return
	}
	u.mu.Lock()
	for _, e := range batch {
		delete(u.inFlight, e.f.ID)
	}
	u.mu.Unlock()
	u.ends.mu.Lock()
	u.ends.unstored -= len(batch)
	u.ends.mu.Unlock()
	if u.starved.Load() {
		u.poke()
	}
	for range batch {
		workers.Done()
	}
}
