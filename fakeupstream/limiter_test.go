package fakeupstream

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// epoch is a start on a whole second, so fixed windows start at 0.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// step is one request to a limiter and what it should answer. For an
// admitted request the state is the one after taking it.
type step struct {
	at        time.Duration
	n         int64
	ok        bool
	tooLarge  bool
	retry     time.Duration
	remaining int64
	reset     time.Duration
}

const msec = time.Millisecond

// run feeds steps to l, taking what is admitted, and checks each answer;
// after a refusal it checks that asking again gives the same answer, i.e.
// that the refusal consumed nothing.
func run(t *testing.T, l limiter, steps []step) {
	t.Helper()
	for i, s := range steps {
		v := l.check("k", s.at, s.n)
		if v.ok {
			v = l.take("k", s.at, s.n)
			v.ok = true
		} else if again := l.check("k", s.at, s.n); again != v {
			t.Errorf("step %d: asking again gave %+v, want %+v", i, again, v)
		}
		got := step{s.at, s.n, v.ok, v.tooLarge, v.retryAfter, v.remaining, v.reset}
		if got != s {
			t.Errorf("step %d: got %+v,\n want %+v", i, got, s)
		}
	}
}

func TestSlidingLog(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit Limit
		steps []step
	}{
		{"requests", Limit{Rate: 3, Per: time.Second}, []step{
			{at: 0, n: 1, ok: true, remaining: 2, reset: 1000 * msec},
			{at: 100 * msec, n: 1, ok: true, remaining: 1, reset: 1000 * msec},
			{at: 200 * msec, n: 1, ok: true, remaining: 0, reset: 1000 * msec},
			// Full until the request at 0 leaves the window at 1000ms.
			{at: 300 * msec, n: 1, retry: 700 * msec, remaining: 0, reset: 900 * msec},
			{at: 999 * msec, n: 1, retry: 1 * msec, remaining: 0, reset: 201 * msec},
			// (0, 1000] no longer holds the request at 0.
			{at: 1000 * msec, n: 1, ok: true, remaining: 0, reset: 1000 * msec},
			{at: 1000 * msec, n: 1, retry: 100 * msec, remaining: 0, reset: 1000 * msec},
			{at: 5000 * msec, n: 1, ok: true, remaining: 2, reset: 1000 * msec},
		}},
		{"costs", Limit{Rate: 10, Per: time.Second}, []step{
			{at: 0, n: 6, ok: true, remaining: 4, reset: 1000 * msec},
			{at: 500 * msec, n: 5, retry: 500 * msec, remaining: 4, reset: 500 * msec},
			{at: 500 * msec, n: 4, ok: true, remaining: 0, reset: 1000 * msec},
			// The 6 at 0 left at 1000ms; the 4 at 500ms remain.
			{at: 1000 * msec, n: 6, ok: true, remaining: 0, reset: 1000 * msec},
			{at: 1000 * msec, n: 11, tooLarge: true, remaining: 0, reset: 1000 * msec},
			// Zero costs nothing and is always admitted.
			{at: 1000 * msec, n: 0, ok: true, remaining: 0, reset: 1000 * msec},
			// Needs 5 free: the 4 at 500 leave at 1500, the 6 at 1000 at 2000.
			{at: 1200 * msec, n: 5, retry: 800 * msec, remaining: 0, reset: 800 * msec},
		}},
		// A request that read the clock before one already counted: every
		// window containing it must have room, including those ending at
		// the later entries.
		{"late arrivals", Limit{Rate: 2, Per: time.Second}, []step{
			{at: 1000 * msec, n: 1, ok: true, remaining: 1, reset: 1000 * msec},
			{at: 500 * msec, n: 1, ok: true, remaining: 1, reset: 1500 * msec},
			// (−600, 400] is empty, but (0, 1000] would hold three.
			{at: 400 * msec, n: 1, retry: 1100 * msec, remaining: 2, reset: 1600 * msec},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run(t, newLimiter(SlidingLog, tc.limit, epoch), tc.steps)
		})
	}
}

