package schedule

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/shaperhq/shaper/metrics"
)

// Jobs makes the runs of schedules; the API server implements it by
// checking a schedule's job as POST /v1/jobs checks one and enqueueing it.
type Jobs interface {
	// Enqueue enqueues sch's job with idempotency key key: a repeat of a
	// key returns the job it made. A job refused for good at this tick (it
	// is no longer valid, its upstream is no longer configured, its
	// backlog is full) is a Run with Refused set and a nil error. An error
	// means it could not tell (Redis failed); the tick stays due.
	Enqueue(ctx context.Context, sch *Schedule, key string) (Run, error)
}

// Run is what one enqueue of a schedule's job came to.
type Run struct {
	JobID string
	// Created is false when the key's job existed already.
	Created bool
	// Refused, when set, says why no job was made.
	Refused string
}

// RunnerConfig configures a Runner; zero values are documented defaults.
type RunnerConfig struct {
	// Interval is the longest the runner waits between two looks at the
	// calendar; default 1s. It sleeps until the next tick when that comes
	// sooner, so ticks run on time; the bound is how late it sees a
	// schedule made elsewhere with a nearer tick, and what an idle
	// replica costs Redis: one call per Interval.
	Interval time.Duration
	Logger   *slog.Logger
	Metrics  *metrics.Metrics
}

// DefaultInterval is a Runner's default Interval.
const DefaultInterval = time.Second

// Runner runs due schedules. Every replica runs one; see the package doc
// for why that needs no leader.
type Runner struct {
	st       *Store
	jobs     Jobs
	interval time.Duration
	log      *slog.Logger
	m        *metrics.Metrics
	failing  bool // the last pass failed; logged once until one succeeds
}

// NewRunner returns a Runner of st's schedules making jobs with jobs.
func NewRunner(st *Store, jobs Jobs, cfg RunnerConfig) *Runner {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m := metrics.OrDiscard(cfg.Metrics)
	m.InitScheduleRuns()
	return &Runner{st: st, jobs: jobs, interval: cfg.Interval, log: cfg.Logger, m: m}
}

// Run runs passes until ctx ends, each when the next tick comes or after
// Interval, whichever is sooner; it returns nil then.
func (r *Runner) Run(ctx context.Context) error {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		t.Reset(r.Pass(ctx))
	}
}

// wakeJitter spreads the replicas that wake for one tick, so that the
// first has usually run it before the others look.
const wakeJitter = 50 * time.Millisecond

// dueBatch is how many due schedules one call lists; a pass calls again
// while calls come back full, up to maxBatches.
const (
	dueBatch   = 100
	maxBatches = 20
)

// Pass runs every due tick once, one call to Redis when nothing is due,
// and says how long to wait before the next pass: until the next tick (and
// a little), at most Interval. Run calls it; a Runner's Pass must not run
// twice at once (another replica's may).
func (r *Runner) Pass(ctx context.Context) time.Duration {
	wait := r.interval
	for range maxBatches {
		now, after, ds, err := r.st.due(ctx, dueBatch)
		if err != nil {
			r.failed(ctx, err)
			return r.interval
		}
		soonest := after
		for _, d := range ds {
			next, err := r.handle(ctx, now, d)
			if err != nil {
				r.failed(ctx, err)
				return r.interval
			}
			if !next.IsZero() && (soonest.IsZero() || next.Before(soonest)) {
				soonest = next
			}
		}
		if r.failing {
			r.failing = false
			r.log.Info("schedules: redis answers again")
		}
		if !soonest.IsZero() {
			wait = min(wait, soonest.Sub(now)+rand.N(wakeJitter))
		}
		if len(ds) < dueBatch {
			return max(wait, time.Millisecond)
		}
	}
	return time.Millisecond
}

func (r *Runner) failed(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	r.m.RedisErrors.WithLabelValues("schedules").Inc()
	if !r.failing {
		r.failing = true
		r.log.Error("schedules: a pass failed; due ticks stay due and run when Redis answers", "err", err)
	}
}

// maxTicks bounds the ticks one schedule runs in one pass (an @every 1s
// schedule a few seconds late runs each of them).
const maxTicks = 64

// handle runs schedule d's due ticks up to now and returns the tick it
// moved the schedule to (zero when it did not). Any step that finds the
// schedule moved (another replica ran it) ends it; an error leaves the
// tick due.
func (r *Runner) handle(ctx context.Context, now time.Time, d due) (time.Time, error) {
	if d.sch == nil {
		// Its definition went with a delete between the two reads.
		_, err := r.st.advance(ctx, d.member, d.tick, time.Time{}, nil)
		return time.Time{}, err
	}
	sp, err := d.sch.Spec()
	if err != nil {
		r.log.Error("schedules: stored schedule does not parse; left out of the calendar", "schedule", d.sch.Name, "tenant", d.sch.Tenant, "err", err)
		_, err := r.st.advance(ctx, d.member, d.tick, time.Time{}, nil)
		return time.Time{}, err
	}
	tick := d.tick
	for range maxTicks {
		if tick.IsZero() || tick.After(now) {
			return tick, nil
		}
		s := plan(sp, d.sch.CatchUp, tick, now)
		if !s.run {
			ok, err := r.st.advance(ctx, d.member, tick, s.to, nil)
			if err != nil || !ok {
				return time.Time{}, err
			}
			r.m.ScheduleRuns.WithLabelValues("skipped").Add(float64(s.skipped))
			tick = s.to
			continue
		}
		run, err := r.jobs.Enqueue(ctx, d.sch, d.sch.Key(tick))
		if err != nil {
			r.m.ScheduleRuns.WithLabelValues("error").Inc()
			return time.Time{}, err
		}
		st := State{LastRunAt: tick, LastJobID: run.JobID, LastError: run.Refused}
		if run.Refused != "" {
			// Keep the last accepted run's job.
			prev, err := r.st.state(ctx, d.member)
			if err != nil {
				return time.Time{}, err
			}
			st.LastJobID = prev.LastJobID
		}
		next := sp.Next(tick)
		ok, err := r.st.advance(ctx, d.member, tick, next, &st)
		if err != nil || !ok {
			return time.Time{}, err
		}
		result := "enqueued"
		switch {
		case run.Refused != "":
			result = "refused"
			r.log.Warn("schedules: a run's job was refused; the schedule goes on at its next tick",
				"schedule", d.sch.Name, "tenant", d.sch.Tenant, "tick", tick, "reason", run.Refused)
		case !run.Created:
			result = "existing"
		}
		r.m.ScheduleRuns.WithLabelValues(result).Inc()
		tick = next
	}
	return tick, nil
}
