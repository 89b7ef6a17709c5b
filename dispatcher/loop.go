package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// taskLease is asynq's lease on an active job: a replica that stops
// extending it (it died) loses the job to recovery after this long.
const (
	taskLease       = 30 * time.Second
	leaseRenewEvery = 5 * time.Second
	// leaseRenewers bounds the upstreams whose leases are renewed at once.
	leaseRenewers = 16
	// maxTake bounds the jobs one take books, so one script call stays short.
	maxTake = 64
	// sweepEvery is how often every upstream's finished jobs are swept
	// for ones past their retention, whatever this replica knows: dead
	// jobs also come from cancels in the API, which no worker sees. In
	// between, an upstream is swept when the oldest finished job it knows
	// of passes its retention.
	sweepEvery = 15 * time.Minute
	// outcomeWait bounds how long a worker whose job was answered keeps
	// trying to record the outcome while Redis is unreachable; the job's
	// lease, which this replica keeps extending meanwhile, outlives it.
	outcomeWait = 20 * time.Second
)

// Run drains every upstream until ctx ends, then shuts down gracefully:
// no new jobs are taken, jobs waiting for their slot go back to the head
// of their queue at once without spending an attempt, and requests in
// flight get up to ShutdownTimeout to finish.
//
// Nothing polls an idle upstream: a worker that finds no work sleeps
// until an enqueue wakes it (over pub/sub), until something it knows of
// comes due (a scheduled job, a parked partition, a lease), or at most
// PollInterval.
func (d *Dispatcher) Run(ctx context.Context) error {
	for _, name := range d.order {
		if u := d.ups[name]; u.base == nil && u.handler == nil {
			return fmt.Errorf("dispatcher: upstream %s has neither a base URL nor a handler", name)
		}
	}
	d.registerQueues(ctx)
	bgCtx, stopBg := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	bg.Add(6)
	go func() {
		defer bg.Done()
		d.drain.Run(bgCtx, time.Second)
	}()
	go func() {
		defer bg.Done()
		// Blocks placed by other replicas reach slots already booked here.
		for bgCtx.Err() == nil {
			if err := d.pacer.Watch(bgCtx); err != nil {
				d.log.Warn("cannot watch for upstream blocks", "err", err)
				return
			}
			sleep(bgCtx, time.Second)
		}
	}()
	go func() {
		defer bg.Done()
		d.listen(bgCtx)
	}()
	go func() {
		defer bg.Done()
		d.upkeep(bgCtx)
	}()
	go func() {
		defer bg.Done()
		d.sweeps(bgCtx)
	}()
	go func() {
		defer bg.Done()
		// Limits an operator sets reach this replica within a second.
		d.followLimits(bgCtx)
	}()

	// workers counts the jobs taken and not yet let go of: a job is let
	// go of once its outcome is stored (or it is put back).
	var workers sync.WaitGroup
	// Requests in flight outlive ctx by up to ShutdownTimeout.
	sendCtx, stopSends := context.WithCancel(context.Background())
	var loops, finishers sync.WaitGroup
	stopFinishers := make(chan struct{})
	for _, name := range d.order {
		u := d.ups[name]
		finishers.Add(1)
		go func() {
			defer finishers.Done()
			d.finishing(ctx, stopFinishers, u, &workers)
		}()
		d.log.Info("draining upstream", "upstream", name, "limits", limitsString(u.cfg.Limits),
			"workers", u.cfg.Workers, "concurrency", u.cfg.Concurrency)
		loops.Add(1)
		go func() {
			defer loops.Done()
			d.fetch(ctx, sendCtx, u, &workers)
		}()
	}
	<-ctx.Done()
	d.log.Info("shutting down: handing back waiting jobs, finishing requests in flight", "timeout", d.cfg.ShutdownTimeout)
	loops.Wait()
	d.stopWaiting()
	done := make(chan struct{})
	go func() {
		workers.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d.cfg.ShutdownTimeout):
		d.log.Warn("requests still in flight at the shutdown timeout; cancelling them, their jobs go back to the queue")
		stopSends()
		<-done
	}
	close(stopFinishers)
	finishers.Wait()
	stopSends()
	stopBg()
	bg.Wait()
	return nil
}

