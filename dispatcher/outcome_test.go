package dispatcher

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// TestRedisCrashAfterTheAnswerSendsOnce: Redis dies while the upstream is
// answering a job and comes back three seconds later. The worker must hold
// the job until Redis takes its response and then its outcome: the job
// succeeds with the upstream's answer kept, and the upstream sees it once.
// (Without the hold the response is lost here; whether asynq's own outcome
// write is lost too, leaving the job to be sent again through lease
// recovery, depends on timing: the chaos run in BENCHMARKS.md counts those.)
func TestRedisCrashAfterTheAnswerSendsOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts a redis-server; runs in make test")
	}
	rs := redistest.New(t, redistest.Options{AppendOnly: true})
	rdb := rs.Client(t)
	ctx := context.Background()

	var sent atomic.Int64
	var crash sync.Once
	restarted := make(chan error, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent.Add(1)
		crash.Do(func() {
			if err := rs.Kill(); err != nil {
				t.Errorf("kill redis: %v", err)
			}
			go func() {
				// Longer than go-redis's own retries of one command.
				time.Sleep(3 * time.Second)
				restarted <- rs.Restart()
			}()
		})
		w.Write([]byte("ok"))
	}))
	defer up.Close()

	api := shaper.Upstream{Name: "api", BaseURL: up.URL, Limits: []leaky.Limit{leaky.PerSecond(100)}, Workers: 1,
		Retry: shaper.Retry{MaxAttempts: 3}, ResultRetention: time.Hour}
	q, err := queue.New(rdb, queue.Config{Upstreams: []shaper.Upstream{api}})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	info, _, err := q.Enqueue(ctx, &queue.Job{Upstream: "api", Path: "/once"})
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(rdb, Config{Upstreams: []shaper.Upstream{api}, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	defer func() { stop(); <-done }()

	if err := <-restarted; err != nil {
		t.Fatalf("restart redis: %v", err)
	}
	// asynq's lease is 30 s and its recovery runs a minute apart: a job
	// whose outcome was lost would not be succeeded within 20 s.
	deadline := time.Now().Add(20 * time.Second)
	var got *queue.Info
	for time.Now().Before(deadline) {
		got, err = q.Get(ctx, info.ID, "")
		if err == nil && got.State == queue.StateSucceeded {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got == nil || got.State != queue.StateSucceeded {
		t.Fatalf("job state %v (err %v) 20 s after Redis came back, want succeeded: its outcome was lost", got, err)
	}
	if got.Response == nil || string(got.Response.Body) != "ok" {
		t.Errorf("stored response %+v, want the upstream's \"ok\"", got.Response)
	}
	if n := sent.Load(); n != 1 {
		t.Errorf("the upstream saw the job %d times, want once", n)
	}
}
