package leaky

import (
	"time"
)

// Plan is a bucket's BookingKeys and BookingArgs under one set of its
// limits, kept with that set so that a slot another package's script books
// with them can be adopted with what Cancel needs to give it back
// (AdoptBooked); a caller that keeps a plan builds it again when
// BookingVersion no longer says its Version.
type Plan struct {
	Keys []string
	Args []any
	set  *limitSet
}

// Limits is how many limits the plan's script reads from the bucket
// (current and draining, without the stated ones): the count of prev,
// next pairs AdoptBooked takes.
func (p Plan) Limits() int { return len(p.set.params) }

// Version is the BookingVersion of the limits the plan was made under:
// after a booking under it answered ReasonStale, Refresh(ctx, Version())
// reads the new limits.
func (p Plan) Version() uint64 { return p.set.version }

// Plan is the bucket's booking keys and args now (see BookingLua).
func (b *Bucket) Plan(leaseAfterSlot time.Duration) Plan {
	s := b.cur()
	return Plan{Keys: b.bookingKeys(s), Args: b.bookingArgs(s, leaseAfterSlot), set: s}
}

// AdoptBooked is Adopt for a slot a script booked under plan, which also
// answered each limit's TAT before and after the booking (tats: prev,
// next per limit, plan.Limits() pairs) and those of partition's limits
// (ptats, the same for plimits, as booked): Cancel then gives the slot
// back as it does one from ReserveIn.
func (b *Bucket) AdoptBooked(plan Plan, now, delay int64, lease string, tats []int64, partition string, plimits []Limit, ptats []int64, issued, received time.Time) *Reservation {
	r := b.Adopt(now, delay, lease, issued, received)
	r.set = plan.set
	r.tats = tats
	if len(ptats) == 2*len(plimits) {
		for j, l := range plimits {
			r.also = append(r.also, partTAT{key: b.PartitionTAT(partition, l), prev: ptats[2*j], next: ptats[2*j+1], per: l.Per})
		}
	}
	return r
}
