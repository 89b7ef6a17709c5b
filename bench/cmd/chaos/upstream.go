package main

import (
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/shaperhq/shaper/fakeupstream"
)

// keyPrefix starts every job's idempotency key; the rest is the job's index.
const keyPrefix = "chaos-"

// upstream is the fake third-party API, served in this process with the
// run's limit as a sliding log, so that it judges every window exactly and
// answers 429 to any request over it. Beside the fake's own record it notes,
// per job, how many 2xx answers it gave and when the first was, which is
// what the run waits on: the fake's Report recomputes everything and is too
// slow to poll.
type upstream struct {
	fake *fakeupstream.Server
	hs   *http.Server
	url  string
	t0   time.Time

	oks       []atomic.Int32 // 2xx answers per job index
	firstOK   []atomic.Int64 // ns since t0 of the first 2xx, per job index
	lastOK    []atomic.Int64 // ns since t0 of the latest 2xx, per job index
	delivered atomic.Int64   // jobs with at least one 2xx
	lastNew   atomic.Int64   // ns since t0 of the latest first 2xx
	foreign   atomic.Int64   // 2xx answers to keys that are not a job's
}

func startUpstream(jobs, rate int, latency time.Duration, t0 time.Time) (*upstream, error) {
	fake, err := fakeupstream.New(fakeupstream.Config{
		Algorithm: fakeupstream.SlidingLog, Rate: int64(rate), Per: time.Second, Latency: latency,
		// Every arrival of the run is kept, retries and duplicates too.
		MaxRecords: 3*jobs + 100_000,
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &upstream{fake: fake, url: "http://" + ln.Addr().String(), t0: t0,
		oks: make([]atomic.Int32, jobs), firstOK: make([]atomic.Int64, jobs), lastOK: make([]atomic.Int64, jobs)}
	u.hs = &http.Server{Handler: u, ReadHeaderTimeout: 10 * time.Second}
	go u.hs.Serve(ln)
	return u, nil
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sw := &statusWriter{ResponseWriter: w}
	u.fake.ServeHTTP(sw, r)
	if sw.status == 0 {
		sw.status = http.StatusOK
	}
	if sw.status/100 != 2 || strings.HasPrefix(r.URL.Path, fakeupstream.ControlPrefix) {
		return
	}
	i, ok := u.index(r.Header.Get(fakeupstream.DefaultIdempotencyHeader))
	if !ok {
		u.foreign.Add(1)
		return
	}
	at := int64(time.Since(u.t0))
	u.lastOK[i].Store(at)
	if u.oks[i].Add(1) == 1 {
		u.firstOK[i].Store(at)
		u.delivered.Add(1)
		// Keep the latest; first deliveries race only by microseconds.
		for {
			last := u.lastNew.Load()
			if at <= last || u.lastNew.CompareAndSwap(last, at) {
				break
			}
		}
	}
}

// index is the job index an idempotency key names.
func (u *upstream) index(key string) (int, bool) {
	s, ok := strings.CutPrefix(key, keyPrefix)
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(s)
	if err != nil || i < 0 || i >= len(u.oks) {
		return 0, false
	}
	return i, true
}

func (u *upstream) close() { u.hs.Close() }

// statusWriter notes the status the fake answers with.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}
