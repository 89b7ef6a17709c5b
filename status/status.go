// Package status reads what `shaper status` and GET /v1/upstreams show about
// each upstream, from Redis alone: its limits, the rate all replicas
// together drained it at over the last 10 and 60 seconds, its backlog by
// lane, jobs in flight, retrying and dead, whether it is paused, how long
// the backlog will take to drain (at the limit while the pacer holds it
// back, else at the observed rate: see Upstream.TimeToDrainSeconds), and the
// last 15 minutes of drain rate for the status page's chart. It also owns
// pausing and resuming an upstream, for the API and the command line alike.
package status

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/internal/keyspace"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// Limit is one limit as shown: a configured one, or one the upstream
// states (Upstream.StatedLimits).
type Limit struct {
	Rate        int64  `json:"rate"`
	Per         string `json:"per"`
	Cost        string `json:"cost,omitempty"`
	Burst       int64  `json:"burst"`
	Description string `json:"description"`
	// SustainedPerSecond is the rate a full backlog drains at under this
	// limit, after the pacing guard, in units per second.
	SustainedPerSecond float64 `json:"sustained_per_second"`
	// Adaptive means Rate is a ceiling: the fleet looks for the real limit
	// below it.
	Adaptive bool `json:"adaptive"`
	// EffectiveRate is what the fleet paces this limit at now, in units
	// per Per: Rate, an adaptive limit's current rate, or less when the
	// upstream states a lower limit on the same units (its rate taken over
	// this limit's window).
	EffectiveRate float64 `json:"effective_rate"`
	// Source says what sets EffectiveRate: SourceConfigured,
	// SourceAdaptive, SourceStated or SourceOperator.
	Source string `json:"source"`
}

// Where a limit's effective rate comes from (Limit.Source).
const (
	// SourceConfigured is the configured rate.
	SourceConfigured = leaky.SourceConfigured
	// SourceAdaptive is an adaptive limit's current rate.
	SourceAdaptive = leaky.SourceAdaptive
	// SourceStated is a limit the upstream states in its answers
	// (RateLimit-Policy and the like).
	SourceStated = leaky.SourceStated
)

// Backlog is an upstream's unfinished jobs.
type Backlog struct {
	Total int64                       `json:"total"`
	Lanes map[string]queue.LaneCounts `json:"lanes"`
}

