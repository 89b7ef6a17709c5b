// Package window limits how many requests (or cost units) a key may spend in
// a window of time, with the three classic window algorithms, each decided
// in one Lua script on Redis's clock so any number of processes share one
// limit. Pick FixedWindow when cost matters most: one small hash per key,
// but a client that spends its allowance at the end of one window and again
// at the start of the next gets twice the limit through in a moment.
// SlidingLog is exact (no window of length Per ever admits more than Rate)
// but keeps one sorted-set entry per admitted unit, so its memory grows with
// the limit. SlidingWindow, the counter that weighs the previous window by
// how much of it still overlaps, is the usual default for general APIs: as
// cheap as the fixed window and close to exact. All three return
// shaper.Result and satisfy shaper.Limiter.
package window

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/keyspace"
	"github.com/shaperhq/shaper/internal/script"
)

// Bounds on limits and keys. maxRate keeps every count, and every sum of
// counts a script forms, an exact integer in a Lua double; maxPer keeps a
// window in µs well below the 2^52 that window_muldiv needs. maxLogRate
// caps a sliding log's sorted set, one member (about 100 bytes in Redis)
// per admitted unit, at about 10 MB per key. maxKeyLen bounds what a
// caller-supplied key (an API key, an IP) can make Redis store.
const (
	maxRate    = int64(1) << 40
	maxPer     = 366 * 24 * time.Hour
	maxLogRate = 100_000
	maxKeyLen  = 512
)

// Limit allows at most Rate units per window of length Per. A unit is one
// request unless callers pass a larger cost to Allow. Limits are values;
// build them with PerSecond, PerMinute or a literal, and check them with
// Validate (the constructors do).
type Limit struct {
	// Rate is how many units one window admits; at least 1.
	Rate int64
	// Per is the window's length: at least a millisecond, at most 366
	// days, in whole microseconds (the scripts count time in µs).
	Per time.Duration
}

// PerSecond is a limit of n units per second.
func PerSecond(n int64) Limit { return Limit{Rate: n, Per: time.Second} }

// PerMinute is a limit of n units per minute.
func PerMinute(n int64) Limit { return Limit{Rate: n, Per: time.Minute} }

// String renders the limit as "10 per 1s".
func (l Limit) String() string { return fmt.Sprintf("%d per %v", l.Rate, l.Per) }

// Validate explains the first thing wrong with the limit, if anything.
func (l Limit) Validate() error {
	switch {
	case l.Rate < 1:
		return fmt.Errorf("rate %d: must be at least 1", l.Rate)
	case l.Rate > maxRate:
		return fmt.Errorf("rate %d: must be at most %d", l.Rate, maxRate)
	case l.Per < time.Millisecond:
		return fmt.Errorf("per %v: must be at least 1ms", l.Per)
	case l.Per > maxPer:
		return fmt.Errorf("per %v: must be at most 366 days", l.Per)
	case l.Per%time.Microsecond != 0:
		return fmt.Errorf("per %v: must be a whole number of microseconds", l.Per)
	}
	return nil
}

// per is the window in the scripts' unit, microseconds.
func (l Limit) per() int64 { return l.Per.Microseconds() }

// ttlMillis is the expiry, in whole milliseconds, for a key whose state
// matters for span µs after its last write: span plus a tenth, rounded up.
// The tenth covers the rounding to milliseconds and a failover to a replica
// whose clock runs a little ahead; expiry is only a bound on memory, the
// scripts never rely on it for correctness. Never zero, since span >= 1ms.
func ttlMillis(span int64) int64 {
	return (span*11 + 9_999) / 10_000
}

// Config is what the three limiters share. The zero value is ready to use.
type Config struct {
	// Prefix starts every key the limiter writes; default
	// keyspace.DefaultPrefix. Two
	// limiters with different limits need different prefixes (or keys),
	// or they share state.
	Prefix string
	// Now, when set, replaces Redis's clock with the caller's. Only for
	// tests and for hosts that forbid TIME in scripts: replicas with
	// skewed clocks then disagree on the window.
	Now func() time.Time
}

