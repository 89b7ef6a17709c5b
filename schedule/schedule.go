// Package schedule runs jobs on a cron, exactly once per tick, with no
// leader, however many `shaper serve` and `shaper work` replicas run.
// Schedules live in Redis (Store); every replica runs a Runner, which asks
// Redis once per interval for the schedules that are due (a calendar: one
// sorted set of schedules by next tick, so an idle fleet's cost does not
// grow with their number) and runs each due tick T in two steps: enqueue
// the job with the idempotency key schedule:NAME:UNIXTIME (T's), then
// advance the schedule from T to its next tick by a compare-and-set that
// holds only while it is still at T. Two replicas running one tick enqueue
// one job (the second enqueue returns the first job); a replica that dies
// between the steps leaves the tick due, and whoever runs it next gets the
// same job back. Ticks and "now" come from Redis's clock.
//
// The jobs themselves are made by the caller (Jobs): the API server checks
// a schedule's job exactly as it checks POST /v1/jobs.
package schedule

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"time"
)

// CatchUp says what a schedule does about ticks no replica ran in time
// (while the whole fleet was down): run the most recent of them once
// (CatchUpLast, the default) or none (CatchUpNone).
type CatchUp string

const (
	CatchUpLast CatchUp = "last"
	CatchUpNone CatchUp = "none"
)

// Source says who declared a schedule.
type Source string

const (
	// SourceAPI schedules are made and removed through the API.
	SourceAPI Source = "api"
	// SourceConfig schedules are declared in the config's schedules: and
	// owned by it: replicas write them at start, and the API may read but
	// not change, pause or remove them.
	SourceConfig Source = "config"
)

// Grace is how late a tick may run and still count as run on time. A tick
// older than Grace when a replica first sees it was missed: the whole fleet
// was down or stalled past it, and catch_up decides.
const Grace = 10 * time.Second

// Errors callers branch on.
var (
	ErrNotFound = errors.New("no such schedule")
	ErrExists   = errors.New("a schedule by that name exists")
	// ErrConfigOwned refuses an API change to a schedule declared in the
	// config.
	ErrConfigOwned = errors.New("schedule is declared in the config")
	// ErrTooMany refuses a schedule beyond a tenant's MaxPerTenant.
	ErrTooMany = errors.New("too many schedules")
)

// MaxPerTenant bounds one tenant's schedules.
const MaxPerTenant = 100000

// namePattern is what a schedule name may be: it is part of idempotency
// keys and URL paths.
var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$`)

// CheckName reports what is wrong with a schedule name, nil when nothing.
func CheckName(name string) error {
	if name == "" {
		return errors.New("is required")
	}
	if !namePattern.MatchString(name) {
		return fmt.Errorf("%q: must be 1-100 letters, digits and ._- starting with a letter or digit", name)
	}
	return nil
}

// Schedule is one schedule's definition.
type Schedule struct {
	Name     string `json:"name"`
	Tenant   string `json:"tenant"`
	Cron     string `json:"cron"`
	Timezone string `json:"timezone"`
	// Job is the job request, as POST /v1/jobs takes it; it is checked
	// when the schedule is made and again at each run (the config may
	// have changed in between).
	Job     json.RawMessage `json:"job"`
	CatchUp CatchUp         `json:"catch_up"`
	Paused  bool            `json:"paused"`
	Source  Source          `json:"source"`
	// CreatedAt is when it was made or last replaced.
	CreatedAt time.Time `json:"created_at"`
}

// Spec parses the schedule's cron expression in its time zone.
func (s *Schedule) Spec() (Spec, error) {
	loc, err := LoadZone(s.Timezone)
	if err != nil {
		return Spec{}, fmt.Errorf("timezone: %w", err)
	}
	sp, err := ParseCron(s.Cron, loc)
	if err != nil {
		return Spec{}, fmt.Errorf("cron: %w", err)
	}
	return sp, nil
}

// Key is the idempotency key of the schedule's run at tick.
func (s *Schedule) Key(tick time.Time) string {
	return "schedule:" + s.Name + ":" + strconv.FormatInt(tick.Unix(), 10)
}

// State is what became of a schedule's last run.
type State struct {
	// LastRunAt is the tick of the last run (as its idempotency key says
	// it), whether its job was accepted or refused.
	LastRunAt time.Time `json:"last_run_at,omitzero"`
	// LastJobID is the job of the last accepted run.
	LastJobID string `json:"last_job_id,omitempty"`
	// LastError says why the last run's job was refused (a full backlog,
	// an upstream no longer configured); empty when it was accepted. The
	// schedule keeps its place either way: the next tick runs as planned.
	LastError string `json:"last_error,omitempty"`
}

// View is a schedule as the API shows it.
type View struct {
	Schedule
	State
	// NextRunAt is its next tick; zero when paused or when the expression
	// has no tick within five years.
	NextRunAt time.Time `json:"next_run_at,omitzero"`
}

// step is what a replica does with a due tick: run it, or move the
// schedule to another tick without running (skipping missed ticks), and how
// many ticks that skips.
type step struct {
	run     bool
	to      time.Time // when !run: the tick to move to (zero: none ahead)
	skipped int
}

// plan decides a due tick (tick ≤ now) by catch_up:
//   - last: run tick unless its successor is missed too (older than now −
//     Grace); else move to the most recent missed tick, which then runs.
//   - none: run tick unless it is itself missed; else move to the first
//     tick that is not.
func plan(sp Spec, c CatchUp, tick, now time.Time) step {
	edge := now.Add(-Grace)
	if c == CatchUpNone {
		if !tick.Before(edge) {
			return step{run: true}
		}
		to, n := advanceWhile(sp, tick, func(t time.Time) bool { return t.Before(edge) })
		return step{to: to, skipped: n}
	}
	next := sp.Next(tick)
	if next.IsZero() || !next.Before(edge) {
		return step{run: true}
	}
	// Move to the last tick whose successor is not missed.
	to, n := advanceWhile(sp, tick, func(t time.Time) bool {
		nx := sp.Next(t)
		return !nx.IsZero() && nx.Before(edge)
	})
	return step{to: to, skipped: n}
}

// maxSteps bounds a walk over missed ticks (an expression ticking every
// second, missed for eleven days); past it the walk stops where it got to
// and the next pass goes on.
const maxSteps = 1 << 20

// advanceWhile moves from tick to following ticks while more(t), and says
// how many it moved. @every schedules jump there in one step.
func advanceWhile(sp Spec, tick time.Time, more func(time.Time) bool) (time.Time, int) {
	t, n := tick, 0
	if d := sp.every(); d > 0 {
		// Ticks are tick + k·d and more is true up to some tick, then
		// false: gallop to the last tick where it holds, then walk one.
		for k := int64(1) << 32; k > 0; k >>= 1 {
			if k > math.MaxInt64/int64(d)/2 {
				continue
			}
			if c := t.Add(time.Duration(k) * d); more(c) {
				t, n = c, n+int(k)
			}
		}
	}
	for n < maxSteps && more(t) {
		nx := sp.Next(t)
		if nx.IsZero() {
			return nx, n
		}
		t, n = nx, n+1
	}
	return t, n
}
