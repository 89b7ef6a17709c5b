package server

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/shaperhq/shaper/leaky"
)

// How long a proxied call waits for Redis. A call has agreed to wait for
// its slot up to its own wait (Shaper-Max-Wait, or proxy.max_wait), so a
// busy Redis that answers late is waited for within it, not turned into a
// 503 after the enqueue path's StoreTimeout: under load that bound gave
// false 503s to calls that had seconds left. A Redis that is down is told
// apart at once: a refused dial fails in a moment, and once two calls in a
// row have failed the store breaker answers the rest without asking (one
// probe now and then). Each command is still bounded by the Redis
// client's own read timeout.

// callBudget is when a call's Redis work must be done: the end of its
// wait, and never sooner than StoreTimeout from now.
func (s *Server) callBudget(deadline time.Time) time.Time {
	return later(deadline, time.Now().Add(s.cfg.StoreTimeout))
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// withCallBudget starts r's store budget at the end of the call's wait,
// so that its admission check, which shares the budget, waits for a busy
// Redis as long as the booking does.
func (s *Server) withCallBudget(r *http.Request, deadline time.Time) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), budgetKey{}, s.callBudget(deadline)))
}

// errBookedLate is a booking Redis answered after the call's budget: what
// it booked is given back, and the call is answered as if Redis had not
// answered in time.
var errBookedLate = errors.New("booking answered after the call's budget")

// book runs one Redis call of the booking (fn) within the call's budget,
// behind the store breaker: while Redis is known to be down it fails at
// once with errStoreHeld. A script call sent within the budget is read to
// its answer for up to StoreTimeout past it, so that a slot and lease it
// booked too late are known, and given back (errBookedLate), rather than
// held until they lapse.
func (s *Server) book(ctx context.Context, deadline time.Time, fn func(ctx context.Context) error) error {
	if !s.store.allow() {
		return errStoreHeld
	}
	budget := s.callBudget(deadline)
	bctx, cancel := context.WithDeadline(ctx, budget.Add(s.cfg.StoreTimeout))
	defer cancel()
	err := fn(bctx)
	if err == nil && time.Now().After(budget) {
		err = errBookedLate
	}
	if !errors.Is(err, leaky.ErrCostTooLarge) {
		// A cost no limit can carry says nothing about Redis.
		s.store.record(ctx, err)
	}
	return err
}