// limiter is what FixedWindow, SlidingLog and SlidingWindow have in common;
// they differ only in script, key and the state's lifetime.
type limiter struct {
	rdb    redis.Scripter
	limit  Limit
	prefix string
	now    func() time.Time

	name   string        // for errors: "fixed window"
	script *redis.Script // decides one request
	kind   string        // key infix: "fw"
	span   int64         // µs the state matters after a write
}

func newLimiter(rdb redis.Scripter, l Limit, cfg Config, name, kind string, s *redis.Script, spanWindows int64) (limiter, error) {
	if rdb == nil {
		return limiter{}, fmt.Errorf("%s: nil redis client", name)
	}
	if err := l.Validate(); err != nil {
		return limiter{}, fmt.Errorf("%s: limit: %w", name, err)
	}
	prefix := keyspace.Prefix(cfg.Prefix)
	if strings.ContainsAny(prefix, "{}") {
		// A brace in the prefix would become the hash tag instead of the key.
		return limiter{}, fmt.Errorf("%s: prefix %q: must not contain braces", name, prefix)
	}
	return limiter{
		rdb: rdb, limit: l, prefix: prefix, now: cfg.Now,
		name: name, script: s, kind: kind, span: spanWindows * l.per(),
	}, nil
}

// redisKey is the one key a limiter keeps for key. The braces make key the
// hash tag, so on Redis Cluster a script's keys always share a slot.
func (x *limiter) redisKey(key string) string {
	return x.prefix + ":" + x.kind + ":{" + key + "}"
}

// check refuses arguments no script should see.
func (x *limiter) check(key string, n int64) error {
	switch {
	case key == "":
		return fmt.Errorf("%s: empty key: %w", x.name, shaper.ErrInvalid)
	case len(key) > maxKeyLen:
		return fmt.Errorf("%s: key of %d bytes: at most %d: %w", x.name, len(key), maxKeyLen, shaper.ErrInvalid)
	case strings.ContainsAny(key, "{}"):
		return fmt.Errorf("%s: key %q: must not contain braces: %w", x.name, key, shaper.ErrInvalid)
	case n < 1:
		return fmt.Errorf("%s: cost %d: must be at least 1: %w", x.name, n, shaper.ErrInvalid)
	case n > x.limit.Rate:
		return fmt.Errorf("%s: cost %d: exceeds the limit's rate %d: %w", x.name, n, x.limit.Rate, shaper.ErrInvalid)
	}
	return nil
}

func (x *limiter) allow(ctx context.Context, key string, n int64) (shaper.Result, error) {
	if err := x.check(key, n); err != nil {
		return shaper.Result{}, err
	}
	v, err := script.Run(ctx, x.rdb, x.name, x.script, []string{x.redisKey(key)},
		script.NowArg(x.now), x.limit.per(), x.limit.Rate, n, ttlMillis(x.span))
	if err != nil {
		return shaper.Result{}, err
	}
	out, err := script.Ints(v, 4)
	if err != nil {
		return shaper.Result{}, fmt.Errorf("%s: %w", x.name, err)
	}
	return shaper.Result{
		Allowed:    out[0] == 1,
		Limit:      x.limit.Rate,
		Remaining:  out[1],
		RetryAfter: time.Duration(out[2]) * time.Microsecond,
		ResetAfter: time.Duration(out[3]) * time.Microsecond,
	}, nil
}

func (x *limiter) reset(ctx context.Context, key string) error {
	if err := x.check(key, 1); err != nil {
		return err
	}
	_, err := script.Run(ctx, x.rdb, x.name+" reset", resetScript, []string{x.redisKey(key)})
	return err
}

// FixedWindow counts units per clock-aligned window: windows start at every
// multiple of Per since the Unix epoch, so a 1-minute window turns over at
// each whole minute. Its state is one small hash per key. Across a window
// boundary it admits up to twice Rate in a moment. Safe for concurrent use.
type FixedWindow struct{ x limiter }

// NewFixedWindow returns a fixed-window limiter on rdb (a Client,
// ClusterClient or Ring). The caller owns rdb and closes it.
func NewFixedWindow(rdb redis.Scripter, l Limit, cfg Config) (*FixedWindow, error) {
	x, err := newLimiter(rdb, l, cfg, "fixed window", "fw", fixedWindowScript, 1)
	if err != nil {
		return nil, err
	}
	return &FixedWindow{x}, nil
}

