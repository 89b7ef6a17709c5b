package leaky

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/testsupport/childproc"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

var srv *redistest.Server

func TestMain(m *testing.M) {
	if role := childproc.Role(); role != "" {
		os.Exit(runChild(role))
	}
	redistest.Main(m, &srv)
}

// testClock is a settable clock for Config.Now that never runs slower than
// real time, so keys Redis expires by its own clock are stale on this one
// too. Last is the instant most recently handed to a script.
type testClock struct {
	mu     sync.Mutex
	start  time.Time
	base   time.Time
	offset time.Duration
	last   time.Time
	frozen bool
}

func newTestClock() *testClock {
	return &testClock{start: time.Now(), base: time.UnixMicro(1_800_000_000_000_000)}
}

// newFrozenClock moves only when advanced. Tests using it must finish well
// within the shortest TTL they cause (a second or so), since Redis expires
// keys by its own clock.
func newFrozenClock() *testClock {
	c := newTestClock()
	c.frozen = true
	return c
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	real := time.Since(c.start)
	if c.frozen {
		real = 0
	}
	c.last = c.base.Add(real + c.offset).Truncate(time.Microsecond)
	return c.last
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.offset += d
	c.mu.Unlock()
}

func (c *testClock) Last() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last.UnixMicro()
}

func uniqueName(t *testing.T) string {
	return strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + fmt.Sprint(rand.IntN(1e9))
}

