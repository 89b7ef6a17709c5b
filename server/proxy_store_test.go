package server

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/config"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

// serveClient reaches rs as `shaper serve` does (config.FailFast).
func serveClient(t *testing.T, rs *redistest.Server) redis.UniversalClient {
	t.Helper()
	o := &redis.UniversalOptions{Addrs: []string{rs.Addr}}
	config.FailFast(o)
	rdb := redis.NewUniversalClient(o)
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// TestProxySlowRedisIsWaitedFor: a Redis that is alive but slow to answer
// (every client paused for 700 ms, longer than the enqueue path's 300 ms
// store budget) holds calls back, within their wait, instead of turning
// them into 503s; all are answered by the upstream.
func TestProxySlowRedisIsWaitedFor(t *testing.T) {
	if testing.Short() {
		t.Skip("Redis paused for most of a second: runs in make test")
	}
	own := redistest.New(t)
	f := newProxyFixtureOn(t, serveClient(t, own), &recorder{}, func(u *shaper.Upstream) { u.Proxy.MaxWait = 10 * time.Second })
	if resp, body := f.call("GET", "/proxy/api/v1/x", ""); resp.StatusCode != 200 {
		t.Fatalf("before the pause: got %d %s, want 200", resp.StatusCode, body)
	}
	f.settled(1)
	ctl := own.Client(t)
	if err := ctl.Do(context.Background(), "CLIENT", "PAUSE", 700, "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var wg sync.WaitGroup
	codes := make([]int, 8)
	for i := range codes {
		wg.Go(func() {
			resp, _ := f.call("GET", "/proxy/api/v1/x", "")
			codes[i] = resp.StatusCode
		})
	}
	wg.Wait()
	took := time.Since(start)
	for i, c := range codes {
		if c != 200 {
			t.Errorf("call %d during the pause: got %d, want 200", i, c)
		}
	}
	if took < 500*time.Millisecond {
		t.Errorf("calls were answered after %v: Redis was not paused", took)
	}
	if n := len(f.up.requests()); n != 1+len(codes) {
		t.Errorf("upstream got %d requests, want %d", n, 1+len(codes))
	}
}

// TestProxyRedisStoppedAnswersAtOnce: with Redis stopped, a stream of
// calls with a long wait is each answered 503 within half a second,
// nothing sent: a down Redis is not waited for as a busy one is.
func TestProxyRedisStoppedAnswersAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("a Redis of its own stopped: runs in make test")
	}
	own := redistest.New(t)
	f := newProxyFixtureOn(t, serveClient(t, own), &recorder{}, func(u *shaper.Upstream) { u.Proxy.MaxWait = 30 * time.Second })
	if resp, body := f.call("GET", "/proxy/api/v1/x", ""); resp.StatusCode != 200 {
		t.Fatalf("with Redis: got %d %s, want 200", resp.StatusCode, body)
	}
	if err := own.Stop(); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		start := time.Now()
		resp, body := f.call("GET", "/proxy/api/v1/x", "")
		took := time.Since(start)
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("call %d without Redis: got %d %s, want 503 with Retry-After", i, resp.StatusCode, body)
		}
		if took > 500*time.Millisecond {
			t.Errorf("call %d: the 503 took %v, want it at once", i, took)
		}
	}
	if n := len(f.up.requests()); n != 1 {
		t.Errorf("upstream got %d requests, want only the one made with Redis", n)
	}
}