func TestFixedWindow(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit Limit
		start time.Time
		steps []step
	}{
		// Four requests in 101ms against a limit of 2 per second: the
		// fixed window's known weakness, shown on purpose.
		{"twice the limit across a boundary", Limit{Rate: 2, Per: time.Second}, epoch, []step{
			{at: 900 * msec, n: 1, ok: true, remaining: 1, reset: 100 * msec},
			{at: 950 * msec, n: 1, ok: true, remaining: 0, reset: 50 * msec},
			{at: 990 * msec, n: 1, retry: 10 * msec, remaining: 0, reset: 10 * msec},
			{at: 1000 * msec, n: 1, ok: true, remaining: 1, reset: 1000 * msec},
			{at: 1001 * msec, n: 1, ok: true, remaining: 0, reset: 999 * msec},
			{at: 1002 * msec, n: 1, retry: 998 * msec, remaining: 0, reset: 998 * msec},
			// Late for the full previous slot, and the current one is full.
			{at: 999 * msec, n: 1, retry: 1001 * msec, remaining: 0, reset: 1 * msec},
			{at: 2500 * msec, n: 2, ok: true, remaining: 0, reset: 500 * msec},
			{at: 2500 * msec, n: 3, tooLarge: true, remaining: 0, reset: 500 * msec},
		}},
		{"late arrival counts in its own slot", Limit{Rate: 2, Per: time.Second}, epoch, []step{
			{at: 900 * msec, n: 1, ok: true, remaining: 1, reset: 100 * msec},
			{at: 1000 * msec, n: 1, ok: true, remaining: 1, reset: 1000 * msec},
			{at: 950 * msec, n: 1, ok: true, remaining: 0, reset: 50 * msec},
			{at: 960 * msec, n: 1, retry: 40 * msec, remaining: 0, reset: 40 * msec},
			{at: 1010 * msec, n: 1, ok: true, remaining: 0, reset: 990 * msec},
		}},
		// Slots follow the wall clock, not the server's start.
		{"aligned to the wall clock", Limit{Rate: 1, Per: time.Second}, epoch.Add(300 * msec), []step{
			{at: 0, n: 1, ok: true, remaining: 0, reset: 700 * msec},
			{at: 699 * msec, n: 1, retry: 1 * msec, remaining: 0, reset: 1 * msec},
			{at: 700 * msec, n: 1, ok: true, remaining: 0, reset: 1000 * msec},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run(t, newLimiter(FixedWindow, tc.limit, tc.start), tc.steps)
		})
	}
}

func TestTokenBucket(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit Limit
		steps []step
	}{
		{"burst then refill", Limit{Rate: 10, Per: time.Second, Burst: 3}, []step{
			{at: 0, n: 1, ok: true, remaining: 2, reset: 100 * msec},
			{at: 0, n: 1, ok: true, remaining: 1, reset: 200 * msec},
			{at: 0, n: 1, ok: true, remaining: 0, reset: 300 * msec},
			{at: 0, n: 1, retry: 100 * msec, remaining: 0, reset: 300 * msec},
			{at: 50 * msec, n: 1, retry: 50 * msec, remaining: 0, reset: 250 * msec},
			{at: 100 * msec, n: 1, ok: true, remaining: 0, reset: 300 * msec},
			// Idle long enough to be full again, and no fuller.
			{at: 1000 * msec, n: 1, ok: true, remaining: 2, reset: 100 * msec},
			{at: 1000 * msec, n: 4, tooLarge: true, remaining: 2, reset: 100 * msec},
			{at: 1000 * msec, n: 3, retry: 100 * msec, remaining: 2, reset: 100 * msec},
		}},
		{"burst defaults to rate", Limit{Rate: 2, Per: time.Minute}, []step{
			{at: 0, n: 2, ok: true, remaining: 0, reset: time.Minute},
			{at: 0, n: 1, retry: 30 * time.Second, remaining: 0, reset: time.Minute},
			// A request older than the last update gets no refill.
			{at: 30 * time.Second, n: 1, ok: true, remaining: 0, reset: time.Minute},
			{at: 10 * time.Second, n: 1, retry: 30 * time.Second, remaining: 0, reset: time.Minute},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run(t, newLimiter(TokenBucket, tc.limit, epoch), tc.steps)
		})
	}
}

