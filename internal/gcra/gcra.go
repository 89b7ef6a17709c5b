// Package gcra is the arithmetic shaper's token bucket and leaky bucket share:
// the generic cell rate algorithm, which keeps one number per key, the
// theoretical arrival time (TAT), instead of a token count and a timestamp.
//
// A bucket drains one unit every Interval microseconds and holds at most
// Capacity units. The TAT is the time at which the bucket would be empty;
// its level at time t is max(0, TAT-t)/Interval. Adding cost units is allowed
// at the earliest time the level is at most Capacity-cost, and moves the TAT
// forward by cost*Interval.
//
// All quantities are integer microseconds and integer units. The Lua in
// LuaFunctions performs exactly the same operations, so the pure-Go functions
// here are the model the scripts are tested against; the admission limiter
// also uses them as its in-process fallback.
package gcra

import (
	"errors"
	"fmt"
)

// MaxSpan bounds Capacity*Interval (and the TAT's lead over now) so every
// product stays an exact integer in a Lua double (2^53): about 31 years.
const MaxSpan = int64(1) << 50

// Params are one bucket's shape.
type Params struct {
	// Interval is how long one unit takes to drain, in microseconds (>= 1).
	Interval int64
	// Capacity is how many units the bucket holds (>= 1).
	Capacity int64
}

// Validate reports parameters the arithmetic cannot honour exactly.
func (p Params) Validate() error {
	switch {
	case p.Interval < 1:
		return fmt.Errorf("interval %dµs: must be at least 1µs", p.Interval)
	case p.Capacity < 1:
		return fmt.Errorf("capacity %d: must be at least 1", p.Capacity)
	case p.Capacity > MaxSpan/p.Interval:
		return errors.New("capacity × interval is too large (over 30 years)")
	}
	return nil
}

// Span is how long a full bucket takes to drain: Capacity*Interval.
func (p Params) Span() int64 { return p.Capacity * p.Interval }

// Earliest is the first time at or after now when cost units fit in a
// bucket whose TAT is tat. cost must be between 1 and Capacity.
func Earliest(tat, now int64, p Params, cost int64) int64 {
	if tat < now {
		tat = now
	}
	at := tat - (p.Capacity-cost)*p.Interval
	if at < now {
		return now
	}
	return at
}

// Take is the TAT after cost units are added at time at (at >= Earliest).
func Take(tat, at int64, p Params, cost int64) int64 {
	if tat < at {
		tat = at
	}
	return tat + cost*p.Interval
}

// Remaining is how many more units fit at time now.
func Remaining(tat, now int64, p Params) int64 {
	level := tat - now
	if level < 0 {
		level = 0
	}
	free := p.Span() - level
	if free <= 0 {
		return 0
	}
	return free / p.Interval
}

// Decision is an allow-or-deny answer at one instant.
type Decision struct {
	Allowed bool
	// TAT is the key's new TAT when allowed, the unchanged one otherwise.
	TAT int64
	// RetryAfter is how long until the same cost would be allowed; 0 when allowed.
	RetryAfter int64
	// ResetAfter is how long until the bucket is empty again.
	ResetAfter int64
	// Remaining counts the units that would still fit after this decision.
	Remaining int64
}

// Allow decides whether cost units may pass at exactly now, without waiting.
// A denial leaves the TAT as it was: nothing is consumed.
func Allow(tat, now int64, p Params, cost int64) Decision {
	if tat < now {
		tat = now
	}
	at := Earliest(tat, now, p, cost)
	if at > now {
		return Decision{TAT: tat, RetryAfter: at - now, ResetAfter: tat - now, Remaining: Remaining(tat, now, p)}
	}
	next := Take(tat, now, p, cost)
	return Decision{Allowed: true, TAT: next, ResetAfter: next - now, Remaining: Remaining(next, now, p)}
}

// CeilDiv is ⌈a/b⌉ for a >= 0, b > 0.
func CeilDiv(a, b int64) int64 {
	return (a + b - 1) / b
}