// Allow decides whether n units for key fit in the current window, and
// spends them if so. n must be between 1 and the limit's Rate; key must be
// 1 to 512 bytes without braces (it becomes the Redis hash tag). Errors
// caused by those arguments wrap shaper.ErrInvalid.
func (f *FixedWindow) Allow(ctx context.Context, key string, n int64) (shaper.Result, error) {
	return f.x.allow(ctx, key, n)
}

// Reset forgets everything key has spent, e.g. to unblock a customer.
func (f *FixedWindow) Reset(ctx context.Context, key string) error { return f.x.reset(ctx, key) }

// Limit is the limit the limiter enforces.
func (f *FixedWindow) Limit() Limit { return f.x.limit }

// SlidingLog remembers the time of every admitted unit for Per and admits n
// more only if the window (now−Per, now] then holds at most Rate. It is
// exact: no window of length Per, wherever it starts, ever holds more than
// Rate admitted units (while Redis's clock does not step back). Its state
// is a sorted set with one member, about 100 bytes, per unit, so Rate is
// capped at 100,000 and large costs are slow. Safe for concurrent use.
type SlidingLog struct{ x limiter }

// NewSlidingLog returns a sliding-log limiter on rdb (a Client,
// ClusterClient or Ring). The caller owns rdb and closes it.
func NewSlidingLog(rdb redis.Scripter, l Limit, cfg Config) (*SlidingLog, error) {
	x, err := newLimiter(rdb, l, cfg, "sliding log", "sl", slidingLogScript, 1)
	if err != nil {
		return nil, err
	}
	if l.Rate > maxLogRate {
		return nil, fmt.Errorf("sliding log: limit: rate %d: at most %d, as the log keeps one entry per unit; use SlidingWindow for larger limits", l.Rate, maxLogRate)
	}
	return &SlidingLog{x}, nil
}

// Allow decides whether n units for key fit in the window that ends now,
// and records them if so. Arguments are as for FixedWindow.Allow.
func (s *SlidingLog) Allow(ctx context.Context, key string, n int64) (shaper.Result, error) {
	return s.x.allow(ctx, key, n)
}

// Reset forgets everything key has spent.
func (s *SlidingLog) Reset(ctx context.Context, key string) error { return s.x.reset(ctx, key) }

// Limit is the limit the limiter enforces.
func (s *SlidingLog) Limit() Limit { return s.x.limit }

// SlidingWindow is the sliding window counter. It counts units in
// clock-aligned windows like FixedWindow, and estimates the units in the
// sliding window that ends now as the current window's count plus the
// previous window's count weighted by the share of it the sliding window
// still covers, assuming the previous window's units were spread evenly:
//
//	estimate = current + ⌈previous × (Per − elapsed) / Per⌉
//
// where elapsed is how far now is into the current window, in µs. The
// weighted part is rounded up, so the estimate never undercounts the even
// spread, and is computed exactly in integers (as is the RetryAfter it
// implies). n units are admitted when estimate + n ≤ Rate. The even spread
// is an assumption: if the previous window's units all came at its very
// end, a sliding window can hold up to nearly twice Rate by the end of the
// current one. Use SlidingLog where that matters. The state is one small
// hash per key, kept for two windows. Safe for concurrent use.
type SlidingWindow struct{ x limiter }

// NewSlidingWindow returns a sliding-window-counter limiter on rdb (a
// Client, ClusterClient or Ring). The caller owns rdb and closes it.
func NewSlidingWindow(rdb redis.Scripter, l Limit, cfg Config) (*SlidingWindow, error) {
	x, err := newLimiter(rdb, l, cfg, "sliding window", "sw", slidingWindowScript, 2)
	if err != nil {
		return nil, err
	}
	return &SlidingWindow{x}, nil
}

// Allow decides whether n units for key fit in the estimated sliding window,
// and counts them if so. Arguments are as for FixedWindow.Allow.
func (s *SlidingWindow) Allow(ctx context.Context, key string, n int64) (shaper.Result, error) {
	return s.x.allow(ctx, key, n)
}

// Reset forgets everything key has spent.
func (s *SlidingWindow) Reset(ctx context.Context, key string) error { return s.x.reset(ctx, key) }

// Limit is the limit the limiter enforces.
func (s *SlidingWindow) Limit() Limit { return s.x.limit }
