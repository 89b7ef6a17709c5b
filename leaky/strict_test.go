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
			if got := b.cur().strictSlack(); got != tc.want {
				t.Errorf("got slack %v, want %v", got, tc.want)
			}
		})
	}
}

// TestLatenessIsHalfTheGuard: however a limit is spaced, a send may leave
// up to half the guard after its slot, and Wait spends a slot woken later
// than that.
func TestLatenessIsHalfTheGuard(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		cfg  BucketConfig
		late time.Duration
		want error
	}{
		{BucketConfig{Limits: []Limit{PerSecond(50)}}, 5 * time.Millisecond, nil},
		{BucketConfig{Limits: []Limit{PerSecond(50)}}, 15 * time.Millisecond, ErrLate},
		{BucketConfig{Limits: []Limit{{Rate: 50, Per: time.Second, Burst: 5}}}, 15 * time.Millisecond, ErrLate},
		{BucketConfig{Limits: []Limit{PerSecond(2000)}, Guard: 2 * time.Millisecond}, 5 * time.Millisecond, ErrLate},
	} {
		t.Run(fmt.Sprint(tc.cfg.Limits[0], tc.late), func(t *testing.T) {
			b := newBucket(t, srv.Client(t), nil, tc.cfg)
			// A wake meant to come in time that the host itself made
			// later than the allowance (a sleep overshooting by several
			// ms, as under -race on a busy host) tests nothing: try
			// again, a few times.
			for try := 1; ; try++ {
				r, err := b.Reserve(ctx, nil)
				if err != nil || !r.OK {
					t.Fatalf("reserve: %+v, %v", r, err)
				}
				if got, want := r.lateness(), b.Config().Guard/2; got != want {
					t.Errorf("got lateness %v, want half the guard %v", got, want)
				}
				time.Sleep(time.Until(r.SendAt()) + tc.late)
				hostLate := tc.want == nil && r.TooLate()
				err = r.Wait(ctx)
				if hostLate && try < 5 {
					t.Logf("try %d: woke %v past the slot, over the allowance by the host's doing; again", try, r.Late())
					continue
				}
				if !errors.Is(err, tc.want) {
					t.Errorf("Wait %v after the slot: got %v, want %v (woke %v late)", tc.late, err, tc.want, r.Late())
				}
				break
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