// admission is one admitted request in a randomized run.
type admission struct {
	at time.Duration
	n  int64
}

// randomRun sends arrivals that are mostly in order, sometimes in bursts,
// sometimes late by up to skew, each of cost 1..maxCost, and returns what
// was admitted. For every in-order refusal it checks that the answer's
// retryAfter is exact: the same request fits then and not a moment sooner.
func randomRun(t *testing.T, alg Algorithm, l Limit, seed uint64, maxCost int64, skew time.Duration) []admission {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	lim := newLimiter(alg, l, epoch)
	var admitted []admission
	var latest time.Duration
	meanGap := l.Per / time.Duration(l.Rate) // arrive about as fast as allowed
	for i := 0; i < 20000; i++ {
		at := latest
		switch r := rng.IntN(10); {
		case r < 2: // a burst: same instant
		case r < 3 && skew > 0:
			at -= time.Duration(rng.Int64N(int64(skew)/1000+1)) * time.Microsecond
		default:
			at += time.Duration(rng.Int64N(2*int64(meanGap)/1000+1)) * time.Microsecond
		}
		at = max(at, 0)
		n := 1 + rng.Int64N(maxCost)
		v := lim.check("k", at, n)
		if v.ok {
			lim.take("k", at, n)
			admitted = append(admitted, admission{at, n})
		} else if at >= latest && !v.tooLarge {
			if !lim.check("k", at+v.retryAfter, n).ok {
				t.Fatalf("arrival %d at %v: not admitted after its retry-after %v", i, at, v.retryAfter)
			}
			if v.retryAfter > time.Microsecond && lim.check("k", at+v.retryAfter-time.Microsecond, n).ok {
				t.Fatalf("arrival %d at %v: admitted before its retry-after %v", i, at, v.retryAfter)
			}
		}
		latest = max(latest, at)
	}
	slices.SortStableFunc(admitted, func(a, b admission) int { return int(a.at - b.at) })
	return admitted
}

// TestSlidingLogNeverExceedsRate: over long randomized runs, with late
// arrivals, no window (t−Per, t] ever holds more than Rate units, and an
// in-order request is refused only when it would not fit.
func TestSlidingLogNeverExceedsRate(t *testing.T) {
	for _, tc := range []struct {
		limit   Limit
		maxCost int64
	}{
		{Limit{Rate: 1, Per: time.Second}, 1},
		{Limit{Rate: 7, Per: 100 * msec}, 1},
		{Limit{Rate: 50, Per: time.Second}, 1},
		{Limit{Rate: 100, Per: time.Minute}, 9},
	} {
		t.Run(fmt.Sprintf("%v cost ≤ %d", tc.limit, tc.maxCost), func(t *testing.T) {
			adm := randomRun(t, SlidingLog, tc.limit, 42, tc.maxCost, 3*msec)
			if len(adm) < 100 {
				t.Fatalf("admitted only %d: the run does not exercise the limit", len(adm))
			}
			sum, lo := int64(0), 0
			for hi, a := range adm {
				sum += a.n
				for adm[lo].at <= a.at-tc.limit.Per {
					sum -= adm[lo].n
					lo++
				}
				// Entries at the same instant as the next one are in its window
				// too; check at the last of them.
				if hi+1 < len(adm) && adm[hi+1].at == a.at {
					continue
				}
				if sum > tc.limit.Rate {
					t.Fatalf("window ending %v holds %d, want at most %d", a.at, sum, tc.limit.Rate)
				}
			}
			if tc.maxCost == 1 {
				times := make([]time.Duration, len(adm))
				for i, a := range adm {
					times[i] = a.at
				}
				if got := MaxInWindow(times, tc.limit.Per); int64(got) > tc.limit.Rate {
					t.Errorf("MaxInWindow = %d, want at most %d", got, tc.limit.Rate)
				}
			}
		})
	}
}

