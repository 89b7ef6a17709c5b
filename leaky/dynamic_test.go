package leaky

import (
	"context"
	"math"
	"testing"
	"time"
)

// spacing books two reservations back to back and returns the time
// between their slots.
func spacing(t *testing.T, b *Bucket, costs Costs) time.Duration {
	t.Helper()
	ctx := context.Background()
	var slots [2]time.Time
	for i := range slots {
		r, err := b.Reserve(ctx, costs, MaxWait(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if !r.OK {
			t.Fatalf("reservation refused: %+v", r)
		}
		slots[i] = r.Now.Add(r.Delay)
	}
	return slots[1].Sub(slots[0])
}

func TestLearnedLimitCapsTheConfiguredOne(t *testing.T) {
	clock := newFrozenClock()
	b := newBucket(t, srv.Client(t), clock.Now, BucketConfig{Limits: []Limit{PerSecond(100)}, Guard: 10 * time.Millisecond})
	ctx := context.Background()
	if got, want := spacing(t, b, nil), 10100*time.Microsecond; got != want {
		t.Fatalf("before: got spacing %v, want %v", got, want)
	}
	changed, err := b.Learn(ctx, []Limit{PerSecond(500), {Rate: 6000, Per: time.Minute}, PerSecond(40)})
	if err != nil || !changed {
		t.Fatalf("got changed %v, err %v; want a change", changed, err)
	}
	clock.Advance(time.Second)
	// 40/s with a 10ms guard: ⌈1.01s/40⌉ = 25250µs; 6000/min (100/s) is
	// kept too (the two lowest per second), 500/s is not.
	if got, want := spacing(t, b, nil), 25250*time.Microsecond; got != want {
		t.Errorf("stated 40/s: got spacing %v, want %v", got, want)
	}
	again, err := b.Learn(ctx, []Limit{{Rate: 6000, Per: time.Minute}, PerSecond(40)})
	if err != nil || again {
		t.Errorf("same stated limits again: got changed %v, err %v; want no change", again, err)
	}
	st, err := b.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Limits) != 3 {
		t.Fatalf("got limits %+v, want the configured one and two stated", st.Limits)
	}
	for i, want := range []LimitState{
		{Limit: PerSecond(100), Rate: 100, Source: SourceConfigured},
		{Limit: PerSecond(40), Rate: 40, Source: SourceStated},
		{Limit: Limit{Rate: 6000, Per: time.Minute}, Rate: 6000, Source: SourceStated},
	} {
		if st.Limits[i] != want {
			t.Errorf("limit %d: got %+v, want %+v", i, st.Limits[i], want)
		}
	}
	// A stated limit above the configured one changes nothing.
	if _, err := b.Learn(ctx, []Limit{PerSecond(500)}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	if got, want := spacing(t, b, nil), 10100*time.Microsecond; got != want {
		t.Errorf("stated 500/s: got spacing %v, want the configured %v", got, want)
	}
	if _, err := b.Learn(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if st, _ := b.State(ctx); len(st.Limits) != 1 {
		t.Errorf("after stating nothing: got limits %+v, want only the configured one", st.Limits)
	}
}

func TestFeedbackCutsAnAdaptiveLimitAndItClimbsBack(t *testing.T) {
	clock := newFrozenClock()
	adaptive := Limit{Rate: 100, Per: time.Second, Adaptive: true}
	b := newBucket(t, srv.Client(t), clock.Now, BucketConfig{Limits: []Limit{adaptive}, Guard: 10 * time.Millisecond})
	ctx := context.Background()
	cuts, err := b.Feedback(ctx, true)
	if err != nil || cuts != 1 {
		t.Fatalf("got %d cuts, err %v; want 1", cuts, err)
	}
	// Within the cooldown a second pushback says nothing new.
	clock.Advance(AdaptCooldown / 2)
	if cuts, _ := b.Feedback(ctx, true); cuts != 0 {
		t.Errorf("within the cooldown: got %d cuts, want 0", cuts)
	}
	if cuts, _ := b.Feedback(ctx, false); cuts != 0 {
		t.Errorf("a success: got %d cuts, want 0", cuts)
	}
	st, err := b.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rate := st.Limits[0].Rate
	want := 100 * AdaptCut * (1 + AdaptRise*(AdaptCooldown/2).Seconds()) // AdaptRise×0.85 > AdaptRiseMin
	if st.Limits[0].Source != SourceAdaptive || math.Abs(rate-want) > 0.01 {
		t.Errorf("got %+v, want adaptive at %.2f", st.Limits[0], want)
	}
	// The slots follow the rate: 10.1ms / ratio.
	gotSpacing := spacing(t, b, nil)
	wantSpacing := time.Duration(math.Ceil(10100/(rate/100))) * time.Microsecond
	if d := gotSpacing - wantSpacing; d < -2*time.Microsecond || d > 2*time.Microsecond {
		t.Errorf("got spacing %v, want %v", gotSpacing, wantSpacing)
	}
	// Cut after cut (each cooldown's climb cut again) it settles near, and
	// never below, one unit per Per.
	for i := 0; i < 60; i++ {
		clock.Advance(AdaptCooldown)
		if _, err := b.Feedback(ctx, true); err != nil {
			t.Fatal(err)
		}
	}
	st, _ = b.State(ctx)
	if r := st.Limits[0].Rate; r < 1 || r > 2 {
		t.Errorf("after many cuts: got rate %.3f, want between the floor of 1 and 2", r)
	}
	// Without pushback it climbs back to its ceiling.
	clock.Advance(10 * time.Minute)
	st, _ = b.State(ctx)
	if r := st.Limits[0].Rate; r != 100 {
		t.Errorf("ten quiet minutes later: got rate %.3f, want the ceiling 100", r)
	}
}

func TestFeedbackWithoutAdaptiveLimitsCostsNothing(t *testing.T) {
	b := newBucket(t, srv.Client(t), nil, BucketConfig{Limits: []Limit{PerSecond(100)}})
	if cuts, err := b.Feedback(context.Background(), true); cuts != 0 || err != nil {
		t.Errorf("got %d cuts, err %v; want none", cuts, err)
	}
}

func TestSettleGivesBackAndCharges(t *testing.T) {
	clock := newFrozenClock()
	tokens := Limit{Rate: 2000, Per: time.Second, Cost: "tokens", Burst: 500}
	b := newBucket(t, srv.Client(t), clock.Now, BucketConfig{Limits: []Limit{PerSecond(1000), tokens}, Guard: 10 * time.Millisecond})
	ctx := context.Background()
	iv := tokens.Params(10 * time.Millisecond).Interval
	book := func() time.Time {
		r, err := b.Reserve(ctx, Costs{"tokens": 400}, MaxWait(time.Minute))
		if err != nil || !r.OK {
			t.Fatalf("reserve: %+v, %v", r, err)
		}
		return r.Now.Add(r.Delay)
	}
	first := book()
	book()
	third := book()
	// Each of 400 tokens: the third waits for 400×3−500 tokens' worth.
	if got, want := third.Sub(first), time.Duration((3*400-500)*iv)*time.Microsecond; got != want {
		t.Fatalf("without settling: got third slot %v after the first, want %v", got, want)
	}
	// The three used 40 each: 3×360 tokens come back.
	for i := 0; i < 3; i++ {
		if err := b.Settle(ctx, "tokens", 400, 40, "", nil); err != nil {
			t.Fatal(err)
		}
	}
	st, _ := b.State(ctx)
	if got, want := st.Booked[1], time.Duration(120*iv)*time.Microsecond; got != want {
		t.Errorf("after giving back: got %v booked on tokens, want %v (the 120 used)", got, want)
	}
	// An overrun is charged: 1000 more than estimated books 1000 tokens more.
	if err := b.Settle(ctx, "tokens", 0, 1000, "", nil); err != nil {
		t.Fatal(err)
	}
	st, _ = b.State(ctx)
	if got, want := st.Booked[1], time.Duration(1120*iv)*time.Microsecond; got != want {
		t.Errorf("after an overrun of 1000: got %v booked, want %v", got, want)
	}
	// The request limit is not touched: booked to one interval past the
	// third slot.
	if got, want := st.Booked[0], third.Sub(first)+1010*time.Microsecond; got != want {
		t.Errorf("request limit: got %v booked, want %v", got, want)
	}
}

func TestSettleReachesThePartitionsLimits(t *testing.T) {
	clock := newFrozenClock()
	rdb := srv.Client(t)
	b := newBucket(t, rdb, clock.Now, BucketConfig{Limits: []Limit{PerSecond(1000)}, Guard: 10 * time.Millisecond})
	ctx := context.Background()
	pl := []Limit{{Rate: 600, Per: time.Second, Cost: "tokens", Burst: 200}}
	if err := b.Settle(ctx, "tokens", 0, 100, "acme", pl); err != nil {
		t.Fatal(err)
	}
	if n, err := rdb.Exists(ctx, b.PartitionTAT("acme", pl[0])).Result(); err != nil || n != 1 {
		t.Errorf("partition TAT: got exists %d, err %v; want it charged", n, err)
	}
}

func TestPushbackGrowsWhileRepeatedAndShrinksAfter(t *testing.T) {
	clock := newFrozenClock()
	b := newBucket(t, srv.Client(t), clock.Now, BucketConfig{Limits: []Limit{PerSecond(100)}})
	ctx := context.Background()
	base, ceiling, probe := 25*time.Millisecond, time.Second, 30*time.Millisecond
	push := func(sent time.Time) time.Duration {
		t.Helper()
		_, d, _, err := b.Pushback(ctx, base, ceiling, probe, "429", sent)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	var got []time.Duration
	for i := 0; i < 7; i++ {
		d := push(clock.Now())
		got = append(got, d)
		// The next refusal is of a request sent just after the block
		// ends, within the probe: the upstream still refuses.
		clock.Advance(d + probe/2)
	}
	want := []time.Duration{25, 50, 100, 200, 400, 800, 1000}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("pushbacks while repeated: got %v, want %v ms", got, want)
		}
	}
	// Sent 1.65s after the last block ended: past the probe (50ms: a
	// probe under twice base counts as twice base) the upstream took sends
	// again, so it halves to 500ms, and the 1.6s after the probe hold
	// quiet stretches of twice 500ms and twice 250ms: 125ms.
	clock.Advance(1650*time.Millisecond - probe/2)
	last := push(clock.Now())
	if last != 125*time.Millisecond {
		t.Errorf("after 1.65s of quiet: got %v, want 125ms", last)
	}
	// A refusal of a request sent while that pause held (by a replica
	// that had not heard of it yet) was in flight: nothing changes.
	clock.Advance(last / 2)
	if _, d, paused, _ := b.Pushback(ctx, base, ceiling, probe, "429", clock.Now()); d != last || paused {
		t.Errorf("a request sent during the pause: got pushback %v (paused %v), want %v unchanged", d, paused, last)
	}
	// A slow upstream: the refusal of a request sent just after the pause
	// ended comes back 3s later, and still counts as the upstream refusing
	// as soon as sending resumed.
	sent := clock.Now().Add(last/2 + time.Millisecond)
	clock.Advance(last/2 + 3*time.Second)
	if _, d, _, _ := b.Pushback(ctx, base, ceiling, probe, "429", sent); d != 2*last {
		t.Errorf("a refusal 3s after its request: got %v, want %v", d, 2*last)
	}
	// Sporadic refusals do not climb however long the last block was (a
	// strict meter refusing one send in thirty): from the ceiling,
	// refusals each 300ms after the block before ended come down to base
	// and stay there.
	last = 2 * last
	for i := 0; i < 5; i++ {
		clock.Advance(last + probe/2)
		last = push(clock.Now())
	}
	if last != ceiling {
		t.Fatalf("back at the ceiling: got %v", last)
	}
	var sporadic []time.Duration
	for i := 0; i < 6; i++ {
		clock.Advance(last + 300*time.Millisecond)
		last = push(clock.Now())
		sporadic = append(sporadic, last)
	}
	if last := sporadic[len(sporadic)-1]; last != base {
		t.Errorf("sporadic refusals 300ms after each block: got pushbacks %v, want them down to %v", sporadic, base)
	}
	for i := 1; i < len(sporadic); i++ {
		if sporadic[i] > sporadic[i-1] {
			t.Errorf("sporadic refusals: got pushbacks %v, want them never to grow", sporadic)
			break
		}
	}
	// An isolated one long after costs only the base.
	clock.Advance(time.Minute)
	sent = clock.Now()
	until, d, paused, _ := b.Pushback(ctx, base, ceiling, probe, "429", sent)
	if !paused {
		t.Error("an isolated refusal: got paused false, want true")
	}
	if d != base {
		t.Errorf("isolated: got %v, want %v", d, base)
	}
	st, _ := b.State(ctx)
	if !st.BlockedUntil.Equal(until) || st.BlockReason != "429" {
		t.Errorf("got block until %v (%q), want %v", st.BlockedUntil, st.BlockReason, until)
	}
	// Refusals of requests sent before that pushback began were already in
	// flight: however many come back, they neither grow nor renew it.
	clock.Advance(time.Millisecond)
	for i := 0; i < 5; i++ {
		u2, d2, p2, _ := b.Pushback(ctx, base, ceiling, probe, "429", sent.Add(-time.Millisecond))
		if d2 != base || !u2.Equal(until) || p2 {
			t.Fatalf("in-flight refusal %d: got pushback %v until %v, want %v until %v unchanged", i, d2, u2, base, until)
		}
	}
	if _, _, _, err := b.Pushback(ctx, 0, ceiling, probe, "x", time.Time{}); err == nil {
		t.Error("a zero base: got no error")
	}
}
