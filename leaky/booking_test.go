package leaky

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/shaperhq/shaper/internal/gcra"
	"github.com/shaperhq/shaper/internal/script"
)

// bookingDriver books one slot per cost given through BookingLua, as a
// script of another package would: KEYS are the bucket's BookingKeys,
// ARGV[1] now, ARGV[2] the count, then BookingArgs, then the token costs.
var bookingDriver = script.New(gcra.LuaFunctions, BookingLua(), `
local now = tonumber(ARGV[1])
local b, a = leaky_open(KEYS, 1, ARGV, 3, now)
local out = {}
for i = 1, tonumber(ARGV[2]) do
  local costs = {tokens = tonumber(ARGV[a + i - 1])}
  local slot = leaky_earliest(b, costs, now)
  leaky_book(b, slot, costs, 'l' .. i)
  out[i] = slot - now
end
leaky_commit(b, now)
return out
`)

// TestBookingLibraryBooksAsReserve: slots booked through the library a
// script of another package composes are the slots Reserve books on a twin
// bucket, and leave the same state.
func TestBookingLibraryBooksAsReserve(t *testing.T) {
	clock := newFrozenClock()
	ctx := context.Background()
	rdb := srv.Client(t)
	cfg := BucketConfig{Limits: []Limit{PerSecond(100), {Rate: 6000, Per: time.Minute, Cost: "tokens", Burst: 300}},
		Guard: time.Millisecond}
	viaReserve := newBucket(t, rdb, clock.Now, cfg)
	viaLib := newBucket(t, rdb, clock.Now, cfg)
	costs := []int64{100, 0, 250, 5, 40, 300, 1}
	var want []int64
	for _, c := range costs {
		r, err := viaReserve.Reserve(ctx, Costs{"tokens": c}, MaxWait(time.Hour))
		if err != nil || !r.OK {
			t.Fatalf("reserve %d: got %+v, %v", c, r, err)
		}
		want = append(want, r.Delay.Microseconds())
	}
	now := clock.Now().UnixMicro()
	args := append([]any{strconv.FormatInt(now, 10), len(costs)}, viaLib.BookingArgs(time.Second)...)
	for _, c := range costs {
		args = append(args, c)
	}
	v, err := script.Run(ctx, rdb, "booking driver", bookingDriver, viaLib.BookingKeys(), args...)
	if err != nil {
		t.Fatal(err)
	}
	got, err := script.Ints(v, len(costs))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("slots through the library got %v µs, want %v (Reserve's)", got, want)
	}
	a, err := viaReserve.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := viaLib.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a.Booked, b.Booked) {
		t.Fatalf("booked through the library %v, want %v", b.Booked, a.Booked)
	}
}

// keysDriver answers the keys leaky_open names from the bucket's prefix
// for a bucket whose dyn hash states limits: the leases, the stated
// limits' TATs (in b.lim after the configured one's), and partition p's
// TAT of its one limit; then the reason of leaky_earliest, which reads the
// block. KEYS are BookingKeys; ARGV[1] now, then BookingArgs, then
// PartitionArgs.
var keysDriver = script.New(gcra.LuaFunctions, BookingLua(), `
local now = tonumber(ARGV[1])
local b, a = leaky_open(KEYS, 1, ARGV, 2, now)
local pl = leaky_limits(ARGV, a)
local out = {b.leases}
for i = 1, #b.lim do out[#out + 1] = b.lim[i].key end
out[#out + 1] = leaky_partition(b, 'p', pl, now).key[1]
local _, why = leaky_earliest(b, {}, now)
out[#out + 1] = tostring(why)
return out
`)

// TestBookingLibraryNamesKeysAsGo: the keys the booking library names
// from the bucket's prefix rather than being passed (the block, the
// leases, the stated limits' TATs, a partition's TAT) are the keys this
// package's Go names, which its other scripts read and write.
func TestBookingLibraryNamesKeysAsGo(t *testing.T) {
	ctx := context.Background()
	clock := newFrozenClock()
	rdb := srv.Client(t)
	b := newBucket(t, rdb, clock.Now, BucketConfig{Limits: []Limit{PerSecond(100)}, Concurrency: 2})
	if _, err := b.Learn(ctx, []Limit{PerSecond(50), PerMinute(600)}); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := b.Pushback(ctx, time.Second, time.Minute, 0, "test", time.Time{}); err != nil {
		t.Fatal(err)
	}
	part := []Limit{PerSecond(5)}
	pargs, err := b.PartitionArgs(part)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]any{strconv.FormatInt(clock.Now().UnixMicro(), 10)}, b.BookingArgs(time.Second)...)
	v, err := script.Run(ctx, rdb, "keys driver", keysDriver, b.BookingKeys(), append(args, pargs...)...)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, k := range v.([]any) {
		got = append(got, k.(string))
	}
	want := append(b.leasesKey(), b.BookingKeys()...)
	for i := 1; i <= MaxStated; i++ {
		want = append(want, b.statedKey(i))
	}
	// The block Pushback wrote holds the slot: reason 2.
	want = append(want, b.PartitionTAT("p", part[0]), "2")
	if !slices.Equal(got, want) {
		t.Fatalf("keys the library names, then the reason: got %q, want %q", got, want)
	}
}
