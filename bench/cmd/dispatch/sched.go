package main

import (
	"runtime/metrics"
	"time"
)

// schedLatencies is this process's histogram of how long goroutines waited
// to run once runnable. The fake upstream stamps an arrival only when its
// handler runs, so a long wait here bunches arrivals that were sent evenly:
// the pacing table shows the worst wait, to tell such stalls of the
// measuring process from bunching by the senders.
type schedLatencies struct {
	counts  []uint64
	buckets []float64
}

func readSchedLatencies() schedLatencies {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return schedLatencies{}
	}
	h := s[0].Value.Float64Histogram()
	return schedLatencies{counts: append([]uint64(nil), h.Counts...), buckets: h.Buckets}
}

// worstSince is the lower bound of the longest wait seen since before.
func (s schedLatencies) worstSince(before schedLatencies) time.Duration {
	for i := len(s.counts) - 1; i >= 0; i-- {
		var was uint64
		if i < len(before.counts) {
			was = before.counts[i]
		}
		if s.counts[i] > was {
			return time.Duration(s.buckets[i] * float64(time.Second))
		}
	}
	return 0
}
