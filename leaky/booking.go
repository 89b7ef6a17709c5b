package leaky

import (
	_ "embed"
	"fmt"
	"time"
)

//go:embed booking.lua
var bookingLua string

// BookingLua is the Lua library through which a script of another package
// books send slots on a bucket in the same call as its own work, so that
// the two are one atomic round trip (the job store takes a job and books
// its slot at once); booking.lua states what it defines. It needs
// script.Prelude and gcra.LuaFunctions before it. The script that uses it
// passes the bucket's BookingKeys as the last of its KEYS and BookingArgs
// and PartitionArgs among its ARGV, and gives the library their indices:
// no local of the caller's is read.
func BookingLua() string { return dynLua + bookingLua }

// BookingKeys are the bucket's keys that BookingLua's leaky_open reads,
// in order; they must be the last of the script's KEYS (the stated limits'
// TATs run to the end).
func (b *Bucket) BookingKeys() []string {
	out := append([]string(nil), b.keys...) // block, leases, one TAT per limit
	return append(out, b.dynKeys()...)      // the dyn hash, the stated TATs
}

// BookingArgs are the bucket's ARGV that leaky_open reads, in order: its
// concurrency cap, how long a lease outlives its slot, and its limits as
// configured (with their shapes under the bucket's guard).
func (b *Bucket) BookingArgs(leaseAfterSlot time.Duration) []any {
	out := []any{b.cfg.Concurrency, leaseAfterSlot.Microseconds(), b.p.key(b.name, "p:"), len(b.cfg.Limits)}
	fields := b.dynFields()
	for i, l := range b.cfg.Limits {
		out = append(out, b.params[i].Interval, b.params[i].Capacity, l.Per.Microseconds(), l.Cost, fields[i])
	}
	return out
}

// PartitionArgs are the ARGV that leaky_limits reads for a partition's
// limits, shaped under the bucket's guard; their state is kept beside the
// bucket's, one TAT per partition and limit (PartitionTAT).
func (b *Bucket) PartitionArgs(ls []Limit) ([]any, error) {
	out := []any{len(ls)}
	for _, l := range ls {
		if err := l.Validate(); err != nil {
			return nil, err
		}
		p := l.Params(b.cfg.Guard)
		if err := p.Validate(); err != nil {
			return nil, fmt.Errorf("limit %v: %w", l, err)
		}
		out = append(out, limitID(l), p.Interval, p.Capacity, l.Per.Microseconds(), l.Cost)
	}
	return out, nil
}
