package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/queue"
)

// errStoreHeld is what admission's limiter reports for a request the
// breaker holds back: a Redis failure in all but name, so admission's
// failure policy decides as it would for one, and counts it.
var errStoreHeld = errors.New("store unreachable moments ago; not asked again yet")

// breaker remembers that Redis failed recently. While Redis is unreachable
// every command of an enqueue would otherwise wait out its own dial and
// retries, so producers heard nothing for seconds; with the breaker open a
// request is answered at once, and one request now and then (every
// probeEvery) is let through to find out whether Redis is back. The first
// success closes it. It opens on openAfter failures in a row, not on one:
// a single slow answer from a busy but healthy Redis must not turn every
// tenant away; a Redis that is really gone fails every call, each within
// the store budget, so two of them still answer well inside the bound.
type breaker struct {
	probeEvery time.Duration
	log        *slog.Logger

	mu       sync.Mutex
	open     bool
	failures int // in a row, while closed
	lastTry  time.Time
}

// openAfter is how many store failures in a row open the breaker.
const openAfter = 2

// allow reports whether a request may use Redis: always while closed,
// once per probeEvery while open.
func (b *breaker) allow() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.open {
		return true
	}
	now := time.Now()
	if now.Sub(b.lastTry) < b.probeEvery {
		return false
	}
	b.lastTry = now
	return true
}

// failed records a Redis failure, opening the breaker on the openAfter-th
// in a row.
func (b *breaker) failed(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures++
	if !b.open && b.failures < openAfter {
		return
	}
	if !b.open {
		b.log.Error("redis unreachable; enqueues are answered 503 store-unavailable until a probe gets through",
			"probe_every", b.probeEvery, "err", err)
	}
	b.open, b.lastTry = true, time.Now()
}

// succeeded records that Redis answered and closes the breaker.
func (b *breaker) succeeded() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open {
		b.log.Info("redis reachable again; enqueues resume")
	}
	b.open, b.failures = false, 0
}

// record feeds the outcome of a store call to the breaker. Errors the
// caller caused (its own cancelled context, an invalid argument) and the
// queue's answers about jobs (not found, unknown upstream or lane) say
// nothing about Redis.
func (b *breaker) record(ctx context.Context, err error) {
	switch {
	case err == nil:
		b.succeeded()
	case ctx.Err() != nil, errors.Is(err, shaper.ErrInvalid), errors.Is(err, queue.ErrNotFound),
		errors.Is(err, queue.ErrUnknownUpstream), errors.Is(err, queue.ErrUnknownLane), errors.Is(err, queue.ErrBacklogFull):
	default:
		b.failed(err)
	}
}

// gatedLimiter is admission's Redis limiter behind the breaker and a time
// budget. While the breaker holds a request back it fails at once, without
// asking Redis; the shaper.Fallible around it then applies on_redis_error.
type gatedLimiter struct {
	limiter shaper.Limiter
	store   *breaker
	budget  time.Duration
}

func (g *gatedLimiter) Allow(ctx context.Context, key string, n int64) (shaper.Result, error) {
	if !g.store.allow() {
		return shaper.Result{}, errStoreHeld
	}
	tctx, cancel := context.WithDeadline(ctx, storeDeadline(ctx, g.budget))
	defer cancel()
	res, err := g.limiter.Allow(tctx, key, n)
	g.store.record(ctx, err)
	return res, err
}

// budgetKey carries when a request's store budget runs out.
type budgetKey struct{}

// withStoreBudget starts r's store budget: every Redis call the request
// makes from now on shares it, so admission and the enqueue together, not
// each of them, are bounded by StoreTimeout. The request's own context is
// left as it is, so that a producer who leaves is still told apart from
// Redis running out the budget.
func (s *Server) withStoreBudget(r *http.Request) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), budgetKey{}, time.Now().Add(s.cfg.StoreTimeout)))
}

// storeDeadline is when the store budget of ctx's request runs out, or
// budget from now outside a request that started one.
func storeDeadline(ctx context.Context, budget time.Duration) time.Time {
	if dl, ok := ctx.Value(budgetKey{}).(time.Time); ok {
		return dl
	}
	return time.Now().Add(budget)
}
