package leaky

import (
	"context"
	"fmt"
	"time"
)

// lateness is how far past its slot a send may start: half the guard, the
// other half being left for the trip to the upstream.
func (b *Bucket) lateness() time.Duration { return b.cfg.Guard / 2 }

// Wait sleeps until the reservation's slot. If ctx ends first, the
// reservation is given back and ctx's error returned. If the caller woke
// more than half the guard after the slot (judged pessimistically, see
// offsetEstimator), Wait returns ErrLate and the slot is spent: sending then
// could put this send within one window of a later one.
func (r *Reservation) Wait(ctx context.Context) error {
	if !r.OK {
		return fmt.Errorf("wait on %s: reservation was not booked", r.bucket.name)
	}
	if d := time.Until(r.SendAt()); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			// Give the slot back with a fresh context: ours is done.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			r.bucket.Cancel(cctx, r)
			cancel()
			return ctx.Err()
		case <-t.C:
		}
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
// more than half the guard past its slot. Wait checks it on waking; a
// caller with work between Wait and the send (building a request, taking a
// connection) should check it again right before sending, and reserve
// again instead when it says so.
func (r *Reservation) TooLate() bool {
	return r.Late() > r.bucket.lateness()
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
