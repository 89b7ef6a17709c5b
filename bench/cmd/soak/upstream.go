package main

import (
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/shaperhq/shaper/fakeupstream"
)

// upstream is the fake upstream served in this process. It enforces its
// limit and counts as fakeupstream does, but answers an admitted request
// with a small body of its own (the fake's echo is larger than a typical
// answer) so that kept results are the size the soak means them to be.
type upstream struct {
	fake *fakeupstream.Server
	hs   *http.Server
	url  string
	n    atomic.Int64
}

// okBody is the answer to an admitted request: 50 bytes, numbered.
func okBody(n int64) []byte {
	return fmt.Appendf(nil, `{"id":"thing_%08d","object":"thing","ok":true}`, n)
}

func startUpstream(cfg fakeupstream.Config) (*upstream, error) {
	fake, err := fakeupstream.New(cfg)
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

func (u *upstream) close() { u.hs.Close() }

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sw := &swapOK{w: w}
	u.fake.ServeHTTP(sw, r)
	if sw.status == http.StatusOK {
		w.Write(okBody(u.n.Add(1)))
	}
}

// swapOK passes the fake's answer through, except a 200's body, which
// ServeHTTP writes instead.
type swapOK struct {
	w      http.ResponseWriter
	status int
}

func (s *swapOK) Header() http.Header { return s.w.Header() }

func (s *swapOK) WriteHeader(code int) {
	if s.status != 0 {
		return
	}
	s.status = code
	if code == http.StatusOK {
		s.w.Header().Del("Content-Length")
	}
	s.w.WriteHeader(code)
}

func (s *swapOK) Write(p []byte) (int, error) {
	if s.status == 0 {
		s.WriteHeader(http.StatusOK)
	}
	if s.status == http.StatusOK {
		return len(p), nil
	}
	return s.w.Write(p)
}