// registerQueues lists the upstreams' queues in asynq's set of queues, so
// asynq's Inspector and tools find them before any job is enqueued.
func (d *Dispatcher) registerQueues(ctx context.Context) {
	names := make([]any, 0, len(d.order))
	for _, name := range d.order {
		names = append(names, jobstore.QueueName(name))
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := d.rdb.SAdd(rctx, jobstore.AllQueues, names...).Err(); err != nil {
		d.log.Warn("could not register queues with asynq", "err", err)
	}
}

// listen wakes upstreams: on an enqueue's announcement, on a block or
// unblock of their bucket, and all of them when the subscription comes
// back after a break (announcements may have been missed).
func (d *Dispatcher) listen(ctx context.Context) {
	byQueue := map[string]*upstream{}
	for _, u := range d.ups {
		byQueue[jobstore.QueueName(u.cfg.Name)] = u
	}
	wakeAll := func() {
		for _, u := range d.ups {
			u.poke()
		}
	}
	// The channel delivers a *redis.Subscription each time go-redis
	// (re)subscribes, after a dropped connection too: then anything
	// announced meanwhile was missed, and every upstream looks again.
	ps := d.rdb.Subscribe(ctx, jobstore.WakeChannel(d.cfg.Prefix), d.pacer.BlocksChannel())
	defer ps.Close()
	ch := ps.ChannelWithSubscriptions()
	for {
		select {
		case <-ctx.Done():
			return
		case msg, ok := <-ch:
			if !ok {
				return
			}
			switch m := msg.(type) {
			case *redis.Subscription:
				wakeAll()
			case *redis.Message:
				if m.Channel != d.pacer.BlocksChannel() {
					if u, ok := d.ups[m.Payload]; ok {
						u.poke()
					}
				} else if q, _, ok := strings.Cut(m.Payload, " "); ok {
					if u, ok := byQueue[q]; ok {
						u.poke()
					}
				}
			}
		}
	}
}

func (u *upstream) poke() {
	select {
	case u.wake <- struct{}{}:
	default:
	}
}

// fetch takes an upstream's jobs as workers free up and their slots come,
// and sleeps in between.
func (d *Dispatcher) fetch(ctx, sendCtx context.Context, u *upstream, workers *sync.WaitGroup) {
	name := u.cfg.Name
	backoff := 50 * time.Millisecond
	paused := false
	defer func() {
		if paused {
			d.m.UpstreamPaused.WithLabelValues(name).Set(0)
		}
	}()
	// want is how many jobs a take may give: one for each free worker,
	// while the finisher has room for their outcomes.
	want := func() int {
		return min(cap(u.slots)-len(u.slots), u.ends.room(), maxTake)
	}
	var gathering time.Time // when the loop began waiting for more free workers
	// hold is how long the loop waits for workers before it takes.
	hold := func() (int, time.Duration) {
		if n := want(); n > 0 {
			return n, u.gather(n, &gathering)
		}
		// A free worker waits no longer than a horizon for a job.
		return 0, d.cfg.Horizon
	}
	for ctx.Err() == nil {
		n, gap := hold()
		if gap > 0 {
			// Every worker holds a job (or the finisher is behind, or more
			// workers are about to be free); the next one to finish pokes
			// us.
			u.starved.Store(true)
			if _, gap = hold(); gap > 0 {
				d.idle(ctx, u, gap)
			}
			u.starved.Store(false)
			continue
		}
		gathering = time.Time{}
		u.gatherAll.Store(false)
		// Not cut short by the shutdown: a take that ran in Redis must
		// reach the workers, which put its jobs back when they see it.
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		issued := time.Now()
		tk, err := u.taker.Take(tctx, n)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// Pacing fails closed: no send without a booked slot.
			d.m.RedisErrors.WithLabelValues("pacing").Inc()
			d.log.Error("cannot take jobs", "upstream", name, "err", err)
			d.idle(ctx, u, backoff)
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		u.takeRTT.note(time.Since(issued))
		if blocked := tk.Reason == leaky.ReasonBlocked; blocked != paused {
			paused = blocked
			d.m.UpstreamPaused.WithLabelValues(name).Set(map[bool]float64{true: 1}[blocked])
		}
		if len(tk.Jobs) > 0 {
			// Slots booked ahead (beyond what the round trips' jitter
			// explains) say the upstream's limits hold the sends back.
			ahead := time.Duration(0)
			for _, j := range tk.Jobs {
				ahead = max(ahead, time.Until(j.Slot.SendAt()))
			}
			u.paced.Store(ahead > pacedAhead)
		}
		for _, j := range tk.Jobs {
			u.slots <- struct{}{}
			u.hold(j.ID, true)
			workers.Add(1)
			select {
			case u.handoff <- j:
			default:
				go d.worker(ctx, sendCtx, u, j, workers)
			}
		}
		if tk.Expired {
			if d.recover(ctx, u, tk.Now) == 0 {
				// Nothing came of it (another replica was quicker, or a
				// lease names a job that is not active): do not spin.
				d.idle(ctx, u, time.Second)
			}
			continue
		}
		if len(tk.Jobs) == n {
			continue
		}
		// The backstop look, jittered so a replica's upstreams do not all
		// look at once.
		wait := d.cfg.PollInterval*9/10 + rand.N(d.cfg.PollInterval/5+1)
		concurrency := false
		if tk.Wait > 0 {
			wait = min(wait, tk.Wait)
			if tk.Reason == leaky.ReasonConcurrency {
				// Leases free up as requests finish, not on a schedule:
				// this replica's own finishing pokes the loop, and another
				// replica's is seen within the short wait.
				concurrency = true
				wait = min(wait, 20*time.Millisecond) + rand.N(10*time.Millisecond)
			}
		} else if len(tk.Jobs) > 0 {
			// Took what there was; look once more before sleeping.
			continue
		}
		if tk.Next > 0 {
			wait = min(wait, tk.Next)
		}
		u.starved.Store(concurrency)
		d.idle(ctx, u, wait)
		u.starved.Store(false)
	}
}

// workerIdle is how long a worker goroutine waits for its next job before
// it ends.
const workerIdle = 10 * time.Second

// worker runs job j, then each job handed to it (u.handoff) until none
// comes within workerIdle or ctx (the fetch loop's) ends. A goroutine kept
// for the next job keeps the stack the last one grew (the Redis client's
// and net/http's calls are deep), which a goroutine started per job grows
// anew each time.
func (d *Dispatcher) worker(ctx, sendCtx context.Context, u *upstream, j jobstore.Taken, workers *sync.WaitGroup) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		d.job(sendCtx, u, j, workers)
		idle.Reset(workerIdle)
		select {
		case j = <-u.handoff:
		case <-idle.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// job runs one taken job and hands its outcome to the upstream's
// finisher, which holds the job until the outcome is stored; the worker
// is free for its next job at once.
func (d *Dispatcher) job(ctx context.Context, u *upstream, j jobstore.Taken, workers *sync.WaitGroup) {
	start := time.Now()
	if e, ok := d.work(ctx, u, j); ok {
		u.ends.add(e, u.finishTarget())
	} else {
		u.hold(j.ID, false)
		workers.Done()
	}
	u.run.note(time.Since(start))
	<-u.slots
	busy := len(u.slots)
	if busy == 0 && u.idling.Load() {
		// No job runs and none is being taken: no outcome will join
		// those waiting to be stored soon.
		u.ends.wake()
	}
	// A starved loop is woken once a quarter of the workers are free, or
	// all of them (or by its timer), so that a take carries several jobs
	// rather than one each time a worker frees (see gather).
	if u.starved.Load() && (busy == 0 || !u.gatherAll.Load() && cap(u.slots)-busy >= max(1, cap(u.slots)/4)) {
		u.poke()
	}
}

// pacedAhead is how far ahead of now a take's latest slot must be for the
// upstream's limits to count as holding its sends back (see gather).
const pacedAhead = time.Millisecond

// gather tells how long the fetch loop, with n workers free, waits for
// more to be free before it takes (0: take now). A take's fixed cost in
// Redis is several times its cost per job, so taking for each worker as
// it frees costs several times a take for all of them. The loop waits
// only while every job running is bound by the workers, not by the
// limits (see paced: while the limits space the sends out, a worker not
// refilled at once lets the booked sends run dry, which a strict limit
// never gives back), and runs shorter than a take's round trip: then it
// waits for all of them to be free, for at most a take's round trip since
// it began to wait (gathering, kept by the caller), which is no longer
// than the ones it did not wait for would wait for the next take. It
// takes at once when no job runs (the first job of an idle upstream goes
// at once), and for slower jobs (an HTTP upstream's) as it always did:
// whenever a worker is free, and once a quarter of them are after every
// one was busy (see job).
func (u *upstream) gather(n int, gathering *time.Time) time.Duration {
	all := false
	defer func() { u.gatherAll.Store(all) }()
	if len(u.slots) == 0 || n >= maxTake || u.paced.Load() {
		return 0
	}
	run, rtt := u.run.get(), u.takeRTT.get()
	if run <= 0 || run > rtt {
		return 0
	}
	all = true
	now := time.Now()
	if gathering.IsZero() {
		*gathering = now
	}
	return max(gathering.Add(rtt).Sub(now), 0)
}

// ewma is an exponentially weighted moving average of durations, for one
// writer (a lost update between writers only slows it a little).
type ewma struct{ ns atomic.Int64 }

func (e *ewma) get() time.Duration { return time.Duration(e.ns.Load()) }

func (e *ewma) note(d time.Duration) {
	old := e.ns.Load()
	if old == 0 {
		e.ns.Store(int64(d))
		return
	}
	e.ns.Store(old + (int64(d)-old)/8)
}

// idle sleeps up to d, or until the upstream is poked.
func (d *Dispatcher) idle(ctx context.Context, u *upstream, dur time.Duration) {
	u.idling.Store(true)
	defer u.idling.Store(false)
	if len(u.slots) == 0 {
		// No job runs and none is being taken: the finisher need not
		// wait for more outcomes.
		u.ends.wake()
	}
	t := time.NewTimer(dur)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-u.wake:
	case <-t.C:
	}
}

// hold records that this replica holds a job (its lease is extended).
func (u *upstream) hold(id string, on bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if on {
		u.inFlight[id] = true
	} else {
		delete(u.inFlight, id)
	}
}

func (u *upstream) held() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]string, 0, len(u.inFlight))
	for id := range u.inFlight {
		out = append(out, id)
	}
	return out
}

