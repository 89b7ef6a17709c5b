package schedule

import (
	"context"
	"log/slog"
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
	// Interval is how often the runner asks for due schedules; default
	// 250ms, so a tick runs within about that of its time.
	Interval time.Duration
	Logger   *slog.Logger
	Metrics  *metrics.Metrics
}

// DefaultInterval is a Runner's default Interval.
const DefaultInterval = 250 * time.Millisecond

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

// Run runs passes every Interval until ctx ends; it returns nil then.
func (r *Runner) Run(ctx context.Context) error {
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		r.Pass(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// dueBatch is how many due schedules one call lists; a pass calls again
// while calls come back full, up to maxBatches.
const (
	dueBatch   = 100
	maxBatches = 20
)

// Pass runs every due tick once: one call to Redis when nothing is due.
// Run calls it every Interval; a replica's Pass and another's may overlap.
func (r *Runner) Pass(ctx context.Context) {
	for range maxBatches {
		now, ds, err := r.st.due(ctx, dueBatch)
		if err != nil {
			r.failed(ctx, err)
			return
		}
		for _, d := range ds {
			if err := r.handle(ctx, now, d); err != nil {
				r.failed(ctx, err)
				return
			}
		}
		if r.failing {
			r.failing = false
			r.log.Info("schedules: redis answers again")
		}
		if len(ds) < dueBatch {
			return
		}
	}
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

// handle runs schedule d's due ticks up to now. Any step that finds the
// schedule moved (another replica ran it) ends it; an error leaves the
// tick due.
func (r *Runner) handle(ctx context.Context, now time.Time, d due) error {
	if d.sch == nil {
		// Its definition went with a delete between the two reads.
		_, err := r.st.advance(ctx, d.member, d.tick, time.Time{}, nil)
		return err
	}
	sp, err := d.sch.Spec()
	if err != nil {
		r.log.Error("schedules: stored schedule does not parse; left out of the calendar", "schedule", d.sch.Name, "tenant", d.sch.Tenant, "err", err)
		_, err := r.st.advance(ctx, d.member, d.tick, time.Time{}, nil)
		return err
	}
	tick := d.tick
	for range maxTicks {
		if tick.IsZero() || tick.After(now) {
			return nil
		}
		s := plan(sp, d.sch.CatchUp, tick, now)
		if !s.run {
			ok, err := r.st.advance(ctx, d.member, tick, s.to, nil)
			if err != nil || !ok {
				return err
			}
			r.m.ScheduleRuns.WithLabelValues("skipped").Add(float64(s.skipped))
			tick = s.to
			continue
		}
		run, err := r.jobs.Enqueue(ctx, d.sch, d.sch.Key(tick))
		if err != nil {
			r.m.ScheduleRuns.WithLabelValues("error").Inc()
			return err
		}
		st := State{LastRunAt: tick, LastJobID: run.JobID, LastError: run.Refused}
		if run.Refused != "" {
			// Keep the last accepted run's job.
			prev, err := r.st.state(ctx, d.member)
			if err != nil {
				return err
			}
			st.LastJobID = prev.LastJobID
		}
		next := sp.Next(tick)
		ok, err := r.st.advance(ctx, d.member, tick, next, &st)
		if err != nil || !ok {
			return err
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
	return nil
}
