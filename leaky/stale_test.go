package leaky

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/gcra"
	"github.com/shaperhq/shaper/internal/script"
)

// earliestDriver answers leaky_earliest's slot and reason for one send,
// booking nothing: KEYS are BookingKeys, ARGV[1] now, then BookingArgs.
var earliestDriver = script.New(gcra.LuaFunctions, BookingLua(), `
local now = tonumber(ARGV[1])
local b = leaky_open(KEYS, 1, ARGV, 2, now)
local slot, why = leaky_earliest(b, {}, now)
return {slot - now, why}
`)

// TestStaleLimitsBookNothing: once an operator's change is written, a
// process that has not heard of it books nothing under the limits it
// holds, by any of the booking scripts; Reserve and ReserveIn read the
// change and book under the new limits, and a Follow's changed hears of
// it.
func TestStaleLimitsBookNothing(t *testing.T) {
	ctx := context.Background()
	clock := newFrozenClock()
	rdb := srv.Client(t)
	name := uniqueName(t)
	cfg := BucketConfig{Limits: []Limit{PerSecond(100)}, Guard: 10 * time.Millisecond, MaxWait: 250 * time.Millisecond}
	bucket := func() *Bucket {
		b, err := New(rdb, Config{Now: clock.Now}).Bucket(name, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	setter, viaLib, viaReserve, viaIn := bucket(), bucket(), bucket(), bucket()
	next := []Limit{PerSecond(4)}
	o, err := setter.PutLimits(ctx, next)
	if err != nil {
		t.Fatal(err)
	}
	// The library: reason 5, no slot.
	now := clock.Now().UnixMicro()
	v, err := script.Run(ctx, rdb, "earliest driver", earliestDriver, viaLib.BookingKeys(),
		append([]any{strconv.FormatInt(now, 10)}, viaLib.BookingArgs(time.Second)...)...)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := script.Ints(v, 2); err != nil || got[1] != int64(ReasonStale) || got[0] < int64(time.Hour/time.Microsecond) {
		t.Fatalf("earliest under stale limits: got %v, %v; want reason %d and no slot", got, err, ReasonStale)
	}
	// Nothing was booked under the configured limits' state.
	if err := rdb.Get(ctx, viaLib.tatKey(PerSecond(100), 0)).Err(); err != redis.Nil {
		t.Fatalf("the configured limit's TAT: got %v, want none booked", err)
	}
	heard := 0
	defer viaReserve.p.hooks.add([]*Bucket{viaReserve}, func(*Bucket) { heard++ })()
	for _, b := range []*Bucket{viaReserve, viaIn} {
		var r *Reservation
		var err error
		if b == viaIn {
			r, err = b.ReserveIn(ctx, nil, "p1", []Limit{PerSecond(50)}, MaxWait(time.Second))
		} else {
			r, err = b.Reserve(ctx, nil, MaxWait(time.Second))
		}
		if err != nil || !r.OK {
			t.Fatalf("reserve after the change: got %+v, %v", r, err)
		}
		if c := b.Config(); c.Generation != o.Generation() || !slices.Equal(c.Limits, next) || len(c.Draining) != 1 {
			t.Fatalf("after reserving: pacing at %v generation %d, %d draining; want %v generation %d, the configured draining",
				c.Limits, c.Generation, len(c.Draining), next, o.Generation())
		}
	}
	if heard != 1 {
		t.Errorf("changed called %d times on the refresh, want 1", heard)
	}
	// The slots went to the new limits' state.
	if err := rdb.Get(ctx, viaReserve.tatKey(next[0], o.Generation())).Err(); err != nil {
		t.Fatalf("the new limit's TAT: %v, want booked", err)
	}
	// A reading older than one applied changes nothing.
	if ch, _, err := viaReserve.Apply(Override{}, clock.Now()); err != nil || ch || viaReserve.Config().Generation != o.Generation() {
		t.Fatalf("applying an older reading: changed %v, %v, generation %d; want no change", ch, err, viaReserve.Config().Generation)
	}
}

// TestRefreshAfterTheCountWentBack: Redis lost its last changes (a
// failover losing writes, a restart without persistence) after a process
// heard of them, so the next change's count is lower than the one the
// process holds. Its bookings answer stale; the Refresh that follows
// applies what it reads, and booking goes on.
func TestRefreshAfterTheCountWentBack(t *testing.T) {
	ctx := context.Background()
	clock := newFrozenClock()
	rdb := srv.Client(t)
	name := uniqueName(t)
	cfg := BucketConfig{Limits: []Limit{PerSecond(100)}, Guard: 10 * time.Millisecond, MaxWait: 250 * time.Millisecond}
	b, err := New(rdb, Config{Now: clock.Now}).Bucket(name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, rate := range []int64{50, 40} {
		o, err := b.PutLimits(ctx, []Limit{PerSecond(rate)})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := b.Apply(o, clock.Now()); err != nil {
			t.Fatal(err)
		}
	}
	// Redis forgets both changes, then an operator makes a third.
	if err := rdb.Del(ctx, b.opKey(), b.dynKey()).Err(); err != nil {
		t.Fatal(err)
	}
	o, err := b.PutLimits(ctx, []Limit{PerSecond(30)})
	if err != nil {
		t.Fatal(err)
	}
	if o.Changes >= 2 {
		t.Fatalf("the change after the loss counts %d; the test wants a count gone back", o.Changes)
	}
	clock.Advance(2 * time.Second)
	r, err := b.Reserve(ctx, nil, MaxWait(time.Second))
	if err != nil || !r.OK {
		t.Fatalf("reserve after the count went back: got %+v, %v; want booked under the new limits", r, err)
	}
	if got := b.Config().Limits; !slices.Equal(got, []Limit{PerSecond(30)}) {
		t.Errorf("pacing at %v, want the new 30/s", got)
	}
}
