package leaky

import (
	_ "embed"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/shaperhq/shaper/internal/script"
)

//go:embed booking.lua
var bookingLua string

// BookingLua is the Lua library through which a script of another package
// books send slots on a bucket in the same call as its own work, so that
// the two are one atomic round trip (the job store takes a job and books
// its slot at once); booking.lua states what it defines. It needs
// script.Prelude and gcra.LuaFunctions before it. The script that uses it
// passes the bucket's BookingKeys among its KEYS and BookingArgs and
// PartitionArgs among its ARGV, and gives the library their indices: no
// local of the caller's is read.
func BookingLua() string {
	// The dyn library is built only for a bucket whose dyn hash exists
	// (leaky_open), through its loader (script.Lazy).
	return script.Lazy("leaky_dyn", []string{"shaper_dyn_read", "shaper_dyn_interval", "shaper_stated"}, dynLua) +
		"local LEAKY_MAX_STATED = " + strconv.Itoa(MaxStated) + "\n" + bookingLua
}

// BookingKeys are the bucket's keys that BookingLua's leaky_open reads,
// in order: one TAT per limit. The keys it reads only in some cases (the
// block, the leases, the dynamic limits and their TATs, the partitions'
// TATs) it names from the bucket's key prefix, which BookingArgs passes.
func (b *Bucket) BookingKeys() []string { return b.bookingKeys(b.cur()) }

func (b *Bucket) bookingKeys(s *limitSet) []string {
	return slices.Clone(s.keys[2:]) // s.keys: block, leases, one TAT per limit
}

// BookingArgs are the bucket's ARGV that leaky_open reads, in order: its
// concurrency cap, how long a lease outlives its slot, its key prefix,
// where partitions' overrides are, its limits as paced now (with their
// shapes under the bucket's guard), and the count of operators' changes
// they follow: a script booking under limits an operator has changed since
// answers ReasonStale (see Refresh).
func (b *Bucket) BookingArgs(leaseAfterSlot time.Duration) []any {
	return b.bookingArgs(b.cur(), leaseAfterSlot)
}

func (b *Bucket) bookingArgs(s *limitSet, leaseAfterSlot time.Duration) []any {
	pov := ""
	if s.pov {
		pov = b.povKey()
	}
	out := []any{b.cfg.Concurrency, leaseAfterSlot.Microseconds(), b.p.key(b.name, ""), pov, len(s.limits)}
	for i, l := range s.limits {
		// A limit of requests, fixed and in force, the common one, is "":
		// every argument costs Redis a little on every call.
		x := ""
		if f := dynField(l); l.Cost != "" || f != "" || s.upto[i] != 0 {
			x = l.Cost + " " + f + " " + strconv.FormatInt(s.upto[i], 10)
		}
		out = append(out, s.params[i].Interval, s.params[i].Capacity, l.Per.Microseconds(), x)
	}
	return append(out, s.changes)
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
