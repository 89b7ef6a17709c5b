package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// UpstreamStatus is what the server knows of one upstream, across all its
// replicas: the same document `shaper status --json` prints. Fields a newer
// server adds are ignored.
type UpstreamStatus struct {
	Name   string  `json:"name"`
	Limits []Limit `json:"limits"`
	// StatedLimits are limits the upstream states in its answers
	// (RateLimit-Policy and the like), which the fleet obeys on top of
	// Limits; empty when it states none or the server predates them.
	StatedLimits []Limit `json:"stated_limits"`
	// Concurrency is the most calls in flight at once; zero means no cap.
	Concurrency int       `json:"concurrency"`
	DrainRate   DrainRate `json:"drain_rate"`
	Backlog     Backlog   `json:"backlog"`
	InFlight    int64     `json:"in_flight"`
	// Retrying counts jobs waiting after a failed attempt.
	Retrying int64 `json:"retrying"`
	// Scheduled counts jobs not yet due (not_before, or held back), and
	// WaitingFor those held back by cause: "pause", "pushback", "limit".
	Scheduled  int64            `json:"scheduled"`
	WaitingFor map[string]int64 `json:"waiting_for,omitempty"`
	Dead       int64            `json:"dead"`
	Succeeded  int64            `json:"succeeded"`
	// PausedUntil is when a pause or the upstream's own pushback ends; zero
	// when the upstream is not paused.
	PausedUntil time.Time `json:"paused_until,omitzero"`
	PauseReason string    `json:"pause_reason,omitempty"`
	// TimeToDrainSeconds is how long the backlog will take: at the limits
	// while the pacer holds the backlog back, else at the rate observed
	// lately, as TimeToDrainBasis says; nil while paused, or when it
	// cannot be told (a backlog, an idle pacer and no recent drain).
	// TimeToDrain reads it as a duration.
	TimeToDrainSeconds *float64 `json:"time_to_drain_seconds"`
	// TimeToDrainBasis is "limit" or "observed"; empty when
	// TimeToDrainSeconds is nil, there is no backlog, or the server
	// predates it.
	TimeToDrainBasis string `json:"time_to_drain_basis,omitempty"`
	// TimeToDrainAtLimitSeconds is how long the backlog takes at the
	// limits as paced now, the best case.
	TimeToDrainAtLimitSeconds float64 `json:"time_to_drain_at_limit_seconds"`
	// Partitions counts the upstream's partitions with jobs not yet
	// finished and lists the busiest of them; zero from a server that
	// predates partitions.
	Partitions Partitions `json:"partitions"`
	// Override is set while an operator's limits (SetLimits) replace the
	// configured ones.
	Override *LimitsOverride `json:"override,omitempty"`
}

// Partitions are an upstream's partitions with backlog: how many, and the
// ones with the most jobs, most first (the server lists up to 10).
type Partitions struct {
	WithBacklog int64              `json:"with_backlog"`
	Top         []PartitionBacklog `json:"top"`
}

// PartitionBacklog is one partition and its jobs not yet finished.
type PartitionBacklog struct {
	Partition string `json:"partition"`
	Backlog   int64  `json:"backlog"`
}

// TimeToDrain is TimeToDrainSeconds as a duration, and false when the
// server could not tell.
func (u *UpstreamStatus) TimeToDrain() (time.Duration, bool) {
	if u.TimeToDrainSeconds == nil {
		return 0, false
	}
	return time.Duration(*u.TimeToDrainSeconds * float64(time.Second)), true
}

// Paused reports whether the upstream is paused at now.
func (u *UpstreamStatus) Paused(now time.Time) bool {
	return !u.PausedUntil.IsZero() && now.Before(u.PausedUntil)
}

// Limit is one of an upstream's limits: Rate units per Per, counting
// requests or, when Cost is set, the jobs' amounts of that name.
type Limit struct {
	Rate int64
	Per  time.Duration
	// Cost names the amount counted, e.g. "tokens"; empty counts requests.
	Cost  string
	Burst int64
	// Description is the server's rendering, e.g. "100 req/s".
	Description string
	// SustainedPerSecond is the rate a full backlog drains at under this
	// limit, in units per second.
	SustainedPerSecond float64
	// Adaptive means Rate is a ceiling below which the fleet looks for
	// the upstream's real limit.
	Adaptive bool
	// EffectiveRate is what the fleet paces the limit at now, in units per
	// Per: Rate, an adaptive limit's current rate, or less when the
	// upstream states a lower limit. Zero from a server that predates it.
	EffectiveRate float64
	// Source says what sets EffectiveRate: SourceConfigured,
	// SourceAdaptive, SourceStated or SourceOperator.
	Source string
}

// Where a limit's effective rate comes from (Limit.Source).
const (
	SourceConfigured = "configured"
	SourceAdaptive   = "adaptive"
	SourceStated     = "stated"
)

type limitJSON struct {
	Rate               int64           `json:"rate"`
	Per                json.RawMessage `json:"per"`
	Cost               string          `json:"cost,omitempty"`
	Burst              int64           `json:"burst"`
	Description        string          `json:"description,omitempty"`
	SustainedPerSecond float64         `json:"sustained_per_second"`
	Adaptive           bool            `json:"adaptive,omitempty"`
	EffectiveRate      float64         `json:"effective_rate,omitempty"`
	Source             string          `json:"source,omitempty"`
}