// TestFixedWindowNeverExceedsRatePerSlot: per wall-clock slot, at most Rate.
func TestFixedWindowNeverExceedsRatePerSlot(t *testing.T) {
	l := Limit{Rate: 20, Per: 250 * msec}
	adm := randomRun(t, FixedWindow, l, 7, 3, 0)
	per := map[int64]int64{}
	for _, a := range adm {
		slot := int64(a.at / l.Per)
		if per[slot] += a.n; per[slot] > l.Rate {
			t.Fatalf("slot %d holds %d, want at most %d", slot, per[slot], l.Rate)
		}
	}
}

// TestTokenBucketNeverExceedsBurstPlusRefill: any interval [t_i, t_j] holds
// at most Burst + Rate × (t_j − t_i) / Per units.
func TestTokenBucketNeverExceedsBurstPlusRefill(t *testing.T) {
	l := Limit{Rate: 30, Per: time.Second, Burst: 5}
	adm := randomRun(t, TokenBucket, l, 9, 2, 0)
	// In token·µs: cum_j·P − Rate·t_j − (cum_{i−1}·P − Rate·t_i) ≤ Burst·P.
	p := l.Per.Microseconds()
	lowest := int64(1) << 62
	var cum int64
	for _, a := range adm {
		lowest = min(lowest, cum*p-l.Rate*a.at.Microseconds())
		cum += a.n
		if excess := cum*p - l.Rate*a.at.Microseconds() - lowest; excess > l.Burst*p {
			t.Fatalf("at %v: %d token·µs over the refill, want at most %d", a.at, excess, l.Burst*p)
		}
	}
}

// TestSweepForgetsIdleKeys: the number of keys held follows recent
// activity, not every key ever seen.
func TestSweepForgetsIdleKeys(t *testing.T) {
	for _, alg := range []Algorithm{SlidingLog, FixedWindow, TokenBucket, Meter} {
		t.Run(string(alg), func(t *testing.T) {
			l := newLimiter(alg, Limit{Rate: 5, Per: time.Second}, epoch)
			for i := range 100 {
				l.take(fmt.Sprint("key", i), 0, 1)
			}
			l.sweep(100 * msec)
			if l.size() != 100 {
				t.Errorf("after sweeping while busy: %d keys, want 100", l.size())
			}
			l.sweep(10 * time.Second)
			if l.size() != 0 {
				t.Errorf("after sweeping when idle: %d keys, want 0", l.size())
			}
		})
	}
}

