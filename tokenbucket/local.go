package tokenbucket

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/gcra"
)

// Local is a token bucket per key in this process's memory, with the same
// arithmetic as Limiter: given the same clock, both answer every sequence
// of requests identically. It serves as shaper.Fallible's FailLocal limiter
// (each process then enforces the limit on its own) and as the model the
// Redis scripts are tested against. Memory stays bounded: a key whose
// bucket is full again is forgotten, since a missing key means exactly that.
type Local struct {
	limit  Limit
	params gcra.Params
	now    func() time.Time
	err    error

	mu      sync.Mutex
	tats    map[string]int64
	sweepAt int
}

var _ shaper.Limiter = (*Local)(nil)

// minSweep is the table size below which Local does not bother sweeping.
const minSweep = 1024

// NewLocal returns an in-process bucket per key enforcing l, reading time
// from now (nil means time.Now). If l is invalid every Allow returns the
// reason.
func NewLocal(l Limit, now func() time.Time) *Local {
	if now == nil {
		now = time.Now
	}
	loc := &Local{limit: l, params: l.params(), now: now, tats: make(map[string]int64), sweepAt: minSweep}
	if err := l.Validate(); err != nil {
		loc.err = fmt.Errorf("token bucket: %w", err)
	}
	return loc
}

// Allow takes n tokens from key's bucket if they are all there now, with
// the same arguments, errors and results as (*Limiter).Allow.
func (l *Local) Allow(ctx context.Context, key string, n int64) (shaper.Result, error) {
	if l.err != nil {
		return shaper.Result{}, l.err
	}
	if err := checkArgs(l.limit, key, n); err != nil {
		return shaper.Result{}, err
	}
	now := l.now().UnixMicro()
	l.mu.Lock()
	defer l.mu.Unlock()
	d := gcra.Allow(l.tats[key], now, l.params, n)
	if d.Allowed {
		l.tats[key] = d.TAT
		if len(l.tats) >= l.sweepAt {
			l.sweep(now)
		}
	}
	return toResult(l.limit, d.Allowed, d.Remaining, d.RetryAfter, d.ResetAfter), nil
}

// sweep forgets full buckets. Sweeping only when the table has doubled
// since the last sweep keeps the cost per Allow constant on average.
func (l *Local) sweep(now int64) {
	for k, tat := range l.tats {
		if tat <= now {
			delete(l.tats, k)
		}
	}
	l.sweepAt = max(minSweep, 2*len(l.tats))
}

// Len is how many keys the limiter currently remembers.
func (l *Local) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.tats)
}
