package status

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/dispatcher"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// TestResumeRunsHandedBackJobs: the upstream pushes back for an hour, so
// the job it refused waits an hour and the upstream is blocked; a job
// enqueued meanwhile waits untaken. Both read scheduled, waiting for the
// pushback, in GET and in status, and neither is retrying. Resume lifts
// the block and makes the refused job due, so both are sent at once.
func TestResumeRunsHandedBackJobs(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	var sent atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if sent.Add(1) == 1 {
			w.Header().Set("Retry-After", "3600")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer upstream.Close()
	api := shaper.Upstream{Name: "api", BaseURL: upstream.URL, Limits: []leaky.Limit{leaky.PerSecond(100)}, Workers: 1,
		Retry: shaper.Retry{MaxAttempts: 3}, ResultRetention: time.Hour}
	q, err := queue.New(rdb, queue.Config{Upstreams: []shaper.Upstream{api}})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	r, err := NewReader(rdb, q, "")
	if err != nil {
		t.Fatal(err)
	}
	job, _, err := q.Enqueue(ctx, &queue.Job{Upstream: "api", Path: "/x"})
	if err != nil {
		t.Fatal(err)
	}
	d, err := dispatcher.New(rdb, dispatcher.Config{
		Upstreams: []shaper.Upstream{api},
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	// waitFor bounds a hang only; the assertions are on states.
	waitFor := func(id string, want queue.State) *queue.Info {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			info, err := q.Get(ctx, id, "")
			if err != nil {
				t.Fatal(err)
			}
			if info.State == want {
				return info
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %s: got %s, want %s", id, info.State, want)
			}
		}
	}
	handedBack := waitFor(job.ID, queue.StateScheduled)
	if left := time.Until(handedBack.NextAttemptAt); left < 50*time.Minute {
		t.Fatalf("handed back for %v from now, want about the Retry-After, an hour away", left)
	}
	second, _, err := q.Enqueue(ctx, &queue.Job{Upstream: "api", Path: "/y"})
	if err != nil {
		t.Fatal(err)
	}
	if handedBack.WaitingFor != queue.WaitingPushback {
		t.Fatalf("the refused job waits for %q, want pushback", handedBack.WaitingFor)
	}
	time.Sleep(300 * time.Millisecond)
	if info := waitFor(second.ID, queue.StateScheduled); info.Attempts != 0 || info.WaitingFor != queue.WaitingPushback {
		t.Fatalf("job enqueued while blocked: %d attempts, waiting for %q; want none, pushback", info.Attempts, info.WaitingFor)
	}
	st, err := r.Upstream(ctx, "api")
	if err != nil {
		t.Fatal(err)
	}
	if st.Retrying != 0 || st.Scheduled != 2 || st.WaitingFor[queue.WaitingPushback] != 2 || st.PausedUntil == nil {
		t.Fatalf("status while blocked: retrying %d, scheduled %d, waiting for %v, paused until %v; want 0, 2, pushback 2, set",
			st.Retrying, st.Scheduled, st.WaitingFor, st.PausedUntil)
	}
	if n := sent.Load(); n != 1 {
		t.Fatalf("the upstream got %d requests while blocked, want only the first", n)
	}
	moved, err := r.Resume(ctx, "api")
	if err != nil || moved != 1 {
		t.Fatalf("Resume: got %d made due, %v; want 1, nil", moved, err)
	}
	if info := waitFor(job.ID, queue.StateSucceeded); info.Attempts != 1 {
		t.Fatalf("got %d attempts, want 1 (the pushback spends none)", info.Attempts)
	}
	waitFor(second.ID, queue.StateSucceeded)
	if n := sent.Load(); n != 3 {
		t.Fatalf("the upstream got %d requests, want 3", n)
	}
}
