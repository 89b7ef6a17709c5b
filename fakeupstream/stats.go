package fakeupstream

import (
	"math"
	"slices"
	"time"
)

// These measure pacing from arrival times alone, so that benchmarks can
// apply them to any list of send or arrival times, not only to a Server's.
// Times are offsets from any common origin; they need not be sorted.

// MaxInWindow is the most times that fall in any window (t−w, t] of length
// w: the figure a limit of "at most N per w" is judged by. Two times exactly
// w apart are never in the same window. It is 0 for no times or w ≤ 0.
func MaxInWindow(times []time.Duration, w time.Duration) int {
	if w <= 0 {
		return 0
	}
	times = sorted(times)
	most, lo := 0, 0
	for hi, t := range times {
		for times[lo] <= t-w {
			lo++
		}
		most = max(most, hi-lo+1)
	}
	return most
}

// Gaps are the intervals between consecutive times, in time order: one
// fewer than the times, none for fewer than two.
func Gaps(times []time.Duration) []time.Duration {
	times = sorted(times)
	if len(times) < 2 {
		return nil
	}
	gaps := make([]time.Duration, len(times)-1)
	for i := range gaps {
		gaps[i] = times[i+1] - times[i]
	}
	return gaps
}

// Percentile is the nearest-rank p-th percentile of values (p from 0 to
// 100): the smallest value with at least p% of the values at or below it.
// It is 0 for no values.
func Percentile(values []time.Duration, p float64) time.Duration {
	values = sorted(values)
	if len(values) == 0 {
		return 0
	}
	rank := int(math.Ceil(p * float64(len(values)) / 100))
	return values[min(max(rank, 1), len(values))-1]
}

// GapStats summarises the spacing of a run of times. A perfectly paced run
// at rate r has every gap equal to 1/r; P1 shows how close together the
// worst-bunched sends were, P99 how long the worst stalls were.
type GapStats struct {
	Count int           `json:"count"` // number of gaps
	Min   time.Duration `json:"min_ns"`
	P1    time.Duration `json:"p1_ns"`
	P50   time.Duration `json:"p50_ns"`
	P99   time.Duration `json:"p99_ns"`
	Max   time.Duration `json:"max_ns"`
}

// GapPercentiles summarises the gaps between consecutive times.
func GapPercentiles(times []time.Duration) GapStats {
	gaps := Gaps(times)
	if len(gaps) == 0 {
		return GapStats{}
	}
	slices.Sort(gaps)
	return GapStats{
		Count: len(gaps),
		Min:   gaps[0],
		P1:    Percentile(gaps, 1),
		P50:   Percentile(gaps, 50),
		P99:   Percentile(gaps, 99),
		Max:   gaps[len(gaps)-1],
	}
}

// RatePerSecond is the achieved rate of a run of times: the intervals
// between the first and last time divided by its length. It is 0 for fewer
// than two times or when they are all equal.
func RatePerSecond(times []time.Duration) float64 {
	if len(times) < 2 {
		return 0
	}
	first, last := slices.Min(times), slices.Max(times)
	if last == first {
		return 0
	}
	return float64(len(times)-1) / (last - first).Seconds()
}

// sorted returns times in ascending order, copying only when they are not.
func sorted(times []time.Duration) []time.Duration {
	if slices.IsSorted(times) {
		return times
	}
	return slices.Sorted(slices.Values(times))
}
