package fakeupstream

import (
	"slices"
	"testing"
	"time"
)

// ms builds a list of times from milliseconds, to keep tables short.
func ms(v ...int) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x) * time.Millisecond
	}
	return out
}

func TestMaxInWindow(t *testing.T) {
	for _, tc := range []struct {
		name  string
		times []time.Duration
		w     time.Duration
		want  int
	}{
		{"empty", nil, time.Second, 0},
		{"one", ms(5), time.Second, 1},
		{"zero window", ms(0, 0, 0), 0, 0},
		{"negative window", ms(0, 1), -time.Second, 0},
		{"equal timestamps", ms(7, 7, 7, 7), time.Millisecond, 4},
		// (t−w, t] is half open: times exactly w apart never share a window.
		{"exact boundary", ms(0, 1000), time.Second, 1},
		{"just inside", ms(0, 999), time.Second, 2},
		{"evenly paced", ms(0, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1100), time.Second, 10},
		// A fixed window's 2× across a boundary: 3 at the end of one second,
		// 3 at the start of the next.
		{"burst across boundary", ms(900, 950, 999, 1000, 1001, 1050), time.Second, 6},
		{"two clusters", ms(0, 1, 2, 500, 2000, 2001), 10 * time.Millisecond, 3},
		{"unsorted input", ms(1000, 0, 999, 1), time.Second, 3},
		{"long window holds all", ms(0, 10, 20), time.Hour, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := MaxInWindow(tc.times, tc.w); got != tc.want {
				t.Errorf("MaxInWindow(%v, %v) = %d, want %d", tc.times, tc.w, got, tc.want)
			}
		})
	}
}

func TestMaxInWindowDoesNotModifyInput(t *testing.T) {
	in := ms(3, 1, 2)
	MaxInWindow(in, time.Second)
	GapPercentiles(in)
	if want := ms(3, 1, 2); !slices.Equal(in, want) {
		t.Errorf("input became %v, want %v", in, want)
	}
}

// TestMaxInWindowAgainstBruteForce checks the two-pointer sweep against
// counting every window ending at every time.
func TestMaxInWindowAgainstBruteForce(t *testing.T) {
	times := ms(0, 3, 3, 4, 10, 11, 11, 19, 20, 21, 30, 31, 32, 33, 60)
	for w := time.Millisecond; w <= 40*time.Millisecond; w += time.Millisecond {
		want := 0
		for _, end := range times {
			n := 0
			for _, x := range times {
				if x > end-w && x <= end {
					n++
				}
			}
			want = max(want, n)
		}
		if got := MaxInWindow(times, w); got != want {
			t.Errorf("w=%v: got %d, want %d", w, got, want)
		}
	}
}

func TestGaps(t *testing.T) {
	for _, tc := range []struct {
		name  string
		times []time.Duration
		want  []time.Duration
	}{
		{"empty", nil, nil},
		{"one", ms(4), nil},
		{"equal", ms(4, 4), ms(0)},
		{"sorted", ms(0, 10, 30), ms(10, 20)},
		{"unsorted", ms(30, 0, 10), ms(10, 20)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Gaps(tc.times); !slices.Equal(got, tc.want) {
				t.Errorf("Gaps(%v) = %v, want %v", tc.times, got, tc.want)
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i+1) * time.Millisecond // 1ms … 100ms
	}
	for _, tc := range []struct {
		name   string
		values []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one at p1", ms(7), 1, 7 * time.Millisecond},
		{"one at p99", ms(7), 99, 7 * time.Millisecond},
		{"p0 is the minimum", ms(5, 1, 9), 0, 1 * time.Millisecond},
		{"p100 is the maximum", ms(5, 1, 9), 100, 9 * time.Millisecond},
		// Nearest rank: ceil(50% of 3) = 2nd smallest.
		{"median of three", ms(9, 1, 5), 50, 5 * time.Millisecond},
		// ceil(50% of 4) = 2nd smallest, not an average.
		{"median of four", ms(1, 2, 3, 4), 50, 2 * time.Millisecond},
		{"p1 of 100", hundred, 1, 1 * time.Millisecond},
		{"p50 of 100", hundred, 50, 50 * time.Millisecond},
		{"p99 of 100", hundred, 99, 99 * time.Millisecond},
		{"p99 of 4 is the max", ms(1, 2, 3, 4), 99, 4 * time.Millisecond},
		{"p1 of 4 is the min", ms(1, 2, 3, 4), 1, 1 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Percentile(tc.values, tc.p); got != tc.want {
				t.Errorf("Percentile(%v, %v) = %v, want %v", tc.values, tc.p, got, tc.want)
			}
		})
	}
}

func TestGapPercentiles(t *testing.T) {
	for _, tc := range []struct {
		name  string
		times []time.Duration
		want  GapStats
	}{
		{"empty", nil, GapStats{}},
		{"one", ms(3), GapStats{}},
		{"equal timestamps", ms(3, 3, 3), GapStats{Count: 2}},
		{"even", ms(0, 100, 200, 300), GapStats{Count: 3, Min: 100 * time.Millisecond, P1: 100 * time.Millisecond, P50: 100 * time.Millisecond, P99: 100 * time.Millisecond, Max: 100 * time.Millisecond}},
		// Gaps 1, 9, 10, 80 (ms): p1 → rank 1, p50 → rank 2, p99 → rank 4.
		{"uneven", ms(0, 1, 10, 20, 100), GapStats{Count: 4, Min: 1 * time.Millisecond, P1: 1 * time.Millisecond, P50: 9 * time.Millisecond, P99: 80 * time.Millisecond, Max: 80 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := GapPercentiles(tc.times); got != tc.want {
				t.Errorf("GapPercentiles(%v) = %+v, want %+v", tc.times, got, tc.want)
			}
		})
	}
}

func TestRatePerSecond(t *testing.T) {
	for _, tc := range []struct {
		name  string
		times []time.Duration
		want  float64
	}{
		{"empty", nil, 0},
		{"one", ms(5), 0},
		{"all equal", ms(5, 5), 0},
		{"ten per second", ms(0, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000), 10},
		{"unsorted", ms(500, 0, 250), 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := RatePerSecond(tc.times); got != tc.want {
				t.Errorf("RatePerSecond(%v) = %v, want %v", tc.times, got, tc.want)
			}
		})
	}
}
