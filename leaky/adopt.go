package leaky

import (
	"time"
)

// Layout names the bucket's keys that another package's code reads or
// clears beside its own (the job store's status reads the block; a job put
// back releases its lease). Booking slots goes through BookingLua instead.
// Every key carries the bucket's hash tag, {name}.
type Layout struct {
	// Block is the block hash (until, reason).
	Block string
	// Leases is the concurrency lease sorted set (lease id -> expiry µs).
	Leases string
	// PartitionPrefix starts the TAT key of a partition's limit (see
	// PartitionTAT).
	PartitionPrefix string
}

// Layout reports where the bucket keeps its state.
func (b *Bucket) Layout() Layout {
	return Layout{Block: b.blockKey()[0], Leases: b.leasesKey()[0], PartitionPrefix: b.p.key(b.name, "p:")}
}

// LimitID names a limit's state by what it counts and over what window.
func LimitID(l Limit) string { return limitID(l) }

// Adopt turns a slot that a script booked on this bucket's state (see
// BookingLua) into a Reservation: now and delay are the script's Redis clock
// and the µs from then until the slot; issued and received bracket the
// call on the local clock. Wait, TooLate and Release work on it as on one
// from Reserve; Cancel only releases its lease, since the script, not this
// package, knows what it changed.
func (b *Bucket) Adopt(now, delay int64, lease string, issued, received time.Time) *Reservation {
	lo, hi := b.clock.observe(issued, received, now)
	slot := now + delay
	return &Reservation{
		OK: true, Delay: time.Duration(delay) * time.Microsecond, Lease: lease,
		Now: time.UnixMicro(now), bucket: b,
		sendAt: b.clock.toLocal(slot - lo), earliest: b.clock.toLocal(slot - hi),
	}
}

// Guard is the bucket's guard: how far a send may slip after its slot.
func (b *Bucket) Guard() time.Duration { return b.cfg.Guard }
