package cli

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
	"github.com/shaperhq/shaper/server"
	"github.com/shaperhq/shaper/status"
	"github.com/shaperhq/shaper/tokenbucket"
)

// TestJobsWait: shaper jobs wait long-polls: one GET per window (never a
// poll per interval), progress on stderr, the job on stdout once it is
// final, exit 2 for a cancelled job and 3 when --timeout passes.
func TestJobsWait(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	ups := []shaper.Upstream{{Name: "stripe", BaseURL: "https://api.stripe.com", Limits: []leaky.Limit{leaky.PerSecond(100)}}}
	q, err := queue.New(rdb, queue.Config{Upstreams: ups})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	st, err := status.NewReader(rdb, q, "")
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.New(rdb, q, st, server.Config{Keys: []server.Key{{Name: "ops", Secret: "k1", Admin: true}},
		Admission: tokenbucket.Limit{Capacity: 100, Refill: 100, Per: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	var gets atomic.Int64
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "GET" && strings.HasPrefix(r.URL.Path, "/v1/jobs/") {
			gets.Add(1)
			if !r.URL.Query().Has("wait") {
				t.Errorf("GET %s without wait: a poll", r.URL)
			}
		}
		s.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(api.Close)
	env := map[string]string{"SHAPER_API_URL": api.URL, "SHAPER_API_KEY": "k1"}
	info, _, err := q.Enqueue(ctx, &queue.Job{Tenant: "ops", Upstream: "stripe", Path: "/v1/refunds", NotBefore: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}

	type result struct {
		out, errOut string
		code        int
	}
	done := make(chan result, 1)
	go func() {
		out, errOut, code := run(t, env, "", "jobs", "wait", info.ID, "--window", "1s")
		done <- result{out, errOut, code}
	}()
	// Two windows run out, then the job is cancelled during the third.
	time.Sleep(2500 * time.Millisecond)
	if _, err := q.Cancel(ctx, info.ID, ""); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("jobs wait did not end after the job was cancelled")
	}
	if r.code != exitDead || !strings.Contains(r.out, "cancelled") {
		t.Fatalf("exit %d\n%s%s\nwant exit %d and the cancelled job", r.code, r.out, r.errOut, exitDead)
	}
	if n := strings.Count(r.errOut, "scheduled after"); n != 2 {
		t.Errorf("stderr:\n%s\nwant 2 progress lines, one per window that ran out", r.errOut)
	}
	if n := gets.Load(); n != 3 {
		t.Errorf("%d GETs for 2.5s of waiting with --window 1s, want 3: one per window", n)
	}

	info, _, err = q.Enqueue(ctx, &queue.Job{Tenant: "ops", Upstream: "stripe", Path: "/v1/refunds", NotBefore: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, code := run(t, env, "", "jobs", "wait", info.ID, "--timeout", "300ms")
	if code != exitWaitTimeout || !strings.Contains(errOut, "not finished after --timeout 300ms") {
		t.Fatalf("--timeout: exit %d\n%s%s\nwant exit %d", code, out, errOut, exitWaitTimeout)
	}
	for _, args := range [][]string{{"--window", "2m"}, {"--timeout", "0s"}} {
		if _, errOut, code := run(t, env, "", append([]string{"jobs", "wait", info.ID}, args...)...); code != 1 || errOut == "" {
			t.Errorf("%v: exit %d %q, want 1 and why", args, code, errOut)
		}
	}
}

// TestAPIServerLetsLongPollsFinish: the API's HTTP server has no write
// deadline that would cut a long poll of queue.MaxWait.
func TestAPIServerLetsLongPollsFinish(t *testing.T) {
	hs := apiHTTPServer(http.NotFoundHandler())
	if hs.WriteTimeout != 0 && hs.WriteTimeout <= queue.MaxWait+5*time.Second {
		t.Errorf("WriteTimeout %v would cut a long poll of %v", hs.WriteTimeout, queue.MaxWait)
	}
	if hs.ReadHeaderTimeout == 0 || hs.IdleTimeout == 0 {
		t.Errorf("ReadHeaderTimeout %v, IdleTimeout %v: want both set", hs.ReadHeaderTimeout, hs.IdleTimeout)
	}
}
