package leaky

import (
	"time"

	"github.com/shaperhq/shaper/internal/gcra"
)

// Layout is where a bucket keeps its shared state, for a script outside
// this package that books slots on the bucket together with state of its
// own in one call (shaper's dispatcher takes a job and books its slot at
// once). Every key carries the bucket's hash tag, {name}, so such a script
// stays in one Redis Cluster slot if its own keys carry the same tag.
type Layout struct {
	// Block is the block hash (until, reason).
	Block string
	// Leases is the concurrency lease sorted set (lease id -> expiry µs).
	Leases string
	// TATs holds one TAT string key per limit, in the order of Limits.
	TATs []string
	// Params are the limits' shapes with the bucket's guard, in order.
	Params []gcra.Params
	// PartitionPrefix starts the TAT key of a partition's limit:
	// PartitionPrefix + partition + ":" + LimitID(limit).
	PartitionPrefix string
	// Dyn is the hash of dynamic limits (see DynLua), DynFields the field
	// of each limit in it ("" for a fixed limit), and Stated the TAT keys
	// of the limits the upstream stated, MaxStated of them.
	Dyn       string
	DynFields []string
	Stated    []string
}

// Layout reports where the bucket keeps its state.
func (b *Bucket) Layout() Layout {
	return Layout{
		Block: b.keys[0], Leases: b.keys[1],
		TATs:            append([]string(nil), b.keys[2:]...),
		Params:          append([]gcra.Params(nil), b.params...),
		PartitionPrefix: b.p.key(b.name, "p:"),
		Dyn:             b.dynKey(),
		DynFields:       b.dynFields(),
		Stated:          b.dynKeys()[1:],
	}
}

// LimitID names a limit's state by what it counts and over what window.
func LimitID(l Limit) string { return limitID(l) }

// Adopt turns a slot that a script booked on this bucket's state (see
// Layout) into a Reservation: now and delay are the script's Redis clock
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
