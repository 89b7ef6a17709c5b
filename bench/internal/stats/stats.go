// Package stats holds the few summaries the benchmark commands share: the
// median of a set of rounds, a cost per job, and the comma-separated counts
// their flags take (callers, replicas, rates).
package stats

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Median of xs; 0 for none. xs is not changed.
func Median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Counts parses a flag such as "1,8,64" into positive integers.
func Counts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q: want positive integers", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// Micros is d shared out over n jobs, in microseconds per job.
func Micros(d time.Duration, n int64) float64 {
	return float64(d) / float64(time.Microsecond) / float64(n)
}
