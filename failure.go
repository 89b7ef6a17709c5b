package shaper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// ErrInvalid marks errors caused by the caller's arguments (a cost above a
// bucket's capacity, an empty key). Fallible passes them through untouched:
// they are not Redis failures and no policy should hide them.
var ErrInvalid = errors.New("invalid limiter request")

// OnRedisError is what an admission limiter does when Redis cannot answer.
// Pacing has no such choice: it never sends without a reservation.
type OnRedisError int

const (
	// FailOpen admits the request. It is the default for admission: an
	// outage of the limiter's store should not take the API down with it.
	FailOpen OnRedisError = iota
	// FailClosed denies the request.
	FailClosed
	// FailLocal decides with an in-process limiter instead. Each process then
	// enforces the limit on its own, so N replicas admit up to N times it.
	FailLocal
)

// ParseOnRedisError reads the config spelling of a policy: "allow", "deny" or
// "local" ("fail_open" and "fail_closed" are accepted too).
func ParseOnRedisError(s string) (OnRedisError, error) {
	switch s {
	case "", "allow", "fail_open":
		return FailOpen, nil
	case "deny", "fail_closed":
		return FailClosed, nil
	case "local":
		return FailLocal, nil
	}
	return 0, fmt.Errorf("unknown on_redis_error %q: want allow, deny or local", s)
}

// String is the config spelling: "allow", "deny" or "local".
func (p OnRedisError) String() string {
	switch p {
	case FailOpen:
		return "allow"
	case FailClosed:
		return "deny"
	case FailLocal:
		return "local"
	}
	return fmt.Sprintf("OnRedisError(%d)", int(p))
}

// Fallible wraps a Redis-backed Limiter with an explicit failure policy.
// When the limiter fails for any reason other than the caller's own context
// or invalid arguments, Fallible applies Policy, logs at ERROR (at most once
// per LogEvery, with a count of what it did not log) and calls Observe so the
// failure can be counted. It never returns the Redis error itself.
//
// The zero value is not usable: set Limiter. The zero Policy is FailOpen.
type Fallible struct {
	Limiter Limiter
	Policy  OnRedisError
	// Local decides under FailLocal; required for that policy.
	Local Limiter
	// Name identifies the limiter in logs, e.g. "admission".
	Name string
	// Logger receives the ERROR records; nil means slog.Default().
	Logger *slog.Logger
	// LogEvery bounds how often a failure is logged; zero means one second.
	LogEvery time.Duration
	// Observe, when set, is called once per decision made under the policy.
	Observe func(policy OnRedisError, err error)
	// DeniedRetryAfter is the RetryAfter reported when FailClosed denies;
	// zero means one second.
	DeniedRetryAfter time.Duration

	mu         sync.Mutex
	lastLog    time.Time
	suppressed int
}

// Allow asks the wrapped limiter and applies the policy if it fails.
func (f *Fallible) Allow(ctx context.Context, key string, n int64) (Result, error) {
	res, err := f.Limiter.Allow(ctx, key, n)
	if err == nil || errors.Is(err, ErrInvalid) || ctx.Err() != nil {
		return res, err
	}
	return f.Decide(ctx, key, n, err)
}

// Decide applies the policy to a failure of the limiter's store met
// elsewhere, without asking the limiter again: for a decision Redis was to
// make inside another script call that failed, where that call may have
// spent the token already. It logs and observes as Allow does. A nil err,
// or the caller's own context ended, is returned as is.
func (f *Fallible) Decide(ctx context.Context, key string, n int64, err error) (Result, error) {
	if err == nil || ctx.Err() != nil {
		return Result{}, err
	}
	f.report(err)
	if f.Observe != nil {
		f.Observe(f.Policy, err)
	}
	switch f.Policy {
	case FailClosed:
		retry := f.DeniedRetryAfter
		if retry <= 0 {
			retry = time.Second
		}
		return Result{Allowed: false, RetryAfter: retry, ResetAfter: retry}, nil
	case FailLocal:
		if f.Local == nil {
			return Result{}, fmt.Errorf("%s: policy local without a local limiter: %w", f.name(), err)
		}
		return f.Local.Allow(ctx, key, n)
	default:
		return Result{Allowed: true, Limit: n, Remaining: 0}, nil
	}
}

func (f *Fallible) name() string {
	if f.Name == "" {
		return "limiter"
	}
	return f.Name
}

func (f *Fallible) report(err error) {
	every := f.LogEvery
	if every <= 0 {
		every = time.Second
	}
	f.mu.Lock()
	now := time.Now()
	if now.Sub(f.lastLog) < every {
		f.suppressed++
		f.mu.Unlock()
		return
	}
	suppressed := f.suppressed
	f.suppressed = 0
	f.lastLog = now
	f.mu.Unlock()

	logger := f.Logger
	if logger == nil {
		logger = slog.Default()
	}
	logger.Error("rate limiter cannot reach Redis; deciding by policy",
		"limiter", f.name(), "policy", f.Policy.String(), "err", err, "unlogged_since_last", suppressed)
}
