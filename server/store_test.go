package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/client"
	"github.com/shaperhq/shaper/config"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/queue"
)

// downFixture is the API on a Redis of its own, reached with the options
// `shaper serve` uses, so the test can kill it.
func downFixture(t *testing.T, policy shaper.OnRedisError) (*fixture, *redistest.Server) {
	t.Helper()
	rs := redistest.New(t)
	o := &redis.UniversalOptions{Addrs: []string{rs.Addr}}
	config.FailFast(o)
	rdb := redis.NewUniversalClient(o)
	t.Cleanup(func() { rdb.Close() })
	f := newFixtureOn(t, rdb, generous, 1000, func(c *Config) { c.OnRedisError = policy })
	if resp, body := f.do("POST", "/v1/jobs", `{"upstream":"stripe","path":"/x"}`); resp.StatusCode != 202 {
		t.Fatalf("with Redis up: got %d %v, want 202", resp.StatusCode, body)
	}
	return f, rs
}

// answerBound is the contract: with Redis unreachable, every enqueue is
// answered within it. Real figures are a few milliseconds (logged below).
const answerBound = 500 * time.Millisecond

// TestEnqueueWithoutRedis: with Redis killed, a stream of enqueues is each
// answered within half a second with 503, Retry-After and the
// store-unavailable problem type, admission failing open and counted; once
// Redis is back an enqueue succeeds within 2 s.
func TestEnqueueWithoutRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("Redis stopped for seconds: runs in make test")
	}
	f, rs := downFixture(t, shaper.FailOpen)
	if err := rs.Kill(); err != nil {
		t.Fatal(err)
	}
	// A burst first, so that many requests meet the dead Redis before the
	// breaker opens, and go-redis's own pool gives up dialing (after
	// PoolSize failures it probes once a second), as in a real outage.
	var took []time.Duration
	var mu sync.Mutex
	note := func(what string, i int, d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		took = append(took, d)
		if d > answerBound/2 {
			t.Logf("slow: %s %d answered in %v", what, i, d)
		}
	}
	var wg sync.WaitGroup
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			resp, body := f.do("POST", "/v1/jobs", `{"upstream":"stripe","path":"/burst"}`)
			note("burst", i, time.Since(start))
			if resp.StatusCode != 503 || body["type"] != problemStoreUnavailable {
				t.Errorf("burst: got %d %v, want 503 store-unavailable", resp.StatusCode, body)
			}
		}()
	}
	wg.Wait()
	for i := 0; i < 60; i++ {
		start := time.Now()
		if i%3 == 2 {
			resp, body := f.do("POST", "/v1/jobs/batch", `{"jobs":[{"upstream":"stripe","path":"/a"},{"upstream":"stripe","path":"/b"}]}`)
			note("batch", i, time.Since(start))
			if resp.StatusCode != 200 {
				t.Fatalf("batch %d: got %d %v, want 200 with per-item 503s", i, resp.StatusCode, body)
			}
			for _, r := range body["results"].([]any) {
				item := r.(map[string]any)
				p, _ := item["error"].(map[string]any)
				if item["status"] != 503.0 || p["type"] != problemStoreUnavailable || p["retry_after"] != 1.0 {
					t.Fatalf("batch %d: got item %v, want 503 store-unavailable with retry_after", i, item)
				}
			}
		} else {
			resp, body := f.do("POST", "/v1/jobs", fmt.Sprintf(`{"upstream":"stripe","path":"/x/%d"}`, i))
			note("enqueue", i, time.Since(start))
			if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" || body["type"] != problemStoreUnavailable {
				t.Fatalf("enqueue %d: got %d (Retry-After %q) %v, want 503 store-unavailable with Retry-After",
					i, resp.StatusCode, resp.Header.Get("Retry-After"), body)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The Go client tells this 503 from a full backlog.
	c, err := client.New(f.hs.URL, "billing-secret")
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Enqueue(context.Background(), client.JobRequest{Upstream: "stripe", Path: "/c"})
	if !errors.Is(err, client.ErrUnavailable) || errors.Is(err, client.ErrBacklogFull) {
		t.Errorf("client: got %v, want ErrUnavailable and not ErrBacklogFull", err)
	}
	slices.Sort(took)
	t.Logf("Redis down: %d enqueues, p50 %v, p90 %v, max %v", len(took), took[len(took)/2], took[len(took)*9/10], took[len(took)-1])
	if worst := took[len(took)-1]; worst > answerBound {
		t.Errorf("slowest answer with Redis down took %v, want at most %v", worst, answerBound)
	}
	if n := counter(t, f.reg, "shaper_admission_decisions_total", "fail_open"); n < 1 {
		t.Errorf("fail_open decisions: got %v, want each refused enqueue's admission counted", n)
	}
	if n := counter(t, f.reg, "shaper_jobs_rejected_total", "store_error"); n != 121 {
		t.Errorf("store_error rejections: got %v, want 121 (40 in the burst, 40 single, 20 batches of 2, the client's)", n)
	}

	if err := rs.Restart(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	for {
		resp, body := f.do("POST", "/v1/jobs", `{"upstream":"stripe","path":"/y"}`)
		if resp.StatusCode == 202 {
			break
		}
		if time.Since(back) > 2*time.Second {
			t.Fatalf("2 s after Redis returned: got %d %v, want 202", resp.StatusCode, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("Redis back: first enqueue accepted after %v", time.Since(back))
}

// TestEnqueueWithoutRedisFailClosed: under on_redis_error deny, admission
// refuses with 429 while Redis is down, at once and counted.
func TestEnqueueWithoutRedisFailClosed(t *testing.T) {
	f, rs := downFixture(t, shaper.FailClosed)
	if err := rs.Kill(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		start := time.Now()
		resp, body := f.do("POST", "/v1/jobs", `{"upstream":"stripe","path":"/x"}`)
		if took := time.Since(start); resp.StatusCode != http.StatusTooManyRequests || took > answerBound {
			t.Fatalf("enqueue %d: got %d %v after %v, want 429 within %v", i, resp.StatusCode, body, took, answerBound)
		}
	}
	if n := counter(t, f.reg, "shaper_admission_decisions_total", "fail_closed"); n != 10 {
		t.Errorf("fail_closed decisions: got %v, want 10", n)
	}
}

// TestBreakerOpensOnFailuresInARow: one slow or failed call from a busy
// Redis must not turn every tenant away; two in a row do; answers about
// jobs (not found, backlog full) are not failures; a success closes it.
func TestBreakerOpensOnFailuresInARow(t *testing.T) {
	ctx := context.Background()
	b := &breaker{probeEvery: time.Hour, log: quiet()}
	down := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	steps := []struct {
		err      error
		wantOpen bool
	}{
		{down, false},
		{nil, false}, // a success in between resets the count
		{down, false},
		{fmt.Errorf("job x: %w", queue.ErrNotFound), false},
		{&queue.BacklogFullError{Upstream: "stripe", Pending: 10, Max: 10}, false},
		{down, true},
		{nil, false},
	}
	for i, st := range steps {
		b.record(ctx, st.err)
		// allow reports false only while open and within probeEvery.
		if open := !b.allow(); open != st.wantOpen {
			t.Fatalf("step %d (%v): open %v, want %v", i, st.err, open, st.wantOpen)
		}
	}
}

// TestEnqueueWithRedisHung: a Redis that accepts connections but answers
// nothing (CLIENT PAUSE, as a hung or partitioned server) costs an enqueue
// its store budget once, then the breaker answers at once: every enqueue is
// still answered within the bound, and enqueues succeed again once Redis
// answers.
func TestEnqueueWithRedisHung(t *testing.T) {
	if testing.Short() {
		t.Skip("Redis stopped for seconds: runs in make test")
	}
	f, rs := downFixture(t, shaper.FailOpen)
	admin := rs.Client(t)
	const hang = 3 * time.Second
	if err := admin.Do(context.Background(), "CLIENT", "PAUSE", hang.Milliseconds(), "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	var worst time.Duration
	for i := 0; time.Since(paused) < hang-time.Second; i++ {
		start := time.Now()
		resp, body := f.do("POST", "/v1/jobs", fmt.Sprintf(`{"upstream":"stripe","path":"/hung/%d"}`, i))
		took := time.Since(start)
		worst = max(worst, took)
		if resp.StatusCode != 503 || body["type"] != problemStoreUnavailable {
			t.Fatalf("enqueue %d with Redis hung: got %d %v, want 503 store-unavailable", i, resp.StatusCode, body)
		}
		if took > answerBound {
			t.Errorf("enqueue %d with Redis hung answered in %v, want at most %v", i, took, answerBound)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("Redis hung: slowest enqueue answered in %v", worst)
	for {
		resp, body := f.do("POST", "/v1/jobs", `{"upstream":"stripe","path":"/after"}`)
		if resp.StatusCode == 202 {
			break
		}
		if time.Since(paused) > hang+2*time.Second {
			t.Fatalf("2 s after Redis answered again: got %d %v, want 202", resp.StatusCode, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
