package leaky

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestStrictSlack: which limits are spaced strictly, and with what slack:
// capacity 1 and a slack (guard/Rate) of at least 200µs.
func TestStrictSlack(t *testing.T) {
	for _, tc := range []struct {
		limits []Limit
		guard  time.Duration
		want   time.Duration
	}{
		{[]Limit{PerSecond(50)}, 0, 400 * time.Microsecond},
		{[]Limit{PerSecond(100)}, 0, 200 * time.Microsecond},
		{[]Limit{PerSecond(30)}, 0, 666666 * time.Nanosecond},
		// Over 100 per second at the default guard: the slack is too small
		// to keep sends within.
		{[]Limit{PerSecond(101)}, 0, 0},
		{[]Limit{PerSecond(2000)}, 0, 0},
		{[]Limit{PerSecond(200)}, 100 * time.Millisecond, 500 * time.Microsecond},
		{[]Limit{{Rate: 50, Per: time.Second, Burst: 1}}, 0, 400 * time.Microsecond},
		{[]Limit{{Rate: 50, Per: time.Second, Burst: 5}}, 0, 0},
		{[]Limit{{Rate: 6000, Per: time.Minute, Cost: "tokens"}}, 0, 0},
		// The least slack among the strict limits.
		{[]Limit{PerSecond(20), PerMinute(50), {Rate: 1000, Per: time.Second, Cost: "tokens"}}, 0, 400 * time.Microsecond},
	} {
		t.Run(fmt.Sprint(tc.limits, tc.guard), func(t *testing.T) {
			b := newBucket(t, srv.Client(t), nil, BucketConfig{Limits: tc.limits, Guard: tc.guard})
			if got := b.strictSlack(); got != tc.want {
				t.Errorf("got slack %v, want %v", got, tc.want)
			}
		})
	}
}

// TestStrictLateness: a strict limit's send may be late by its slack, or
// 1ms past SendAt if that is later, never more than half the guard; other
// limits keep half the guard.
func TestStrictLateness(t *testing.T) {
	for _, tc := range []struct {
		limit       Limit
		guard       time.Duration
		uncertainty time.Duration // SendAt − earliest
		want        time.Duration
	}{
		{PerSecond(50), 0, 0, time.Millisecond},
		{PerSecond(50), 0, 300 * time.Microsecond, 1300 * time.Microsecond},
		{PerSecond(5), 0, 100 * time.Microsecond, 4 * time.Millisecond},
		{PerSecond(1), 0, 100 * time.Microsecond, 10 * time.Millisecond},
		// Never more than half the guard.
		{PerSecond(2), time.Millisecond, 0, 500 * time.Microsecond},
		{PerSecond(200), 0, 0, 10 * time.Millisecond},
		{Limit{Rate: 50, Per: time.Second, Burst: 10}, 0, 0, 10 * time.Millisecond},
	} {
		t.Run(fmt.Sprint(tc.limit, tc.guard, tc.uncertainty), func(t *testing.T) {
			b := newBucket(t, srv.Client(t), nil, BucketConfig{Limits: []Limit{tc.limit}, Guard: tc.guard})
			now := time.Now()
			r := &Reservation{OK: true, bucket: b, sendAt: now, earliest: now.Add(-tc.uncertainty)}
			if got := r.lateness(); got != tc.want {
				t.Errorf("got lateness %v, want %v", got, tc.want)
			}
		})
	}
}

// TestStrictWaitSkipsLateSlot: waking 5ms after the slot spends a strictly
// spaced slot (it would arrive within 1/Rate of the next send) but not one
// of a limit with a burst, which only windows constrain.
func TestStrictWaitSkipsLateSlot(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		cfg  BucketConfig
		want error
	}{
		{BucketConfig{Limits: []Limit{PerSecond(50)}}, ErrLate},
		{BucketConfig{Limits: []Limit{{Rate: 50, Per: time.Second, Burst: 5}}, Guard: 200 * time.Millisecond}, nil},
	} {
		t.Run(tc.cfg.Limits[0].String(), func(t *testing.T) {
			b := newBucket(t, srv.Client(t), nil, tc.cfg)
			r, err := b.Reserve(ctx, nil)
			if err != nil || !r.OK {
				t.Fatalf("reserve: %+v, %v", r, err)
			}
			time.Sleep(time.Until(r.SendAt()) + 5*time.Millisecond)
			if err := r.Wait(ctx); !errors.Is(err, tc.want) {
				t.Errorf("Wait 5ms after the slot: got %v, want %v", err, tc.want)
			}
		})
	}
}

// TestSleepUntilNeverEarly: the precise wake never returns before its
// instant, and gives up when the context ends.
func TestSleepUntilNeverEarly(t *testing.T) {
	for i := 0; i < 20; i++ {
		at := time.Now().Add(time.Duration(i) * 300 * time.Microsecond)
		if err := sleepUntil(context.Background(), at, strictSpin); err != nil {
			t.Fatal(err)
		}
		if now := time.Now(); now.Before(at) {
			t.Fatalf("woke %v early", at.Sub(now))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	if err := sleepUntil(ctx, time.Now().Add(time.Hour), strictSpin); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %v, want the context's deadline", err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel2()
	if err := sleepUntil(ctx2, time.Now().Add(time.Second+strictSpin/2), time.Second+strictSpin); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("while spinning: got %v, want the context's deadline", err)
	}
}
