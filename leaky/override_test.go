package leaky

import (
	"context"
	"slices"
	"testing"
	"time"
)

// replica is one process pacing a shared bucket, which applies an
// operator's change when the test says it heard of it.
type replica struct {
	b     *Bucket
	heard time.Time // when it applies the change; zero: at once
}

// changeOver drives replicas that reserve greedily (as many slots as fit
// in MaxWait) every 5ms of a frozen clock for run, with an operator's
// change to next at change (reset to the configured limits when next is
// nil), each replica applying it when it hears. It returns every booked
// slot, in order, and the change's time on the scripts' clock.
func changeOver(t *testing.T, configured []Limit, next []Limit, hear []time.Duration, change, run time.Duration) ([]time.Time, time.Time) {
	t.Helper()
	ctx := context.Background()
	clock := newFrozenClock()
	rdb := srv.Client(t)
	name := uniqueName(t)
	cfg := BucketConfig{Limits: configured, Guard: 10 * time.Millisecond, MaxWait: 250 * time.Millisecond}
	var reps []*replica
	for range hear {
		b, err := New(rdb, Config{Now: clock.Now}).Bucket(name, cfg)
		if err != nil {
			t.Fatal(err)
		}
		reps = append(reps, &replica{b: b})
	}
	start := clock.Now()
	var slots []time.Time
	var at time.Time
	var o Override
	for el := time.Duration(0); el < run; el += 5 * time.Millisecond {
		now := clock.Now()
		if at.IsZero() && el >= change {
			var err error
			if next == nil {
				o, err = reps[0].b.ResetLimits(ctx)
			} else {
				o, err = reps[0].b.PutLimits(ctx, next)
			}
			if err != nil {
				t.Fatal(err)
			}
			at = o.At
			for i, r := range reps {
				r.heard = at.Add(hear[i])
			}
		}
		for _, r := range reps {
			if !at.IsZero() && !now.Before(r.heard) {
				// Applied on every step once heard, as Follow does on
				// every tick: a draining phase ends.
				if _, _, err := r.b.Apply(o, now); err != nil {
					t.Fatal(err)
				}
			}
			for {
				res, err := r.b.Reserve(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				if !res.OK {
					break
				}
				slots = append(slots, res.Now.Add(res.Delay))
			}
		}
		clock.Advance(5 * time.Millisecond)
	}
	slices.SortFunc(slots, func(a, c time.Time) int { return a.Compare(c) })
	if len(slots) == 0 || slots[0].Before(start) {
		t.Fatalf("no slots booked, or one before the start")
	}
	return slots, at
}

// busiest is the most slots in any window of length per that starts at
// or after from and before to (windows start at a slot: the busiest do).
func busiest(slots []time.Time, per time.Duration, from, to time.Time) int {
	most := 0
	for i, s := range slots {
		if s.Before(from) || !s.Before(to) {
			continue
		}
		n := 0
		for _, u := range slots[i:] {
			if !u.Before(s.Add(per)) {
				break
			}
			n++
		}
		most = max(most, n)
	}
	return most
}

// count is the slots in [from, to).
func count(slots []time.Time, from, to time.Time) int {
	n := 0
	for _, s := range slots {
		if !s.Before(from) && s.Before(to) {
			n++
		}
	}
	return n
}

// TestChangeOverIsStrict holds a change of limits to its promise, with
// two replicas of which one hears of the change late, or never (as one
// that lost the announcement would until its next look): while slots
// booked under the old limits drain no window holds more than they allow,
// nor more than the new ones allow from MaxWait after the change (so from
// one Per after it, for any Per of at least MaxWait), since the scripts
// book nothing under the old limits once the change is written, whether
// a replica has heard or not; and the bucket then drains at the new rate.
func TestChangeOverIsStrict(t *testing.T) {
	const change, run = 2 * time.Second, 8 * time.Second
	const never = time.Hour
	settle := 250 * time.Millisecond // the replicas' MaxWait
	for _, tc := range []struct {
		name     string
		old, new []Limit
		hear     []time.Duration
	}{
		{"lower", []Limit{PerSecond(40)}, []Limit{PerSecond(10)}, []time.Duration{0, 600 * time.Millisecond}},
		{"higher", []Limit{PerSecond(10)}, []Limit{PerSecond(40)}, []time.Duration{0, 600 * time.Millisecond}},
		{"lower, one never hears", []Limit{PerSecond(40)}, []Limit{PerSecond(10)}, []time.Duration{never, 0}},
		{"higher, one never hears", []Limit{PerSecond(10)}, []Limit{PerSecond(40)}, []time.Duration{0, never}},
		{"lower, none hears", []Limit{{Rate: 40, Per: time.Second, Burst: 10}}, []Limit{PerSecond(10)}, []time.Duration{never, never}},
		{"lower, bursts", []Limit{{Rate: 40, Per: time.Second, Burst: 10}}, []Limit{{Rate: 12, Per: time.Second, Burst: 4}}, []time.Duration{0, 900 * time.Millisecond}},
		{"higher, bursts", []Limit{{Rate: 12, Per: time.Second, Burst: 4}}, []Limit{{Rate: 40, Per: time.Second, Burst: 10}}, []time.Duration{300 * time.Millisecond, 0}},
		// A new window: the old limit's state is under another id.
		{"per minute to per second", []Limit{{Rate: 600, Per: time.Minute}}, []Limit{PerSecond(4)}, []time.Duration{0, 500 * time.Millisecond}},
		{"per second to per 2s", []Limit{PerSecond(5)}, []Limit{{Rate: 30, Per: 2 * time.Second}}, []time.Duration{0, 0}},
		{"back to the config", []Limit{PerSecond(30)}, nil, []time.Duration{0, 400 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old, next := tc.old, tc.new
			if tc.new == nil {
				// First put an override in force, then reset it.
				old, next = []Limit{PerSecond(8)}, tc.old
			}
			var slots []time.Time
			var at time.Time
			if tc.new == nil {
				slots, at = resetOver(t, tc.old, old, tc.hear, change, run)
			} else {
				slots, at = changeOver(t, old, next, tc.hear, change, run)
			}
			oldL, newL := old[0], next[0]
			start := slots[0]
			// Before the change and while its old bookings drain: the old
			// limit, over its window.
			if got := busiest(slots, oldL.Per, start, at.Add(settle)); got > int(oldL.Rate) {
				t.Errorf("a window of %v from before the change until %v after it holds %d, over the old limit %v", oldL.Per, settle, got, oldL)
			}
			// From settle after the change: the new limit, over its window.
			if got := busiest(slots, newL.Per, at.Add(settle), slots[len(slots)-1].Add(time.Nanosecond)); got > int(newL.Rate) {
				t.Errorf("a window of %v from %v after the change holds %d, over the new limit %v", newL.Per, settle, got, newL)
			}
			// And it drains at the new rate (what a backlog drains at under
			// the guard) once the old has drained: MaxWait, the old window
			// and the guard after the change, judged on the scripts' clock.
			from := at.Add(250*time.Millisecond + oldL.Per + 10*time.Millisecond)
			to := start.Add(run - newL.Per)
			want := newL.SustainedRate(10*time.Millisecond) * to.Sub(from).Seconds() / newL.Per.Seconds()
			if got := float64(count(slots, from, to)); got < 0.9*want-float64(newL.Capacity()) {
				t.Errorf("from %v to %v after the change: got %v slots, want about %.0f at the new limit %v", from.Sub(at), to.Sub(at), got, want, newL)
			}
		})
	}
}

// resetOver puts override in force long before, then resets to the
// configured limits at change.
func resetOver(t *testing.T, configured, override []Limit, hear []time.Duration, change, run time.Duration) ([]time.Time, time.Time) {
	t.Helper()
	// The override was put in place and applied before the run: the
	// buckets start under it, as replicas would after hearing of it.
	ctx := context.Background()
	clock := newFrozenClock()
	rdb := srv.Client(t)
	name := uniqueName(t)
	cfg := BucketConfig{Limits: configured, Guard: 10 * time.Millisecond, MaxWait: 250 * time.Millisecond}
	var reps []*replica
	for range hear {
		b, err := New(rdb, Config{Now: clock.Now}).Bucket(name, cfg)
		if err != nil {
			t.Fatal(err)
		}
		reps = append(reps, &replica{b: b})
	}
	o, err := reps[0].b.PutLimits(ctx, override)
	if err != nil {
		t.Fatal(err)
	}
	// Long past the put's drain.
	clock.Advance(time.Minute)
	for _, r := range reps {
		if _, _, err := r.b.Apply(o, clock.Now()); err != nil {
			t.Fatal(err)
		}
		if got := r.b.Config().Generation; got != 1 {
			t.Fatalf("after the put: got generation %d, want 1", got)
		}
	}
	var slots []time.Time
	var at time.Time
	for el := time.Duration(0); el < run; el += 5 * time.Millisecond {
		now := clock.Now()
		if at.IsZero() && el >= change {
			if o, err = reps[0].b.ResetLimits(ctx); err != nil {
				t.Fatal(err)
			}
			at = o.At
			for i, r := range reps {
				r.heard = at.Add(hear[i])
			}
		}
		for _, r := range reps {
			if !at.IsZero() && !now.Before(r.heard) {
				if _, _, err := r.b.Apply(o, now); err != nil {
					t.Fatal(err)
				}
			}
			for {
				res, err := r.b.Reserve(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				if !res.OK {
					break
				}
				slots = append(slots, res.Now.Add(res.Delay))
			}
		}
		clock.Advance(5 * time.Millisecond)
	}
	slices.SortFunc(slots, func(a, c time.Time) int { return a.Compare(c) })
	for _, r := range reps {
		if got := r.b.Config().Generation; got != 0 {
			t.Errorf("after the reset: got generation %d, want 0 (the configured limits' state)", got)
		}
	}
	return slots, at
}

// TestChangeOverWithoutDrainingBursts shows what the draining phase is
// for: a replica that paced the new limits alone, from their empty state,
// would let a burst out on top of the slots booked under the old ones.
func TestChangeOverWithoutDrainingBursts(t *testing.T) {
	ctx := context.Background()
	clock := newFrozenClock()
	old := []Limit{{Rate: 12, Per: time.Second, Burst: 4}}
	b := newBucket(t, srv.Client(t), clock.Now, BucketConfig{Limits: old, Guard: 10 * time.Millisecond, MaxWait: 250 * time.Millisecond})
	reserveAll := func() int {
		n := 0
		for {
			r, err := b.Reserve(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !r.OK {
				return n
			}
			n++
		}
	}
	reserveAll()
	o, err := b.PutLimits(ctx, []Limit{{Rate: 40, Per: time.Second, Burst: 10}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Apply(o, clock.Now()); err != nil {
		t.Fatal(err)
	}
	if got := reserveAll(); got != 0 {
		t.Errorf("with the old limit draining: got %d more slots at once, want none (its bucket is full)", got)
	}
	if err := b.SetLimits(o.Limits, o.Generation(), nil); err != nil {
		t.Fatal(err)
	}
	if got := reserveAll(); got == 0 {
		t.Errorf("without the old limit: got no more slots, want the new limit's burst (else this test shows nothing)")
	}
}

func TestOverrideRecord(t *testing.T) {
	ctx := context.Background()
	clock := newFrozenClock()
	conf := []Limit{PerSecond(10)}
	b := newBucket(t, srv.Client(t), clock.Now, BucketConfig{Limits: conf})
	o, err := b.ReadOverride(ctx)
	if err != nil || o.Changes != 0 || o.Limits != nil {
		t.Fatalf("before any change: got %+v, %v; want none", o, err)
	}
	if o, err = b.ResetLimits(ctx); err != nil || o.Changes != 0 {
		t.Fatalf("reset with nothing set: got %+v, %v; want no change", o, err)
	}
	if _, err := b.PutLimits(ctx, []Limit{{Rate: 0, Per: time.Second}}); err == nil {
		t.Fatal("put rate 0: got no error")
	}
	if _, err := b.PutLimits(ctx, []Limit{PerSecond(5), PerSecond(6)}); err == nil {
		t.Fatal("put two limits on requests per second: got no error")
	}
	set := []Limit{PerSecond(5), {Rate: 100, Per: time.Minute, Cost: "tokens", Burst: 20}, {Rate: 50, Per: time.Hour, Adaptive: true}}
	if o, err = b.PutLimits(ctx, set); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.Limits, set) || o.Changes != 1 || o.Generation() != 1 || len(o.Earlier) != 1 {
		t.Fatalf("after a put: got %+v, want the limits, change 1 and the configured phase replaced", o)
	}
	if ph := o.Earlier[0]; ph.Generation != 0 || !slices.Equal(ph.Limits, conf) || !ph.Ended.Equal(o.At) {
		t.Errorf("replaced phase: got %+v, want the configured limits, generation 0, ended at %v", ph, o.At)
	}
	clock.Advance(time.Second)
	if o, err = b.ResetLimits(ctx); err != nil {
		t.Fatal(err)
	}
	if o.Limits != nil || o.Changes != 2 || o.Generation() != 0 || len(o.Earlier) != 2 || o.Earlier[0].Generation != 1 {
		t.Fatalf("after a reset: got %+v, want the configured limits in force and both earlier phases", o)
	}
	// A stale change loses to the one that came first.
	v, err := srv.Client(t).HGet(ctx, b.opKey(), "n").Result()
	if err != nil || v != "2" {
		t.Fatalf("got n %q, %v", v, err)
	}
	if ttl := srv.Client(t).TTL(ctx, b.opKey()).Val(); ttl != -1 {
		t.Errorf("override record: got TTL %v, want none (an operator's setting is configuration)", ttl)
	}
}

func TestPartitionOverrideRecord(t *testing.T) {
	ctx := context.Background()
	b := newBucket(t, srv.Client(t), nil, BucketConfig{Limits: []Limit{PerSecond(10)}})
	ls := []Limit{{Rate: 3, Per: time.Second}, {Rate: 1000, Per: time.Minute, Cost: "tokens", Burst: 100}}
	if err := b.PutPartitionLimits(ctx, "gmail.com", ls); err != nil {
		t.Fatal(err)
	}
	got, ok, err := b.ReadPartitionLimits(ctx, "gmail.com")
	if err != nil || !ok || !slices.Equal(got, ls) {
		t.Fatalf("got %+v %v %v, want %+v", got, ok, err, ls)
	}
	o, err := b.ReadOverride(ctx)
	if err != nil || o.Partitions != 1 {
		t.Fatalf("got %d partitions, %v; want 1", o.Partitions, err)
	}
	if ch, _, err := b.Apply(o, time.Now()); err != nil || !ch {
		t.Fatalf("apply: got changed %v, %v; want the bucket to look overrides up", ch, err)
	}
	if args := b.BookingArgs(time.Second); args[3] != b.povKey() {
		t.Errorf("booking args: got overrides hash %v, want %s", args[3], b.povKey())
	}
	if err := b.ResetPartitionLimits(ctx, "gmail.com"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := b.ReadPartitionLimits(ctx, "gmail.com"); ok || err != nil {
		t.Fatalf("after reset: got %v, %v; want none", ok, err)
	}
	if o, _ = b.ReadOverride(ctx); o.Partitions != 0 {
		t.Errorf("after reset: got %d partitions, want 0", o.Partitions)
	}
}

// TestFollowAppliesChanges: a process following the overrides paces at an
// operator's change at once when it is announced, and within ApplyWithin
// when the announcement was lost.
func TestFollowAppliesChanges(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rdb := srv.Client(t)
	name := uniqueName(t)
	cfg := BucketConfig{Limits: []Limit{PerSecond(10)}}
	setter, err := New(rdb, Config{}).Bucket(name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := New(rdb, Config{})
	follower, err := p.Bucket(name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	changes := make(chan struct{}, 10)
	done := make(chan error, 1)
	go func() { done <- p.Follow(ctx, []*Bucket{follower}, func(*Bucket) { changes <- struct{}{} }) }()
	waitFor := func(what string, within time.Duration, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(within)
		for !ok() {
			select {
			case <-changes:
			case <-time.After(10 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v", what, within)
			}
		}
	}
	// Follow subscribes before it first reads; give it the time to.
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	if _, err := setter.PutLimits(ctx, []Limit{PerSecond(3)}); err != nil {
		t.Fatal(err)
	}
	waitFor("announced change", ApplyWithin/4, func() bool { return slices.Equal(follower.Config().Limits, []Limit{PerSecond(3)}) })
	t.Logf("announced change applied in %v", time.Since(start).Round(time.Millisecond))
	// A change whose announcement was lost: the record written as the
	// script would, without PUBLISH, and the count bumped.
	if err := rdb.HSet(ctx, setter.opKey(), "lim", encodeLimits([]Limit{PerSecond(7)}), "n", 2).Err(); err != nil {
		t.Fatal(err)
	}
	if err := setter.bumpChanges(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor("unannounced change", ApplyWithin+200*time.Millisecond, func() bool {
		return slices.Equal(follower.Config().Limits, []Limit{PerSecond(7)}) && follower.Config().Generation == 2
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