// recover ends jobs whose worker died holding them; it returns how many.
// now is Redis's clock, which the leases were set by.
func (d *Dispatcher) recover(ctx context.Context, u *upstream, now time.Time) int {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := jobstore.Recover(rctx, d.rdb, u.store, u.space.CountsKey(), u.space.BacklogKey(), now, 100,
		jobstore.AnnounceFinal(jobstore.FinalChannel(d.cfg.Prefix)), jobstore.Callbacks(u.space.CallbacksDueKey()))
	if err != nil {
		d.m.RedisErrors.WithLabelValues("pacing").Inc()
		d.log.Warn("could not recover jobs whose worker stopped", "upstream", u.cfg.Name, "err", err)
		return 0
	}
	if n > 0 {
		d.log.Warn("recovered jobs whose worker stopped holding them", "upstream", u.cfg.Name, "jobs", n)
	}
	return n
}

// upkeep extends the leases of the jobs this replica holds (apart from
// sweeps, so that a slow sweep never delays a lease).
func (d *Dispatcher) upkeep(ctx context.Context) {
	t := time.NewTicker(leaseRenewEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		until := time.Now().Add(taskLease)
		// Upstreams at once (a few at a time), so that one whose Redis
		// master is slow or gone cannot hold back the others' renewals
		// past their leases.
		var wg sync.WaitGroup
		gate := make(chan struct{}, leaseRenewers)
		for _, name := range d.order {
			u := d.ups[name]
			ids := u.held()
			if len(ids) == 0 {
				continue
			}
			wg.Add(1)
			gate <- struct{}{}
			go func() {
				defer func() {
					<-gate
					wg.Done()
				}()
				rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				if err := jobstore.ExtendLeases(rctx, d.rdb, u.store, ids, until); err != nil {
					d.m.RedisErrors.WithLabelValues("pacing").Inc()
					d.log.Warn("could not extend the leases of jobs in flight", "upstream", name, "err", err)
				}
				// A busy upstream's limits that move by themselves (an
				// adaptive one climbing, another replica's cut or learning)
				// are shown as they are now.
				if u.isAdaptive() || u.heard.any() {
					d.showLimits(rctx, u)
				}
			}()
		}
		wg.Wait()
	}
}

