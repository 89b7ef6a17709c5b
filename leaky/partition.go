package leaky

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/shaperhq/shaper/internal/script"
)

// ReasonPartition: the partition's own limits cannot send yet
// (ReserveIn); RetryAfter is when they can.
const ReasonPartition Reason = 4

// ReserveIn is Reserve for a send that also counts in a partition's
// limits (as the job store's take books a job of that partition): it
// books the bucket's earliest slot within the max wait, and the
// partition's limits at the same slot, once the partition can send now.
// A partition that cannot send yet books nothing and answers not OK with
// ReasonPartition and the wait until it can. An operator's override of
// the partition replaces limits. With no partition, or no limits and no
// override, it is Reserve. Cancel gives back the partition's share of the
// slot too.
func (b *Bucket) ReserveIn(ctx context.Context, costs Costs, partition string, limits []Limit, opts ...ReserveOption) (*Reservation, error) {
	if partition == "" || (len(limits) == 0 && !b.cur().pov) {
		// No partition limits, and no operator's override of any
		// partition (PutPartitionLimits) to look up.
		return b.Reserve(ctx, costs, opts...)
	}
	o := reserveOpts{maxWait: b.cfg.MaxWait}
	for _, opt := range opts {
		opt(&o)
	}
	if b.cfg.Concurrency > 0 && o.lease == "" {
		o.lease = newLeaseID()
	}
	if b.cfg.Concurrency == 0 {
		o.lease = ""
	}
	s := b.cur()
	for i, l := range s.limits {
		if _, err := b.cost(l, costs); err != nil && (i < s.n || !errors.Is(err, ErrCostTooLarge)) {
			return nil, err
		}
	}
	pargs, err := b.PartitionArgs(limits)
	if err != nil {
		return nil, fmt.Errorf("reserve %s: partition limits: %w", b.name, err)
	}
	args := []any{script.NowArg(b.p.now), o.maxWait.Microseconds(), o.lease}
	args = append(args, b.bookingArgs(s, b.cfg.LeaseTTL)...)
	args = append(args, pargs...)
	args = append(args, partition, len(costs))
	for _, name := range sortedCostNames(costs) {
		args = append(args, name, costs[name])
	}
	issued := time.Now()
	v, err := script.Run(ctx, b.p.rdb, "leaky.reserve_partition", partitionReserveScript, b.bookingKeys(s), args...)
	if err != nil {
		return nil, fmt.Errorf("reserve %s: %w", b.name, err)
	}
	received := time.Now()
	n := len(s.params)
	out, err := script.Ints(v, -1)
	// An operator's override of the partition (PutPartitionLimits) books
	// its own limits in place of these: then only the bucket's share of
	// the slot is given back by Cancel.
	if err != nil || (len(out) != 5 && (len(out) < 5+2*n || (len(out)-5-2*n)%2 != 0)) {
		return nil, fmt.Errorf("reserve %s: malformed reply %v: %v", b.name, v, err)
	}
	lo, hi := b.clock.observe(issued, received, out[4])
	r := &Reservation{OK: out[0] == 1, Reason: Reason(out[2]), Now: time.UnixMicro(out[4]), bucket: b, set: s}
	if !r.OK {
		if r.Reason == ReasonStale {
			// An operator changed the limits since this process read them.
			if o.stale >= 3 {
				return nil, fmt.Errorf("reserve %s: %w", b.name, errStale)
			}
			if err := b.Refresh(ctx, s.version); err != nil {
				return nil, fmt.Errorf("reserve %s: %w", b.name, err)
			}
			return b.ReserveIn(ctx, costs, partition, limits, append(slices.Clone(opts), retriedStale)...)
		}
		r.RetryAfter = time.Duration(out[1]) * time.Microsecond
		return r, nil
	}
	r.Delay = time.Duration(out[1]) * time.Microsecond
	r.Lease = o.lease
	r.tats = out[5 : 5+2*n]
	if len(out) == 5+2*n+2*len(limits) {
		for j, l := range limits {
			r.also = append(r.also, partTAT{key: b.PartitionTAT(partition, l), prev: out[5+2*n+2*j], next: out[6+2*n+2*j], per: l.Per})
		}
	}
	slot := out[4] + out[1]
	r.sendAt, r.earliest = b.clock.toLocal(slot-lo), b.clock.toLocal(slot-hi)
	return r, nil
}

// partTAT is a partition limit's TAT as a reservation moved it, for
// Cancel.
type partTAT struct {
	key        string
	prev, next int64
	per        time.Duration
}

func sortedCostNames(c Costs) []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
