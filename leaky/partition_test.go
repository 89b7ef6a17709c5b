package leaky

import (
	"context"
	"testing"
	"time"
)

// TestReserveInPartition: ReserveIn books the bucket and the partition's
// limits at one slot; a partition that cannot send yet books nothing and
// says when it can, another partition is not held; Cancel gives the
// partition's share back too. On the test clock, no sleeps.
func TestReserveInPartition(t *testing.T) {
	ctx := context.Background()
	clock := newFrozenClock()
	b := newBucket(t, srv.Client(t), clock.Now, BucketConfig{Limits: []Limit{PerSecond(100)}, Guard: time.Millisecond})
	part := []Limit{{Rate: 1, Per: 10 * time.Second}}
	r1, err := b.ReserveIn(ctx, nil, "a", part, MaxWait(time.Second))
	if err != nil || !r1.OK || r1.Delay != 0 {
		t.Fatalf("first of a: got %+v %v, want a slot now", r1, err)
	}
	r2, err := b.ReserveIn(ctx, nil, "a", part, MaxWait(time.Minute))
	if err != nil || r2.OK || r2.Reason != ReasonPartition || r2.RetryAfter < 9*time.Second || r2.RetryAfter > 11*time.Second {
		t.Fatalf("second of a: got %+v %v, want refused by the partition for about 10s", r2, err)
	}
	r3, err := b.ReserveIn(ctx, nil, "b", part, MaxWait(time.Second))
	if err != nil || !r3.OK || r3.Delay <= 0 || r3.Delay > 20*time.Millisecond {
		t.Fatalf("b: got %+v %v, want the bucket's next slot, about 10ms on", r3, err)
	}
	// The bucket counted both: a plain reservation comes after them.
	r4, err := b.Reserve(ctx, nil)
	if err != nil || !r4.OK || r4.Delay <= r3.Delay {
		t.Fatalf("plain after both: got %+v %v, want a slot after b's %v", r4, err, r3.Delay)
	}
	if _, err := b.Cancel(ctx, r4); err != nil {
		t.Fatal(err)
	}
	// b's slot given back (it is the latest): b can book again at once,
	// with the bucket's same slot.
	if n, err := b.Cancel(ctx, r3); err != nil || n != 2 {
		t.Fatalf("cancel b: got %d restored, %v; want 2 (the bucket's limit and b's)", n, err)
	}
	r5, err := b.ReserveIn(ctx, nil, "b", part, MaxWait(time.Second))
	if err != nil || !r5.OK || r5.Delay != r3.Delay {
		t.Fatalf("b again: got %+v %v, want b's given-back slot at %v", r5, err, r3.Delay)
	}
	// Without a partition or its limits, ReserveIn is Reserve.
	r6, err := b.ReserveIn(ctx, nil, "", part)
	if err != nil || !r6.OK {
		t.Fatalf("no partition: got %+v %v, want a slot", r6, err)
	}
}

// TestReserveInCostsAndConcurrency: a partition's cost limit counts the
// reservation's cost, and a full concurrency cap refuses with its reason.
func TestReserveInCostsAndConcurrency(t *testing.T) {
	ctx := context.Background()
	clock := newFrozenClock()
	b := newBucket(t, srv.Client(t), clock.Now, BucketConfig{
		Limits: []Limit{PerSecond(100), {Rate: 1000, Per: time.Second, Cost: "tokens", Burst: 1000}}, Concurrency: 1})
	part := []Limit{{Rate: 100, Per: time.Minute, Cost: "tokens", Burst: 100}}
	r1, err := b.ReserveIn(ctx, Costs{"tokens": 60}, "a", part)
	if err != nil || !r1.OK || r1.Lease == "" {
		t.Fatalf("60 tokens: got %+v %v, want a slot with a lease", r1, err)
	}
	r2, err := b.ReserveIn(ctx, Costs{"tokens": 10}, "z", part, MaxWait(time.Second))
	if err != nil || r2.OK || r2.Reason != ReasonConcurrency {
		t.Fatalf("with the one lease held: got %+v %v, want refused for concurrency", r2, err)
	}
	if err := b.Release(ctx, r1); err != nil {
		t.Fatal(err)
	}
	r3, err := b.ReserveIn(ctx, Costs{"tokens": 60}, "a", part, MaxWait(time.Minute))
	if err != nil || r3.OK || r3.Reason != ReasonPartition {
		t.Fatalf("60 more tokens in a: got %+v %v, want refused by a's token limit", r3, err)
	}
	r4, err := b.ReserveIn(ctx, Costs{"tokens": 40}, "a", part, MaxWait(time.Minute))
	if err != nil || !r4.OK {
		t.Fatalf("40 more tokens in a: got %+v %v, want a slot", r4, err)
	}
}