// UnmarshalJSON reads per as a Go duration ("1m0s") or, to tolerate other
// encodings, as a number of seconds.
func (l *Limit) UnmarshalJSON(data []byte) error {
	var w limitJSON
	if err := json.Unmarshal(data, &w); err != nil {
		return err
	}
	per, err := parsePer(w.Per)
	if err != nil {
		return err
	}
	*l = Limit{Rate: w.Rate, Per: per, Cost: w.Cost, Burst: w.Burst, Description: w.Description, SustainedPerSecond: w.SustainedPerSecond,
		Adaptive: w.Adaptive, EffectiveRate: w.EffectiveRate, Source: w.Source}
	return nil
}

// MarshalJSON writes per as a Go duration, as the server does.
func (l Limit) MarshalJSON() ([]byte, error) {
	per, _ := json.Marshal(l.Per.String()) // a string always encodes
	return json.Marshal(limitJSON{Rate: l.Rate, Per: per, Cost: l.Cost, Burst: l.Burst, Description: l.Description, SustainedPerSecond: l.SustainedPerSecond,
		Adaptive: l.Adaptive, EffectiveRate: l.EffectiveRate, Source: l.Source})
}

func parsePer(raw json.RawMessage) (time.Duration, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if d, err := time.ParseDuration(s); err == nil {
			return d, nil
		}
		if secs, err := strconv.ParseFloat(s, 64); err == nil {
			return time.Duration(secs * float64(time.Second)), nil
		}
		return 0, fmt.Errorf("limit per %q: not a duration", s)
	}
	var secs float64
	if err := json.Unmarshal(raw, &secs); err != nil {
		return 0, fmt.Errorf("limit per %s: not a duration", raw)
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// String is the server's description, or "rate/per" when it gave none.
func (l Limit) String() string {
	if l.Description != "" {
		return l.Description
	}
	s := fmt.Sprintf("%d/%v", l.Rate, l.Per)
	if l.Cost != "" {
		s += " " + l.Cost
	}
	return s
}

// DrainRate is how many jobs per second all workers together dispatched
// to the upstream, averaged over the last 10 and 60 seconds.
type DrainRate struct {
	Last10s float64 `json:"last_10s"`
	Last60s float64 `json:"last_60s"`
}

// Backlog is an upstream's unfinished jobs, in total and by lane.
type Backlog struct {
	Total int64                 `json:"total"`
	Lanes map[string]LaneCounts `json:"lanes"`
}

// LaneCounts are one lane's jobs by state, as Job.State reads each.
type LaneCounts struct {
	Pending int64 `json:"pending"`
	// Scheduled counts jobs delayed by not_before or held back; WaitingFor
	// counts the held ones by cause ("pause", "pushback", "limit").
	Scheduled  int64            `json:"scheduled"`
	WaitingFor map[string]int64 `json:"waiting_for,omitempty"`
	// Retry counts jobs waiting after a failed attempt.
	Retry     int64 `json:"retry"`
	Active    int64 `json:"active"`
	Dead      int64 `json:"dead"`
	Succeeded int64 `json:"succeeded"`
}

// Upstreams reads the status of every upstream the server knows.
func (c *Client) Upstreams(ctx context.Context) ([]UpstreamStatus, error) {
	var out struct {
		Upstreams []UpstreamStatus `json:"upstreams"`
	}
	if _, err := c.do(ctx, http.MethodGet, "/v1/upstreams", nil, &out); err != nil {
		return nil, fmt.Errorf("list upstreams: %w", err)
	}
	return out.Upstreams, nil
}

// Upstream reads one upstream's status; an unknown name is ErrNotFound.
func (c *Client) Upstream(ctx context.Context, name string) (*UpstreamStatus, error) {
	if name == "" {
		return nil, errors.New("upstream: empty name")
	}
	var st UpstreamStatus
	if _, err := c.do(ctx, http.MethodGet, "/v1/upstreams/"+pathSegment(name), nil, &st); err != nil {
		return nil, fmt.Errorf("upstream %s: %w", name, err)
	}
	return &st, nil
}

// Pause stops every worker replica from dispatching to the upstream for d,
// or until Resume when d is 0, and returns its status. Jobs keep queueing
// meanwhile. It needs an admin key (ErrUnauthorized otherwise).
func (c *Client) Pause(ctx context.Context, name string, d time.Duration) (*UpstreamStatus, error) {
	if name == "" {
		return nil, errors.New("pause: empty upstream name")
	}
	if d < 0 {
		return nil, fmt.Errorf("pause %s for %v: negative duration", name, d)
	}
	in := struct {
		For string `json:"for,omitempty"`
	}{}
	if d > 0 {
		in.For = d.String()
	}
	var st UpstreamStatus
	if _, err := c.do(ctx, http.MethodPost, "/v1/upstreams/"+pathSegment(name)+"/pause", in, &st); err != nil {
		return nil, fmt.Errorf("pause %s: %w", name, err)
	}
	return &st, nil
}

// Resume ends a pause of the upstream and returns its status. It needs an
// admin key (ErrUnauthorized otherwise).
func (c *Client) Resume(ctx context.Context, name string) (*UpstreamStatus, error) {
	if name == "" {
		return nil, errors.New("resume: empty upstream name")
	}
	var st UpstreamStatus
	// An empty object rather than no body, so a server that wants JSON on
	// every POST takes it.
	if _, err := c.do(ctx, http.MethodPost, "/v1/upstreams/"+pathSegment(name)+"/resume", struct{}{}, &st); err != nil {
		return nil, fmt.Errorf("resume %s: %w", name, err)
	}
	return &st, nil
}
