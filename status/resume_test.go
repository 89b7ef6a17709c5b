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

// TestResumeRunsHandedBackJobs: a worker hands back a job it could not send
// during a pause, scheduled for the pause's end an hour away; Resume lifts
// the pause and makes that job due, so it is sent at once.
func TestResumeRunsHandedBackJobs(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	var sent atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { sent.Add(1) }))
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
	if _, err := r.Pause(ctx, "api", time.Hour, "test"); err != nil {
		t.Fatal(err)
	}
	job, _, err := q.Enqueue(ctx, &queue.Job{Upstream: "api", Path: "/x"})
	if err != nil {
		t.Fatal(err)
	}
	d, err := dispatcher.New(rdb, dispatcher.Config{
		Upstreams: []shaper.Upstream{api},
		MaxHold:   50 * time.Millisecond,
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
	waitFor := func(want queue.State) *queue.Info {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			info, err := q.Get(ctx, job.ID, "")
			if err != nil {
				t.Fatal(err)
			}
			if info.State == want {
				return info
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %s: got %s, want %s", job.ID, info.State, want)
			}
		}
	}
	handedBack := waitFor(queue.StateScheduled)
	if left := time.Until(handedBack.NextAttemptAt); left < 50*time.Minute {
		t.Fatalf("handed back for %v from now, want about the pause's end, an hour away", left)
	}
	if n := sent.Load(); n != 0 {
		t.Fatalf("the upstream got %d requests during the pause, want 0", n)
	}
	moved, err := r.Resume(ctx, "api")
	if err != nil || moved != 1 {
		t.Fatalf("Resume: got %d made due, %v; want 1, nil", moved, err)
	}
	if info := waitFor(queue.StateSucceeded); info.Attempts != 1 {
		t.Fatalf("got %d attempts, want 1 (the hand-back spends none)", info.Attempts)
	}
	if n := sent.Load(); n != 1 {
		t.Fatalf("the upstream got %d requests, want 1", n)
	}
}