// Upstream is one upstream's status. The JSON is the stable output of
// `shaper status --json` and GET /v1/upstreams/{name}.
type Upstream struct {
	Name   string  `json:"name"`
	Limits []Limit `json:"limits"`
	// StatedLimits are the limits the upstream states in its answers, which
	// the fleet obeys on top of Limits; an empty list when it states none.
	StatedLimits []Limit        `json:"stated_limits"`
	Concurrency  int            `json:"concurrency"`
	DrainRate    jobstore.Rates `json:"drain_rate"`
	Backlog      Backlog        `json:"backlog"`
	// InFlight counts jobs taken by workers: concurrency leases when the
	// upstream has a cap, else jobs active in the queue (which includes
	// jobs waiting, at most work.horizon, for their send slot).
	InFlight int64 `json:"in_flight"`
	// Retrying counts jobs waiting to try again after a failed attempt
	// (never a job handed back after a 429, which spent none).
	Retrying int64 `json:"retrying"`
	// Scheduled counts jobs not yet due: delayed by not_before, or held
	// back by a pause, a pushback or their partition's limit, which
	// WaitingFor counts by cause ("pause", "pushback", "limit"; {} when
	// none is held). GET /v1/jobs/{id} shows each such job as scheduled
	// with the same waiting_for.
	Scheduled  int64            `json:"scheduled"`
	WaitingFor map[string]int64 `json:"waiting_for"`
	Dead       int64            `json:"dead"`
	Succeeded  int64            `json:"succeeded"`
	// PausedUntil is set while the upstream is blocked (pushback) or paused,
	// through shaper or through asynq's PauseQueue (which lasts until
	// resumed: PausedUntil is then Indefinitely after it began, and
	// PauseReason is AsynqPauseReason).
	PausedUntil *time.Time `json:"paused_until"`
	PauseReason string     `json:"pause_reason,omitempty"`
	// TimeToDrainSeconds is how long the backlog will take, by the rule
	// of TimeToDrainBasis: at the limit (AtLimitSeconds) while the pacer
	// is what holds the backlog back, else at the observed rate. Null
	// while paused, or when there is a backlog, the pacer is idle and
	// nothing has drained in the last 10 seconds.
	TimeToDrainSeconds *float64 `json:"time_to_drain_seconds"`
	// TimeToDrainBasis says what TimeToDrainSeconds rests on: BasisLimit
	// or BasisObserved; empty when it is null or there is no backlog.
	TimeToDrainBasis string `json:"time_to_drain_basis,omitempty"`
	// AtLimitSeconds is how long the backlog takes at the limits as paced
	// now, the best case: the whole backlog at the tightest request
	// limit's sustained rate (slowed as its effective rate is below its
	// configured one), and each of the Partitions.Top at its partition's
	// own limits, whichever is longest. 0 with no limit on requests.
	AtLimitSeconds float64 `json:"time_to_drain_at_limit_seconds"`
	// Partitions counts the partitions with jobs not yet finished, and
	// Top shows the ones with the most (at most TopPartitions).
	Partitions Partitions `json:"partitions"`
	// Override is set while an operator's limits replace the configured
	// ones (Limits then shows the operator's, source operator).
	Override *Override `json:"override,omitempty"`
	// CallbacksFailed counts the jobs whose callback's retries ran out in
	// the last CallbacksFailedWindow and that were not retried since.
	CallbacksFailed int64 `json:"callbacks_failed"`
	// ProxyWaiting counts the callers waiting now, across every replica,
	// for their proxied call's send slot (a replica that died mid-wait
	// counts its callers no longer than their wait).
	ProxyWaiting int64 `json:"proxy_waiting"`
}

// CallbacksFailedWindow is how far back Upstream.CallbacksFailed looks.
const CallbacksFailedWindow = 24 * time.Hour

// TopPartitions is how many partitions Upstream.Partitions.Top lists.
const TopPartitions = 10

// Partitions are an upstream's partitions with backlog.
type Partitions struct {
	WithBacklog int64              `json:"with_backlog"`
	Top         []PartitionBacklog `json:"top"`
}

// PartitionBacklog is one partition and its jobs not yet finished (waiting,
// scheduled, retrying or in flight).
type PartitionBacklog struct {
	Partition string `json:"partition"`
	Backlog   int64  `json:"backlog"`
}

// Reader reads statuses, and pauses and resumes upstreams (Pause, Resume),
// so that the API and the command line do both the same way. Safe for
// concurrent use.
type Reader struct {
	rdb     redis.UniversalClient
	q       *queue.Queue
	prefix  string
	sources map[string]shaper.Upstream
	buckets map[string]*leaky.Bucket
	names   []string
	pacer   *leaky.Pacer
}

// Option adjusts a Reader.
type Option func(*readerOpts)

type readerOpts struct {
	now func() time.Time
}

// WithClock reads the time from now instead of Redis's clock, as
// leaky.Config.Now does for the pacer: for tests only.
func WithClock(now func() time.Time) Option {
	return func(o *readerOpts) { o.now = now }
}

// NewReader prepares a Reader for the upstreams q holds.
func NewReader(rdb redis.UniversalClient, q *queue.Queue, prefix string, opts ...Option) (*Reader, error) {
	var o readerOpts
	for _, opt := range opts {
		opt(&o)
	}
	prefix = keyspace.Prefix(prefix)
	r := &Reader{rdb: rdb, q: q, prefix: prefix, sources: map[string]shaper.Upstream{}, buckets: map[string]*leaky.Bucket{}}
	pacer := leaky.New(rdb, leaky.Config{Prefix: prefix, Now: o.now})
	r.pacer = pacer
	for _, u := range q.Upstreams() {
		b, err := jobstore.Bucket(pacer, u, 0, 0)
		if err != nil {
			return nil, fmt.Errorf("status of %s: %w", u.Name, err)
		}
		r.sources[u.Name] = u
		r.buckets[u.Name] = b
		r.names = append(r.names, u.Name)
	}
	sort.Strings(r.names)
	return r, nil
}

