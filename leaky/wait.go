package leaky

import (
	"context"
	"fmt"
	"runtime"
	"time"
)

// Strict spacing. A limit of capacity 1 spaces its slots Per/Rate plus a
// slack apart (see Limit.Params): guard/Rate, 200µs at 100 per second with
// the default guard. An upstream that meters each gap, like nginx's
// limit_req without burst, refuses a send that arrives less than Per/Rate
// after the previous one, so what matters there is how evenly sends leave,
// not only how late. Go's timers fire up to about a millisecond late when
// the process idles in the network poller; so for limits whose slack is
// worth aiming for (strictMinSlack), Wait sleeps on a timer until
// strictSpin before the slot and then watches the clock.
//
// How late a send may still leave stays half the guard for every limit:
// holding strict sends to the slack was measured (issue 9) to cut a
// meter's refusals little (most follow a slow trip to the upstream, not a
// late wake-up) while every host stall of a few milliseconds then spent a
// slot, costing window upstreams several percent of their throughput.
const (
	// strictMinSlack is the least slack worth aiming for: below it (over
	// 100 per second at the default guard) the clock's uncertainty and
	// the trip to the upstream are as large as the slack itself.
	strictMinSlack = 200 * time.Microsecond
	// strictSpin is how long before a strict slot Wait stops sleeping on
	// a timer and watches the clock instead.
	strictSpin = 1500 * time.Microsecond
)

// strictSlack is the least slack of the bucket's strict limits, or 0 if
// it has none: limits of capacity 1 whose slack is at least
// strictMinSlack.
func (s *limitSet) strictSlack() time.Duration {
	var least time.Duration
	for i, l := range s.limits {
		if l.Capacity() != 1 {
			continue
		}
		slack := time.Duration(s.params[i].Interval*l.Rate-l.Per.Microseconds()) * time.Microsecond / time.Duration(l.Rate)
		if slack >= strictMinSlack && (least == 0 || slack < least) {
			least = slack
		}
	}
	return least
}

// lateness is how far past its slot (judged pessimistically, see
// offsetEstimator) a send may start: half the guard, the other half being
// left for the trip to the upstream.
func (r *Reservation) lateness() time.Duration { return r.bucket.cfg.Guard / 2 }

// sleepUntil waits until t, or until ctx ends. The last spin of the wait
// checks the clock in a loop, yielding to other goroutines, instead of
// trusting a timer: it costs up to spin of one CPU per wait.
func sleepUntil(ctx context.Context, t time.Time, spin time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err // ended already: a slot due now is not slept into either
	}
	if d := time.Until(t) - spin; d > 0 {
		tm := time.NewTimer(d)
		select {
		case <-ctx.Done():
			tm.Stop()
			return ctx.Err()
		case <-tm.C:
		}
	}
	for time.Now().Before(t) {
		if err := ctx.Err(); err != nil {
			return err
		}
		runtime.Gosched()
	}
	return nil
}

// Wait sleeps until the reservation's slot. If ctx ends first, the
// reservation is given back and ctx's error returned. If the caller woke
// more than half the guard after the slot (judged pessimistically, see
// offsetEstimator), Wait returns ErrLate and the slot is spent: sending then
// could put this send within one window of a later one. For a bucket with
// a strictly spaced limit (capacity 1, at most 100 per Per at the default
// guard) Wait watches the clock for the last 1.5ms instead of
// trusting a timer, so that sends leave as evenly as the host allows.
func (r *Reservation) Wait(ctx context.Context) error {
	if !r.OK {
		return fmt.Errorf("wait on %s: reservation was not booked", r.bucket.name)
	}
	if err := sleepUntil(ctx, r.SendAt(), r.bucket.cur().spin); err != nil {
		// Give the slot back with a fresh context: ours is done.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		r.bucket.Cancel(cctx, r)
		cancel()
		return err
	}
	if r.bucket.p.blocks.covers(r.bucket.name, r.Now.Add(r.Delay).UnixMicro()) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		r.bucket.Cancel(cctx, r)
		cancel()
		return ErrBlocked
	}
	if r.TooLate() {
		return ErrLate
	}
	return nil
}

// Late is how far past the slot it is now, at most.
func (r *Reservation) Late() time.Duration {
	return time.Since(r.earliest)
}

// TooLate reports whether it is now too late to send on this reservation:
// more than half the guard past its slot, or for a strictly spaced limit
// more than its slack (see Wait). Wait checks it on waking; a
// caller with work between Wait and the send (building a request, taking a
// connection) should check it again right before sending, and reserve
// again instead when it says so.
func (r *Reservation) TooLate() bool {
	return r.Late() > r.lateness()
}

// Take reserves a slot for costs and waits for it, coming back as often as
// the bucket asks (blocks, limits, concurrency) until ctx ends. When it
// returns nil the caller may send now; with a concurrency cap it must then
// Release the returned reservation when the send is done.
func (b *Bucket) Take(ctx context.Context, costs Costs, opts ...ReserveOption) (r *Reservation, err error) {
	lease := ""
	defer func() {
		if err != nil && lease != "" {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			b.ReleaseLease(cctx, lease)
			cancel()
		}
	}()
	for {
		ropts := opts
		if lease != "" {
			ropts = append(ropts[:len(ropts):len(ropts)], WithLease(lease))
		}
		r, err := b.Reserve(ctx, costs, ropts...)
		if err != nil {
			return nil, err
		}
		if !r.OK {
			if err := sleep(ctx, b.retryPause(r)); err != nil {
				return nil, err
			}
			continue
		}
		lease = r.Lease
		switch err := r.Wait(ctx); err {
		case nil:
			return r, nil
		case ErrLate, ErrBlocked:
			continue
		default:
			return nil, err
		}
	}
}

// retryPause is how long to sleep before asking again after a refusal.
// A concurrency refusal names the oldest lease's expiry, which may be far off
// while sends finish every few milliseconds, so that pause is capped.
func (b *Bucket) retryPause(r *Reservation) time.Duration {
	d := r.RetryAfter
	if r.Reason == ReasonConcurrency {
		d = min(d, 10*time.Millisecond)
	}
	return max(d, 100*time.Microsecond)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
