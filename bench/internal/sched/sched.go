// Package sched reads how long this process's goroutines waited to run once
// runnable (the runtime's /sched/latencies histogram). The benchmarks run
// the fake upstream in their own process, and it stamps an arrival only
// when its handler runs, so a stall here bunches arrivals that were sent
// evenly: the worst wait tells such stalls of the measuring process apart
// from senders that were early.
package sched

import (
	"runtime/metrics"
	"time"
)

// Latencies is a snapshot of the histogram.
type Latencies struct {
	counts  []uint64
	buckets []float64
}

// Read takes a snapshot.
func Read() Latencies {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return Latencies{}
	}
	h := s[0].Value.Float64Histogram()
	return Latencies{counts: append([]uint64(nil), h.Counts...), buckets: h.Buckets}
}

// WorstSince is the lower bound of the bucket of the longest wait seen
// since before was taken.
func (l Latencies) WorstSince(before Latencies) time.Duration {
	for i := len(l.counts) - 1; i >= 0; i-- {
		var was uint64
		if i < len(before.counts) {
			was = before.counts[i]
		}
		if l.counts[i] > was {
			return time.Duration(l.buckets[i] * float64(time.Second))
		}
	}
	return 0
}