// Names lists the upstreams, sorted.
func (r *Reader) Names() []string { return r.names }

// Bucket is an upstream's pacing bucket; pause and resume through
// Pause and Resume, which own them.
func (r *Reader) Bucket(name string) (*leaky.Bucket, bool) {
	b, ok := r.buckets[name]
	return b, ok
}

// All reads every upstream, sorted by name.
func (r *Reader) All(ctx context.Context) ([]Upstream, error) {
	out := make([]Upstream, 0, len(r.names))
	for _, n := range r.names {
		u, err := r.Upstream(ctx, n)
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, nil
}

// Upstream reads one upstream's status.
func (r *Reader) Upstream(ctx context.Context, name string) (Upstream, error) {
	src, ok := r.sources[name]
	if !ok {
		return Upstream{}, fmt.Errorf("upstream %q: %w", name, queue.ErrUnknownUpstream)
	}
	b := r.buckets[name]
	override, err := applyOverride(ctx, b, src, time.Now())
	if err != nil {
		return Upstream{}, err
	}
	st, err := b.State(ctx)
	if err != nil {
		return Upstream{}, err
	}
	held, err := r.q.ReadHeld(ctx, name)
	if err != nil {
		return Upstream{}, err
	}
	counts := held.Lanes
	rates, err := jobstore.Read(ctx, r.rdb, r.prefix, name, st.Now)
	if err != nil {
		return Upstream{}, err
	}
	parts, top, err := r.q.Partitions(ctx, name, TopPartitions)
	if err != nil {
		return Upstream{}, err
	}
	// The JSON shows an empty list, never null, when no partition waits.
	shown := make([]PartitionBacklog, 0, len(top))
	for _, p := range top {
		shown = append(shown, PartitionBacklog{Partition: p.Partition, Backlog: p.Backlog})
	}
	u := Upstream{
		Name: name, Concurrency: src.Concurrency, DrainRate: rates, WaitingFor: map[string]int64{},
		Backlog: Backlog{Lanes: counts}, Partitions: Partitions{WithBacklog: parts, Top: shown},
	}
	u.Override = override
	u.Limits, u.StatedLimits = showLimits(b.Config().Limits, b.Config().Guard, st.Limits)
	if u.CallbacksFailed, err = jobstore.For(r.prefix, name).CallbacksFailedSince(ctx, r.rdb, st.Now.Add(-CallbacksFailedWindow)); err != nil {
		return Upstream{}, err
	}
	if u.ProxyWaiting, err = jobstore.For(r.prefix, name).CountWaiting(ctx, r.rdb, st.Now); err != nil {
		return Upstream{}, err
	}
	var active int64
	for _, c := range counts {
		u.Backlog.Total += c.Backlog()
		u.Retrying += c.Retry
		u.Scheduled += c.Scheduled
		for what, n := range c.WaitingFor {
			u.WaitingFor[what] += n
		}
		u.Dead += c.Dead
		u.Succeeded += c.Succeeded
		active += c.Active
	}
	u.InFlight = active
	if src.Concurrency > 0 {
		u.InFlight = st.InFlight
	}
	if !st.BlockedUntil.IsZero() {
		t := st.BlockedUntil.UTC()
		u.PausedUntil, u.PauseReason = &t, st.BlockReason
	}
	if held.AsynqPaused {
		// Until resumed, and no block ends later.
		since := held.PausedSince
		if since.IsZero() {
			since = st.Now
		}
		t := since.Add(Indefinitely).UTC()
		if u.PausedUntil == nil || u.PausedUntil.Before(t) {
			u.PausedUntil, u.PauseReason = &t, AsynqPauseReason
		}
	}
	u.AtLimitSeconds = atLimitSeconds(u.Backlog.Total, sustainedPerSecond(u.Limits), src, b.Config().Guard, shown)
	u.TimeToDrainSeconds, u.TimeToDrainBasis = timeToDrain(drainView{
		Backlog: u.Backlog.Total, Paused: u.PausedUntil != nil, AtLimit: u.AtLimitSeconds,
		Pacing: pacing(b.Config(), st, u.WaitingFor[queue.WaitingLimit]), Rates: rates,
	})
	return u, nil
}

// Bases of Upstream.TimeToDrainSeconds.
const (
	// BasisLimit: the backlog drains at the limits (AtLimitSeconds).
	BasisLimit = "limit"
	// BasisObserved: the backlog drains at the rate observed lately.
	BasisObserved = "observed"
)

// slower is how far below the limits an observed rate must be, over ten
// seconds that all sent something, to be believed over a pacer that has
// sends booked ahead: by more than the 20% the estimate at the limit is
// meant to be right within.
const slower = 0.8

// drainView is what the time to drain is decided from.
type drainView struct {
	Backlog int64
	Paused  bool
	// AtLimit is the backlog's time at the limits; 0 with no limit on
	// requests.
	AtLimit float64
	// Pacing is true when the pacer holds the backlog back now (pacing).
	Pacing bool
	Rates  jobstore.Rates
}

// timeToDrain is the time to drain and its basis. The rule:
//
//   - Paused or blocked: none. Nothing drains, and the rate before says
//     nothing of the rate after.
//   - No backlog: 0.
//   - While the pacer holds the backlog back (see pacing), the backlog
//     drains at the limits: AtLimit. That is right from the first read,
//     where a rate averaged over the last 10 seconds still counts the idle
//     seconds before the drain began and reads low (a drain of 30 jobs at
//     5/s read as 4m30s). The one exception is a drain observed over all of
//     the last 10 seconds more than a fifth below the limits: something
//     the pacer does not see (too few workers, a slow upstream with no
//     concurrency cap) slows it, and the observed rate is the honest one.
//   - Otherwise something else sets the pace (a full concurrency cap: the
//     upstream's latency; a cost limit; workers that do not keep up), and
//     the backlog drains at the rate observed since the drain began within
//     the last 10 seconds (jobstore.Rates.Recent), never faster than the
//     limits; none when nothing has drained in them.
func timeToDrain(v drainView) (*float64, string) {
	backlog := float64(v.Backlog)
	var s float64
	var basis string
	r := v.Rates
	switch {
	case v.Paused:
		return nil, ""
	case v.Backlog == 0:
		return &s, ""
	case v.Pacing && v.AtLimit > 0 && !(r.RecentFull && r.Recent < slower*backlog/v.AtLimit):
		s, basis = v.AtLimit, BasisLimit
	case r.Recent > 0:
		s, basis = max(backlog/r.Recent, v.AtLimit), BasisObserved
	default:
		return nil, ""
	}
	return &s, basis
}

// pacing reports whether the pacer holds the backlog back now: a limit on
// requests has spent its burst and has a send booked ahead, which happens
// only while workers take jobs as fast as it allows, or jobs wait for
// their partition's limit (waitingLimit of them). A full concurrency cap
// rules it out: then the upstream's latency, not the limit, sets the pace.
func pacing(cfg leaky.BucketConfig, st leaky.State, waitingLimit int64) bool {
	if cfg.Concurrency > 0 && st.InFlight >= int64(cfg.Concurrency) {
		return false
	}
	if waitingLimit > 0 {
		return true
	}
	for i, l := range cfg.Limits {
		if l.Cost != "" || i >= len(st.Booked) {
			continue
		}
		// The bucket's level as time: past (capacity-1) intervals, the
		// next send waits for its slot.
		p := l.Params(cfg.Guard)
		if st.Booked[i] > time.Duration((p.Capacity-1)*p.Interval)*time.Microsecond {
			return true
		}
	}
	return false
}

// sustainedPerSecond is the rate a full backlog drains at under the
// tightest limit on requests as paced now: its sustained rate slowed as
// its effective rate is below its configured one. 0 with none.
func sustainedPerSecond(limits []Limit) float64 {
	sustained := 0.0
	for _, l := range limits {
		per := l.SustainedPerSecond * l.EffectiveRate / float64(l.Rate)
		if l.Cost == "" && (sustained == 0 || per < sustained) {
			sustained = per
		}
	}
	return sustained
}

// atLimitSeconds is Upstream.AtLimitSeconds: the backlog at sustained, or
// a busy partition at its own limits if that takes longer. Only the
// partitions shown (the busiest) are looked at, which is cheap and finds
// the longest for partitions under the same limits; one with an override
// of its own may be missed.
func atLimitSeconds(backlog int64, sustained float64, src shaper.Upstream, guard time.Duration, top []PartitionBacklog) float64 {
	if sustained <= 0 {
		return 0
	}
	secs := float64(backlog) / sustained
	for _, p := range top {
		per := 0.0
		for _, l := range src.PartitionLimitsFor(p.Partition) {
			if r := l.SustainedRate(guard) / l.Per.Seconds(); l.Cost == "" && (per == 0 || r < per) {
				per = r
			}
		}
		if per > 0 {
			secs = max(secs, float64(p.Backlog)/per)
		}
	}
	return secs
}

// showLimits shows the configured limits, each at the rate the fleet paces
// it at now, and the limits the upstream states. states is the bucket's
// State.Limits: one per configured limit, then one per stated limit; a
// configured limit it does not cover is shown at its configured rate.
func showLimits(configured []leaky.Limit, guard time.Duration, states []leaky.LimitState) (shown, stated []Limit) {
	stated = []Limit{}
	var statedStates []leaky.LimitState
	for _, s := range states {
		if s.Source == leaky.SourceStated {
			statedStates = append(statedStates, s)
			stated = append(stated, Limit{
				Rate: s.Limit.Rate, Per: s.Limit.Per.String(), Cost: s.Limit.Cost, Burst: s.Limit.Burst,
				Description: s.Limit.String(), SustainedPerSecond: s.Limit.SustainedRate(guard) / s.Limit.Per.Seconds(),
				EffectiveRate: s.Rate, Source: SourceStated,
			})
		}
	}
	for i, l := range configured {
		eff, src := float64(l.Rate), SourceConfigured
		if l.Adaptive {
			src = SourceAdaptive
		}
		if i < len(states) && states[i].Source != leaky.SourceStated {
			eff, src = states[i].Rate, states[i].Source
		}
		for _, s := range statedStates {
			if s.Limit.Unit() != l.Unit() {
				continue
			}
			// A stated quota over another window caps this one at the
			// same long-run rate.
			if r := s.Rate * l.Per.Seconds() / s.Limit.Per.Seconds(); r < eff {
				eff, src = r, SourceStated
			}
		}
		shown = append(shown, Limit{
			Rate: l.Rate, Per: l.Per.String(), Cost: l.Cost, Burst: l.Burst,
			Description: l.String(), SustainedPerSecond: l.SustainedRate(guard) / l.Per.Seconds(),
			Adaptive: l.Adaptive, EffectiveRate: eff, Source: src,
		})
	}
	return shown, stated
}

// History is an upstream's drain rate over the last jobstore.History, one
// Point per jobstore.HistoryStep, oldest first: what the status page's chart
// opens with, before it has polled. The JSON is GET
// /v1/upstreams/{name}/history.
type History struct {
	Name string `json:"name"`
	// StepSeconds is how long each point's step is.
	StepSeconds float64 `json:"step_seconds"`
	// Points each end at At and give the step's sends per second.
	Points []jobstore.Point `json:"points"`
}

// History reads an upstream's drain history, on the same clock as
// Upstream.
func (r *Reader) History(ctx context.Context, name string) (History, error) {
	b, ok := r.buckets[name]
	if !ok {
		return History{}, fmt.Errorf("upstream %q: %w", name, queue.ErrUnknownUpstream)
	}
	st, err := b.State(ctx)
	if err != nil {
		return History{}, err
	}
	pts, err := jobstore.HistoryAt(ctx, r.rdb, r.prefix, name, st.Now)
	if err != nil {
		return History{}, err
	}
	return History{Name: name, StepSeconds: jobstore.HistoryStep.Seconds(), Points: pts}, nil
}
