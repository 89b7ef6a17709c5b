package tokenbucket

import (
	"fmt"
	"time"

	"github.com/shaperhq/shaper/internal/gcra"
)

// Limit is a token bucket's shape: it holds at most Capacity tokens, and
// Refill tokens flow back every Per. Capacity is the burst a key that has
// been idle may spend at once; Refill/Per is the rate it may keep up after.
// Limits are values; build them with PerSecond, PerMinute or a literal, and
// check them with Validate.
type Limit struct {
	// Capacity is the most tokens the bucket holds, which is also the
	// largest cost one request may carry. At least 1.
	Capacity int64
	// Refill is how many tokens come back every Per. At least 1, and at
	// most one per microsecond.
	Refill int64
	// Per is the refill period, from a millisecond to a year.
	Per time.Duration
}

// PerSecond is a bucket of capacity tokens refilled at refill per second.
func PerSecond(refill, capacity int64) Limit {
	return Limit{Capacity: capacity, Refill: refill, Per: time.Second}
}

// PerMinute is a bucket of capacity tokens refilled at refill per minute.
func PerMinute(refill, capacity int64) Limit {
	return Limit{Capacity: capacity, Refill: refill, Per: time.Minute}
}

// String renders a limit for logs and errors: "10/s refill, capacity 100".
func (l Limit) String() string {
	per := l.Per.String()
	switch l.Per {
	case time.Second:
		per = "s"
	case time.Minute:
		per = "m"
	case time.Hour:
		per = "h"
	}
	return fmt.Sprintf("%d/%s refill, capacity %d", l.Refill, per, l.Capacity)
}

// Validate explains the first thing wrong with the limit, if anything.
func (l Limit) Validate() error {
	switch {
	case l.Capacity < 1:
		return fmt.Errorf("capacity %d: must be at least 1", l.Capacity)
	case l.Refill < 1:
		return fmt.Errorf("refill %d: must be at least 1", l.Refill)
	case l.Per < time.Millisecond:
		return fmt.Errorf("per %v: must be at least 1ms", l.Per)
	case l.Per > 366*24*time.Hour:
		return fmt.Errorf("per %v: must be at most a year", l.Per)
	case l.Refill > l.Per.Microseconds():
		return fmt.Errorf("refill %d per %v: more than one token per microsecond", l.Refill, l.Per)
	}
	if err := l.params().Validate(); err != nil {
		return fmt.Errorf("limit %v: %w", l, err)
	}
	return nil
}

// Window is how long an empty bucket takes to fill again: the window over
// which Capacity tokens are granted on average, as the RateLimit-Policy
// header's w parameter reports it.
func (l Limit) Window() time.Duration {
	return time.Duration(l.params().Span()) * time.Microsecond
}

// params is the GCRA shape of the bucket. One token drains every interval;
// rounding the interval up means the bucket never refills faster than the
// limit says, at the price of a refill at most 1µs per token slower.
func (l Limit) params() gcra.Params {
	return gcra.Params{Interval: gcra.CeilDiv(l.Per.Microseconds(), max(l.Refill, 1)), Capacity: l.Capacity}
}