func TestMeter(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit Limit
		steps []step
	}{
		{"no burst: one per 20ms in whole milliseconds", Limit{Rate: 50, Per: time.Second}, []step{
			// A new key's first request is free.
			{at: 0, n: 1, ok: true, remaining: 0, reset: 20 * msec},
			{at: 19900 * time.Microsecond, n: 1, retry: 100 * time.Microsecond, remaining: 0, reset: 100 * time.Microsecond},
			{at: 20 * msec, n: 1, ok: true, remaining: 0, reset: 20 * msec},
			// 19.999ms later, but in the 19th whole millisecond.
			{at: 39999 * time.Microsecond, n: 1, retry: 1 * time.Microsecond, remaining: 0, reset: 1 * time.Microsecond},
			{at: 40999 * time.Microsecond, n: 1, ok: true, remaining: 0, reset: 19001 * time.Microsecond},
			// 19.001ms later, but 20 whole milliseconds: nginx lets it in.
			{at: 60 * msec, n: 1, ok: true, remaining: 0, reset: 20 * msec},
			// Older than the last accepted request: counted in its millisecond.
			{at: 59 * msec, n: 1, retry: 21 * msec, remaining: 0, reset: 21 * msec},
			{at: 70 * msec, n: 2, tooLarge: true, remaining: 0, reset: 10 * msec},
			{at: 70 * msec, n: 0, ok: true, remaining: 0, reset: 10 * msec},
			{at: 5 * time.Second, n: 1, ok: true, remaining: 0, reset: 20 * msec},
		}},
		{"burst 2 nodelay", Limit{Rate: 10, Per: time.Second, Burst: 2}, []step{
			{at: 0, n: 1, ok: true, remaining: 2, reset: 100 * msec},
			{at: 0, n: 1, ok: true, remaining: 1, reset: 200 * msec},
			{at: 0, n: 1, ok: true, remaining: 0, reset: 300 * msec},
			{at: 0, n: 1, retry: 100 * msec, remaining: 0, reset: 300 * msec},
			// 150ms drained 1.5 requests.
			{at: 150 * msec, n: 1, ok: true, remaining: 0, reset: 250 * msec},
			{at: 150 * msec, n: 4, tooLarge: true, remaining: 0, reset: 250 * msec},
			{at: time.Second, n: 3, ok: true, remaining: 0, reset: 300 * msec},
		}},
		// nginx keeps 7r/m as 116 milli-requests per second: one per 8621ms.
		{"per minute, truncated as nginx", Limit{Rate: 7, Per: time.Minute}, []step{
			{at: 0, n: 1, ok: true, remaining: 0, reset: 8621 * msec},
			{at: 8620 * msec, n: 1, retry: 1 * msec, remaining: 0, reset: 1 * msec},
			{at: 8621 * msec, n: 1, ok: true, remaining: 0, reset: 8621 * msec},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run(t, newLimiter(Meter, tc.limit, epoch), tc.steps)
		})
	}
}

// TestMeterSpacing: over long randomized runs without burst, consecutive
// admitted requests are always at least ⌈Per/Rate⌉ whole milliseconds
// apart, and with a burst no interval holds more than the burst plus what
// drained in it; an in-order refusal's retry-after is exact.
func TestMeterSpacing(t *testing.T) {
	for _, tc := range []struct {
		limit   Limit
		maxCost int64
		skew    time.Duration
	}{
		{Limit{Rate: 50, Per: time.Second}, 1, 3 * msec},
		{Limit{Rate: 100, Per: time.Second}, 1, 0},
		{Limit{Rate: 30, Per: time.Second}, 1, 0},
		{Limit{Rate: 40, Per: time.Second, Burst: 5}, 3, 0},
		{Limit{Rate: 90, Per: time.Minute, Burst: 2}, 1, 0},
	} {
		t.Run(fmt.Sprintf("%v cost ≤ %d", tc.limit, tc.maxCost), func(t *testing.T) {
			adm := randomRun(t, Meter, tc.limit, 11, tc.maxCost, tc.skew)
			if len(adm) < 100 {
				t.Fatalf("admitted only %d: the run does not exercise the limit", len(adm))
			}
			rate := tc.limit.meterRate() // milli-requests per second
			if tc.limit.Burst == 0 {
				for i := 1; i < len(adm); i++ {
					ms := msOf(adm[i].at) - msOf(adm[i-1].at)
					if rate*ms/1000 < 1000 {
						t.Fatalf("admitted at %v and %v: %dms apart, want at least %dms", adm[i-1].at, adm[i].at, ms, ceilDiv(1000*1000, rate))
					}
				}
				return
			}
			// In millionths of a request: what any interval [t_i, t_j]
			// admits, less what drains in it at the exact rate, is at most
			// the capacity.
			lowest := int64(1) << 62
			var cum int64
			for _, a := range adm {
				ms := msOf(a.at)
				lowest = min(lowest, cum*1_000_000-rate*ms)
				cum += a.n
				if over := cum*1_000_000 - rate*ms - lowest; over > (tc.limit.Burst+1)*1_000_000 {
					t.Fatalf("at %v: %d millionths over the drain, want at most %d", a.at, over, (tc.limit.Burst+1)*1_000_000)
				}
			}
		})
	}
}
