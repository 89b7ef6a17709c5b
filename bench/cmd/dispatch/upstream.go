package main

import (
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/shaperhq/shaper/fakeupstream"
)

// upstream is the fake third-party API served in this process with no limit,
// so it only records. It also counts arrivals and can announce each one,
// which Report (it recomputes everything) is too slow to poll for.
type upstream struct {
	fake    *fakeupstream.Server
	hs      *http.Server
	url     string
	arrived atomic.Int64
	notify  atomic.Pointer[chan time.Time]
}

func startUpstream() (*upstream, error) {
	fake, err := fakeupstream.New(fakeupstream.Config{MaxRecords: 1_000_000})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &upstream{fake: fake, url: "http://" + ln.Addr().String()}
	u.hs = &http.Server{Handler: u, ReadHeaderTimeout: 10 * time.Second}
	go u.hs.Serve(ln)
	return u, nil
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	u.arrived.Add(1)
	if ch := u.notify.Load(); ch != nil {
		select {
		case *ch <- at:
		default:
		}
	}
	u.fake.ServeHTTP(w, r)
}

// reset forgets every arrival.
func (u *upstream) reset() {
	u.fake.Reset()
	u.arrived.Store(0)
}

// arrivals are the recorded arrival times, oldest first.
func (u *upstream) arrivals() []time.Duration {
	recs := u.fake.Records()
	out := make([]time.Duration, len(recs))
	for i, r := range recs {
		out[i] = r.At
	}
	return out
}

func (u *upstream) close() { u.hs.Close() }
