package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// sample is the state of the run at one moment.
type sample struct {
	At          time.Duration // since the producer started
	UsedMemory  int64         // Redis INFO used_memory
	RedisRSS    int64         // Redis INFO used_memory_rss
	Keys        int64         // DBSIZE
	ServeRSS    int64
	WorkerRSS   []int64 // by worker, 0 for one that has exited
	SelfRSS     int64   // this process: the producer and the fake upstream
	Enqueued    int64   // POST /v1/jobs answered 202
	Refused     int64   // POST /v1/jobs answered anything else, or failed
	Lag         int64   // jobs due by now and not yet sent
	Admitted    int64   // the upstream's 200s
	Rejected    int64   // the upstream's 429s
	Backlog     int64   // GET /v1/upstreams/api: backlog.total
	BacklogNote string  // why Backlog could not be read, if it could not
}

// parseVmRSS reads the resident set size, in bytes, from the text of
// /proc/PID/status ("VmRSS:\t   12345 kB").
func parseVmRSS(status string) (int64, error) {
	for _, line := range strings.Split(status, "\n") {
		rest, ok := strings.CutPrefix(line, "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("unexpected VmRSS line %q", line)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kb < 0 {
			return 0, fmt.Errorf("unexpected VmRSS line %q", line)
		}
		return kb * 1024, nil
	}
	// A zombie, or a kernel thread, has no VmRSS line.
	return 0, errors.New("no VmRSS line")
}

// rssOf is a running process's resident set size in bytes.
func rssOf(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	return parseVmRSS(string(b))
}

// at is the first sample taken at or after t, or the last one if none
// was; ok is false when there are no samples.
func at(samples []sample, t time.Duration) (s sample, ok bool) {
	if len(samples) == 0 {
		return sample{}, false
	}
	for _, s := range samples {
		if s.At >= t {
			return s, true
		}
	}
	return samples[len(samples)-1], true
}

// growth is how much used_memory grew from the sample at from to the last
// sample, as a percentage of its value at from. A plateau shows as a
// figure near zero (positive or negative: a collection of expired keys may
// have just run); steady growth as a figure that rises with the run.
func growth(samples []sample, from time.Duration) (pct float64, ok bool) {
	first, ok := at(samples, from)
	if !ok || first.UsedMemory <= 0 {
		return 0, false
	}
	last := samples[len(samples)-1]
	return 100 * float64(last.UsedMemory-first.UsedMemory) / float64(first.UsedMemory), true
}

// plateauFrom is where the summary takes used_memory's reference: five
// minutes in, by when the soak's bounds are all reached; or, in a run
// shorter than ten minutes, half of it, so that there is a second half to
// compare.
func plateauFrom(d time.Duration) time.Duration {
	if d >= 10*time.Minute {
		return 5 * time.Minute
	}
	return d / 2
}

// maxRSS is the largest RSS of serve, of any worker, of Redis and of this
// process over all samples.
func maxRSS(samples []sample) (serve, worker, redisRSS, self int64) {
	for _, s := range samples {
		serve = max(serve, s.ServeRSS)
		for _, w := range s.WorkerRSS {
			worker = max(worker, w)
		}
		redisRSS = max(redisRSS, s.RedisRSS)
		self = max(self, s.SelfRSS)
	}
	return serve, worker, redisRSS, self
}

// mb renders bytes as megabytes (10^6) with one decimal.
func mb(b int64) string { return strconv.FormatFloat(float64(b)/1e6, 'f', 1, 64) }
