// Package shaper holds the types that shaper's limiters share: the answer
// every admission limiter gives (Result), the interface callers such as HTTP
// middleware consume (Limiter), and the explicit policy for what happens when
// Redis cannot answer (Fallible).
//
// The limiters themselves live in tokenbucket (admission), window (fixed
// window, sliding log, sliding window counter) and leaky (outbound pacing).
// Each keeps its state in Redis and decides in one Lua script that reads
// Redis's own clock, so any number of processes share one limit.
package shaper

import (
	"context"
	"fmt"
	"time"
)

// Result is one admission decision. Every limiter in shaper returns the same
// shape so that middleware and metrics can treat them alike.
type Result struct {
	// Allowed reports whether the request may proceed. A denied request
	// consumed nothing.
	Allowed bool
	// Limit is the most requests (cost units) the limiter admits at once:
	// a token bucket's capacity or a window's limit.
	Limit int64
	// Remaining is how many more units would be admitted right now, after
	// this decision. Never negative.
	Remaining int64
	// RetryAfter is how long to wait before the same request can be admitted.
	// Zero when Allowed.
	RetryAfter time.Duration
	// ResetAfter is how long until the limiter is back to its full allowance
	// (bucket full, window empty) if nothing else arrives.
	ResetAfter time.Duration
}

// String renders a decision for logs, e.g. "allowed (3/10 left, reset in 700ms)".
func (r Result) String() string {
	if r.Allowed {
		return fmt.Sprintf("allowed (%d/%d left, reset in %v)", r.Remaining, r.Limit, r.ResetAfter)
	}
	return fmt.Sprintf("denied (%d/%d left, retry in %v, reset in %v)", r.Remaining, r.Limit, r.RetryAfter, r.ResetAfter)
}

// Limiter decides whether n units for key may proceed now.
type Limiter interface {
	Allow(ctx context.Context, key string, n int64) (Result, error)
}