func newBucket(t *testing.T, rdb redis.Scripter, clock func() time.Time, cfg BucketConfig) *Bucket {
	t.Helper()
	b, err := New(rdb, Config{Now: clock}).Bucket(uniqueName(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestReserveSpacesSlotsEvenly(t *testing.T) {
	clock := newTestClock()
	b := newBucket(t, srv.Client(t), clock.Now, BucketConfig{Limits: []Limit{PerSecond(100)}, Guard: 10 * time.Millisecond})
	ctx := context.Background()
	// 100/s with a 10ms guard: one slot every ⌈1.01s/100⌉ = 10100µs.
	var last time.Duration
	for i := 0; i < 5; i++ {
		r, err := b.Reserve(ctx, nil, MaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if !r.OK {
			t.Fatalf("reservation %d refused: %+v", i, r)
		}
		slot := r.Now.Add(r.Delay).Sub(time.UnixMicro(0))
		if i > 0 && slot-last != 10100*time.Microsecond {
			t.Fatalf("reservation %d: got spacing %v, want 10.1ms", i, slot-last)
		}
		last = slot
	}
}

func TestMaxWaitRefusesAndSaysWhen(t *testing.T) {
	clock := newFrozenClock()
	b := newBucket(t, srv.Client(t), clock.Now, BucketConfig{Limits: []Limit{PerSecond(10)}, Guard: time.Millisecond})
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if r, err := b.Reserve(ctx, nil, MaxWait(250*time.Millisecond)); err != nil || !r.OK {
			t.Fatalf("reservation %d: got %+v, %v; want booked", i, r, err)
		}
	}
	// Slots are 100.1ms apart: the 4th is 300.3ms out, beyond 250ms.
	r, err := b.Reserve(ctx, nil, MaxWait(250*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if r.OK || r.Reason != ReasonLimit || r.Limit == nil {
		t.Fatalf("got %+v, want refused by the limit", r)
	}
	if want := 300300*time.Microsecond - 250*time.Millisecond; r.RetryAfter != want {
		t.Fatalf("got RetryAfter %v, want %v", r.RetryAfter, want)
	}
	clock.Advance(r.RetryAfter)
	if r, err := b.Reserve(ctx, nil, MaxWait(250*time.Millisecond)); err != nil || !r.OK {
		t.Fatalf("after RetryAfter got %+v, %v; want booked", r, err)
	}
}

func TestMultipleLimitsAllOrNothing(t *testing.T) {
	clock := newFrozenClock()
	ctx := context.Background()
	b := newBucket(t, srv.Client(t), clock.Now, BucketConfig{
		Limits: []Limit{PerSecond(1000), {Rate: 6000, Per: time.Minute, Cost: "tokens", Burst: 3000}},
		Guard:  time.Millisecond,
	})
	// The token limit lets 3000 out at once, then 100 per second.
	if r, err := b.Reserve(ctx, Costs{"tokens": 3000}, MaxWait(0)); err != nil || !r.OK {
		t.Fatalf("first: got %+v, %v; want booked now", r, err)
	}
	before, err := b.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r, err := b.Reserve(ctx, Costs{"tokens": 2000}, MaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if r.OK || r.Limit == nil || r.Limit.Cost != "tokens" {
		t.Fatalf("second: got %+v, want refused by the token limit", r)
	}
	after, err := b.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The request limit allowed it, but must not have been charged.
	if !slices.Equal(after.Booked, before.Booked) || before.Booked[0] != 1001*time.Microsecond {
		t.Fatalf("booked %v after a refusal, want %v with the request limit at 1.001ms", after.Booked, before.Booked)
	}
	if _, err := b.Reserve(ctx, Costs{"tokens": 3001}); !errors.Is(err, ErrCostTooLarge) {
		t.Fatalf("cost over the burst: got %v, want ErrCostTooLarge", err)
	}
	if err := b.CheckCosts(Costs{"tokens": 3001}); !errors.Is(err, ErrCostTooLarge) {
		t.Fatalf("CheckCosts: got %v, want ErrCostTooLarge", err)
	}
}

func TestCancelGivesBackOnlyTheLatest(t *testing.T) {
	clock := newTestClock()
	ctx := context.Background()
	b := newBucket(t, srv.Client(t), clock.Now, BucketConfig{Limits: []Limit{PerSecond(10)}, Guard: time.Millisecond})
	r1, _ := b.Reserve(ctx, nil)
	r2, _ := b.Reserve(ctx, nil)
	r3, err := b.Reserve(ctx, nil)
	if err != nil || !r1.OK || !r2.OK || !r3.OK {
		t.Fatalf("setup: %v", err)
	}
	// r2 has a later reservation behind it: its slot stays spent.
	if n, err := b.Cancel(ctx, r2); err != nil || n != 0 {
		t.Fatalf("cancel of a middle reservation: got %d, %v; want 0 restored", n, err)
	}
	if n, err := b.Cancel(ctx, r3); err != nil || n != 1 {
		t.Fatalf("cancel of the latest: got %d, %v; want 1 restored", n, err)
	}
	r4, err := b.Reserve(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := r4.Now.Add(r4.Delay), r3.Now.Add(r3.Delay); !got.Equal(want) {
		t.Fatalf("after giving r3 back the next slot is %v, want r3's %v", got, want)
	}
}

func TestBlockHoldsEveryReservation(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	name := uniqueName(t)
	cfg := BucketConfig{Limits: []Limit{PerSecond(1000)}}
	// Two pacers stand for two replicas.
	b1, _ := New(rdb, Config{}).Bucket(name, cfg)
	b2, err := New(srv.Client(t), Config{}).Bucket(name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	until, err := b1.Block(ctx, 30*time.Second, "429 from upstream")
	if err != nil {
		t.Fatal(err)
	}
	// A shorter block does not shorten it.
	if u2, err := b2.Block(ctx, time.Second, "shorter"); err != nil || !u2.Equal(until) {
		t.Fatalf("shorter block: got %v, %v; want the existing %v", u2, err, until)
	}
	r, err := b2.Reserve(ctx, nil, MaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if r.OK || r.Reason != ReasonBlocked || r.RetryAfter < 28*time.Second {
		t.Fatalf("got %+v, want refused as blocked for about 29s", r)
	}
	st, err := b2.State(ctx)
	if err != nil || st.BlockReason != "429 from upstream" || !st.BlockedUntil.Equal(until) {
		t.Fatalf("state: got %+v, %v", st, err)
	}
	if err := b2.Unblock(ctx); err != nil {
		t.Fatal(err)
	}
	if r, err := b1.Reserve(ctx, nil, MaxWait(0)); err != nil || !r.OK {
		t.Fatalf("after unblock got %+v, %v; want booked now", r, err)
	}
	if _, err := b1.Block(ctx, 0, "x"); err == nil {
		t.Fatal("block of 0 accepted, want an error")
	}
}

func TestBlockWithinMaxWaitDelays(t *testing.T) {
	clock := newFrozenClock()
	ctx := context.Background()
	b := newBucket(t, srv.Client(t), clock.Now, BucketConfig{Limits: []Limit{PerSecond(1000)}})
	if _, err := b.Block(ctx, 200*time.Millisecond, "pushback"); err != nil {
		t.Fatal(err)
	}
	r, err := b.Reserve(ctx, nil, MaxWait(time.Second))
	if err != nil || !r.OK || r.Reason != ReasonBlocked {
		t.Fatalf("got %+v, %v; want booked at the block's end", r, err)
	}
	if r.Delay != 200*time.Millisecond {
		t.Fatalf("got delay %v, want the 200ms block", r.Delay)
	}
}

// TestBlockAnnouncedToOtherReplicas books a slot in one process's view,
// blocks the bucket from another, and checks that the first holds its slot
// back once the announcement arrives.
func TestBlockAnnouncedToOtherReplicas(t *testing.T) {
	ctx := context.Background()
	name := uniqueName(t)
	cfg := BucketConfig{Limits: []Limit{PerSecond(10)}, Guard: time.Millisecond}
	p1 := New(srv.Client(t), Config{})
	b1, _ := p1.Bucket(name, cfg)
	b2, err := New(srv.Client(t), Config{}).Bucket(name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	watched := make(chan error, 1)
	go func() { watched <- p1.Watch(wctx) }()
	defer func() {
		stop()
		if err := <-watched; err != nil {
			t.Errorf("Watch: %v", err)
		}
	}()
	// Book the second slot, 100ms out, then block from the other replica.
	b1.Reserve(ctx, nil)
	r, err := b1.Reserve(ctx, nil)
	if err != nil || !r.OK || r.Delay < 90*time.Millisecond {
		t.Fatalf("setup: %+v, %v", r, err)
	}
	// The subscription may take a moment to be in place; keep announcing.
	for deadline := time.Now().Add(5 * time.Second); !p1.blocks.covers(name, r.Now.UnixMicro()); {
		if _, err := b2.Block(ctx, 5*time.Second, "429"); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the block announcement never arrived")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := r.Wait(ctx); !errors.Is(err, ErrBlocked) {
		t.Fatalf("Wait on a slot booked before the block: got %v, want ErrBlocked", err)
	}
	if err := b2.Unblock(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); p1.blocks.covers(name, r.Now.UnixMicro()); {
		if time.Now().After(deadline) {
			t.Fatal("the unblock announcement never arrived")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestConcurrencyLeases(t *testing.T) {
	clock := newTestClock()
	ctx := context.Background()
	b := newBucket(t, srv.Client(t), clock.Now, BucketConfig{
		Limits: []Limit{PerSecond(1000)}, Concurrency: 2, LeaseTTL: time.Second,
	})
	r1, _ := b.Reserve(ctx, nil)
	r2, err := b.Reserve(ctx, nil)
	if err != nil || !r1.OK || !r2.OK || r1.Lease == r2.Lease {
		t.Fatalf("two leases: got %+v %+v %v", r1, r2, err)
	}
	r3, err := b.Reserve(ctx, nil)
	if err != nil || r3.OK || r3.Reason != ReasonConcurrency {
		t.Fatalf("third: got %+v, %v; want refused for concurrency", r3, err)
	}
	if st, _ := b.State(ctx); st.InFlight != 2 {
		t.Fatalf("in flight: got %d, want 2", st.InFlight)
	}
	// Re-reserving with a held lease renews it rather than needing another.
	if r, err := b.Reserve(ctx, nil, WithLease(r1.Lease)); err != nil || !r.OK {
		t.Fatalf("renewal: got %+v, %v; want booked", r, err)
	}
	if err := b.Release(ctx, r2); err != nil {
		t.Fatal(err)
	}
	if r, err := b.Reserve(ctx, nil); err != nil || !r.OK {
		t.Fatalf("after release: got %+v, %v; want booked", r, err)
	}
	// Holders that vanish lose their leases after LeaseTTL beyond their slot.
	clock.Advance(1100 * time.Millisecond)
	if st, _ := b.State(ctx); st.InFlight != 0 {
		t.Fatalf("in flight after expiry: got %d, want 0", st.InFlight)
	}
	if ok, err := b.ExtendLease(ctx, r1.Lease, time.Minute); err != nil || ok {
		t.Fatalf("extending an expired lease: got %v, %v; want false", ok, err)
	}
}

func TestBucketConfigValidation(t *testing.T) {
	p := New(srv.Client(t), Config{})
	for _, tc := range []struct {
		name string
		cfg  BucketConfig
		want string
	}{
		{"ok", BucketConfig{Limits: []Limit{PerSecond(1)}}, ""},
		{"a{b}", BucketConfig{Limits: []Limit{PerSecond(1)}}, "without braces"},
		{"", BucketConfig{Limits: []Limit{PerSecond(1)}}, "without braces"},
		{"none", BucketConfig{}, "at least one limit"},
		{"zero", BucketConfig{Limits: []Limit{PerSecond(0)}}, "rate 0"},
		{"dup", BucketConfig{Limits: []Limit{PerSecond(5), PerSecond(6)}}, "two limits count requests"},
		{"guard", BucketConfig{Limits: []Limit{PerSecond(5)}, Guard: -1}, "guard"},
		{"conc", BucketConfig{Limits: []Limit{PerSecond(5)}, Concurrency: -1}, "concurrency"},
		{"burst", BucketConfig{Limits: []Limit{{Rate: 5, Per: time.Second, Burst: 6}}}, "burst 6"},
		{"cost", BucketConfig{Limits: []Limit{{Rate: 5, Per: time.Second, Cost: "Tokens"}}}, "lowercase"},
	} {
		_, err := p.Bucket(tc.name, tc.cfg)
		if tc.want == "" && err != nil {
			t.Errorf("%s: got %v, want no error", tc.name, err)
		}
		if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

func TestTakeWaitsForTheSlot(t *testing.T) {
	ctx := context.Background()
	b := newBucket(t, srv.Client(t), nil, BucketConfig{Limits: []Limit{PerSecond(50)}, Concurrency: 1})
	var slots []time.Time
	for i := 0; i < 5; i++ {
		r, err := b.Take(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		// Not a timing assertion: a send before its slot would break the limit.
		if now := time.Now(); now.Before(r.SendAt()) {
			t.Fatalf("Take returned at %v, before the slot at %v", now, r.SendAt())
		}
		slots = append(slots, r.Now.Add(r.Delay))
		if err := b.Release(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i < len(slots); i++ {
		if gap := slots[i].Sub(slots[i-1]); gap < 20*time.Millisecond {
			t.Fatalf("slots %d and %d were %v apart, closer than the 20ms spacing", i-1, i, gap)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := b.Take(cctx, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Take: got %v, want context.Canceled", err)
	}
}

func TestWaitGivesBackOnCancel(t *testing.T) {
	ctx := context.Background()
	b := newBucket(t, srv.Client(t), nil, BucketConfig{Limits: []Limit{PerSecond(2)}, Guard: time.Millisecond})
	if r, err := b.Reserve(ctx, nil); err != nil || !r.OK {
		t.Fatalf("setup: got %+v, %v", r, err)
	}
	r2, err := b.Reserve(ctx, nil)
	if err != nil || !r2.OK || r2.Delay < 400*time.Millisecond {
		t.Fatalf("setup: got %+v, %v", r2, err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if err := r2.Wait(cctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want DeadlineExceeded", err)
	}
	st, err := b.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Only r1's slot remains booked: about 500ms from its reservation.
	if st.Booked[0] > 501*time.Millisecond {
		t.Fatalf("booked %v after giving r2 back, want at most r1's 500.5ms", st.Booked[0])
	}
}

// RedisAddrForExamples lets the examples in package leaky_test reach the test server.
func RedisAddrForExamples() string { return srv.Addr }