// sweeps deletes finished jobs past their retention: on an upstream when
// the oldest it knows of is due, and on every upstream about every
// sweepEvery (jittered, so that replicas started together do not sweep
// together).
func (d *Dispatcher) sweeps(ctx context.Context) {
	t := time.NewTicker(leaseRenewEvery)
	defer t.Stop()
	nextFull := time.Now().Add(sweepEvery*9/10 + rand.N(sweepEvery/5))
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		full := time.Now().After(nextFull)
		if full {
			nextFull = time.Now().Add(sweepEvery)
		}
		for _, name := range d.order {
			for _, z := range []jobstore.Zset{jobstore.Completed, jobstore.Archived} {
				if ctx.Err() != nil {
					return
				}
				d.sweep(ctx, d.ups[name], z, full)
			}
		}
	}
}

// due notes that a finished job of set z passes its retention at t.
func (u *upstream) due(z jobstore.Zset, t time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if at, ok := u.sweepAt[z]; !ok || t.Before(at) {
		u.sweepAt[z] = t
	}
}

// sweep deletes an upstream's jobs of set z past their retention, if any
// are due (or always, when full), and learns when the next will be.
func (d *Dispatcher) sweep(ctx context.Context, u *upstream, z jobstore.Zset, full bool) {
	now := time.Now()
	u.mu.Lock()
	at, known := u.sweepAt[z]
	u.mu.Unlock()
	if !full && (!known || at.After(now)) {
		return
	}
	// A succeeded job is scored by when its retention ends, a dead one by
	// when it died.
	keep, key := time.Duration(0), u.store.Completed()
	if z == jobstore.Archived {
		keep, key = u.cfg.DeadRetention, u.store.Archived()
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// Up to 50 batches a tick: an upstream finishing jobs fast must not
	// finish them faster than they are deleted.
	const batch, batches = 1000, 50
	n := 0
	for range batches {
		m, err := jobstore.DeleteExpired(rctx, d.rdb, u.store, u.space.CountsKey(), z, now.Add(-keep), batch, u.bounds)
		if err != nil {
			if ctx.Err() == nil {
				d.log.Warn("could not delete finished jobs past their retention", "upstream", u.cfg.Name, "set", z, "err", err)
			}
			return
		}
		n += m
		if m < batch {
			break
		}
	}
	if n > 0 {
		d.log.Info("deleted finished jobs past their retention", "upstream", u.cfg.Name, "set", z, "deleted", n)
	}
	next := now // more to delete: again at the next tick
	if n%batch != 0 || n == 0 {
		first, err := d.rdb.ZRangeWithScores(rctx, key, 0, 0).Result()
		switch {
		case err != nil:
			return
		case len(first) == 0:
			next = time.Time{}
		default:
			next = jobstore.ScoreTime(first[0].Score).Add(keep)
		}
	}
	u.mu.Lock()
	if next.IsZero() {
		delete(u.sweepAt, z)
	} else {
		u.sweepAt[z] = next
	}
	u.mu.Unlock()
}

// work runs one taken job: waits for its slot, sends it, and returns the
// outcome to store (false: nothing is left to store).
func (d *Dispatcher) work(ctx context.Context, u *upstream, t jobstore.Taken) (ending, bool) {
	name := u.cfg.Name
	msg, err := jobstore.Unmarshal(t.Msg)
	if err != nil {
		// Nothing of it can be sent; keep it among the dead to be seen.
		d.m.Dispatches.WithLabelValues(name, "dead").Inc()
		msg = &jobstore.Message{Type: queue.TaskType, ID: t.ID, Queue: u.store.Queue(), Payload: t.Msg}
		job := queue.Job{ID: t.ID, Upstream: name}
		return d.end(ctx, u, t, msg, &job, nil, dead("undecodable task message: %v", err))
	}
	job, err := queue.DecodeJob(msg.ID, msg.Payload)
	if err != nil {
		job = queue.Job{ID: t.ID, Upstream: name}
		d.m.Dispatches.WithLabelValues(name, "dead").Inc()
		return d.end(ctx, u, t, msg, &job, nil, dead("undecodable job: %v", err))
	}
	// The job as stored, before the send puts its sensitive headers back
	// or a handler changes it: a success keeps it (less its request)
	// without decoding the payload again.
	stored := job
	stored.Cost = maps.Clone(job.Cost) // a handler may change its own
	return d.end(ctx, u, t, msg, &job, &stored, d.run(ctx, u, t, msg, &job))
}

// run sends a job when its slot comes and decides its outcome.
func (d *Dispatcher) run(ctx context.Context, u *upstream, t jobstore.Taken, msg *jobstore.Message, job *queue.Job) outcome {
	name := u.cfg.Name
	if !job.ExpiresAt.IsZero() && time.Now().After(job.ExpiresAt) {
		d.m.Dispatches.WithLabelValues(name, "expired").Inc()
		return dead("expired at %s before it could be dispatched", job.ExpiresAt.Format(time.RFC3339))
	}
	if o, ok := d.withSecrets(ctx, job); !ok {
		return o
	}
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(d.stopping, cancel)
	defer stop()
	start := time.Now()
	r := t.Slot
	if err := r.Wait(waitCtx); err != nil {
		if errors.Is(err, leaky.ErrLate) {
			d.m.LateSlots.WithLabelValues(name).Inc()
		}
		return requeue()
	}
	waited := time.Since(start)
	d.m.PacingWait.WithLabelValues(name).Observe(waited.Seconds())
	v, resp, sent := d.send(ctx, u, job, r)
	if !sent {
		d.m.LateSlots.WithLabelValues(name).Inc()
		return requeue()
	}
	if ctx.Err() != nil && v.kind == kindRetry {
		// Cut off by the shutdown timeout: not the upstream's fault.
		return requeue()
	}
	v = d.heed(ctx, u, job, resp, v)
	if d.log.Enabled(ctx, slog.LevelDebug) {
		status := 0
		if resp != nil {
			status = resp.Status
		}
		d.log.Debug("dispatched", "upstream", name, "job", t.ID, "lane", job.Lane, "attempt", int(msg.Retried)+1,
			"status", status, "outcome", v.kind.String(), "waited", waited, "took", time.Since(start)-waited)
	}
	var stored *queue.Response
	if resp != nil {
		stored = u.stored(resp)
	}
	attempt := int(msg.Retried) + 1
	switch v.kind {
	case kindDone:
		d.m.Dispatches.WithLabelValues(name, "succeeded").Inc()
		return succeeded(stored)
	case kindPushback:
		d.m.Dispatches.WithLabelValues(name, "deferred").Inc()
		return pushedBack(v, time.Now()).with(stored)
	case kindRetry:
		if !queue.LastAttempt(job, attempt) {
			d.m.Dispatches.WithLabelValues(name, "retry").Inc()
			delay := max(backoff(attempt, u.cfg.Retry.MinBackoff, u.cfg.Retry.MaxBackoff), v.wait)
			return retryAfter(delay, fmt.Sprintf("attempt %d of %d: %s", attempt, job.MaxAttempts, v.reason)).with(stored)
		}
		d.m.Dispatches.WithLabelValues(name, "dead").Inc()
		return dead("gave up after %d attempts: %s", attempt, v.reason).with(stored)
	default:
		d.m.Dispatches.WithLabelValues(name, "dead").Inc()
		return dead("%s", v.reason).with(stored)
	}
}

// end releases what a job held besides its lease and returns its outcome
// to store, with its response. A job that goes back to its queue unsent
// is put back here, and false returned.
// stored is the job as decoded from msg (nil: it could not be).
func (d *Dispatcher) end(ctx context.Context, u *upstream, t jobstore.Taken, msg *jobstore.Message, job, stored *queue.Job, o outcome) (ending, bool) {
	name := u.cfg.Name
	bg := context.WithoutCancel(ctx)
	if o.kind == outRequeue {
		// Held (its lease extended) until Redis takes it back: a job whose
		// lease ran out would be recovered with an attempt spent, though
		// it was never sent.
		err := d.untilStored(bg, "pacing", "put a job back", u, t.ID, func(ctx context.Context) error {
			_, err := u.space.Requeue(ctx, d.rdb, u.bucket.Layout().Leases, t.ID)
			return err
		})
		if err != nil {
			d.log.Error("could not put a job back; when its lease runs out it is recovered", "upstream", name, "job", t.ID, "err", err)
		}
		return ending{}, false
	}
	if t.Slot.Lease != "" {
		rctx, cancel := context.WithTimeout(bg, 2*time.Second)
		if err := u.bucket.Release(rctx, t.Slot); err != nil {
			d.m.RedisErrors.WithLabelValues("pacing").Inc()
		}
		cancel()
	}
	f := jobstore.Finished{ID: t.ID, Lane: job.Lane, Partition: job.Partition, Msg: msg, Callback: job.CallbackURL != ""}
	if o.resp != nil {
		if b, err := queue.EncodeResponse(o.resp); err == nil {
			f.Result = b
		}
	}
	switch o.kind {
	case outSucceeded:
		f.Outcome, f.Retention = jobstore.Succeeded, u.cfg.ResultRetention
		if stored != nil {
			f.Msg = queue.SucceededJobMessage(msg, stored)
		} else {
			f.Msg = queue.SucceededMessage(msg)
		}
	case outHandBack:
		f.Outcome, f.RetryAt, f.WaitsFor = jobstore.Retry, time.Now().Add(o.delay), o.waitsFor
	case outRetry:
		f.Outcome, f.RetryAt, f.Failure = jobstore.Retry, time.Now().Add(o.delay), true
	default:
		f.Outcome = jobstore.Dead
	}
	f.ErrMsg = o.lastError()
	e := ending{f: f}
	if job.Secrets != "" {
		e.job = job
	}
	return e, true
}

// untilStored runs write until Redis takes it: while Redis is unreachable
// it tries again, backing off, for up to outcomeWait (the job, still held,
// keeps its lease meanwhile). It returns the last error, nil once written.
func (d *Dispatcher) untilStored(ctx context.Context, metric, what string, u *upstream, id string, write func(context.Context) error) error {
	deadline := time.Now().Add(outcomeWait)
	for pause := 50 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := write(wctx)
		cancel()
		if err == nil {
			return nil
		}
		d.m.RedisErrors.WithLabelValues(metric).Inc()
		if !unreachable(err) || time.Now().After(deadline) {
			return err
		}
		if pause == 50*time.Millisecond {
			d.log.Warn("cannot "+what+"; holding the job until Redis answers", "upstream", u.cfg.Name, "job", id, "for_at_most", outcomeWait, "err", err)
		}
		time.Sleep(pause)
	}
}

func limitsString(ls []leaky.Limit) string {
	parts := make([]string, len(ls))
	for i, l := range ls {
		parts[i] = l.String()
	}
	return strings.Join(parts, " and ")
}
