package queue

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

// TestRetry: a dead job goes back to the queue under its ID and key with
// fresh attempts, its history noted, and a worker takes it again; a job
// in another state, or another tenant's, is refused.
func TestRetry(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	q := newQueue(t, rdb, upstreams(0))
	job, _, err := q.Enqueue(ctx, &Job{Tenant: "t", Upstream: "stripe", Path: "/x", IdempotencyKey: "order-1", Partition: "p",
		ExpiresAt: time.Now().Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	finishAll(t, q, rdb, "stripe", die)
	dead, err := q.Get(ctx, job.ID, "t")
	if err != nil || dead.State != StateDead || dead.Attempts != 1 {
		t.Fatalf("before: got %+v, %v; want dead after 1 attempt", dead, err)
	}
	if _, err := q.Retry(ctx, job.ID, "other"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("another tenant's retry: got %v, want ErrNotFound", err)
	}
	got, err := q.Retry(ctx, job.ID, "t")
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != job.ID || got.State != StateQueued || got.Attempts != 0 || got.LastError != "" || !got.LastFailedAt.IsZero() ||
		got.IdempotencyKey != "order-1" || !got.CreatedAt.Equal(dead.CreatedAt) || got.Retries != 1 ||
		got.PreviousError != "upstream said 400" || time.Since(got.RetriedAt) > time.Minute || !got.ExpiresAt.IsZero() {
		t.Fatalf("after retry: got %+v", got)
	}
	c, _ := q.Counts(ctx, "stripe")
	if c["default"].Dead != 0 || c["default"].Pending != 1 {
		t.Fatalf("counts after retry: %+v, want 1 pending, 0 dead", c["default"])
	}
	if _, top, _ := q.Partitions(ctx, "stripe", 5); len(top) != 1 || top[0].Backlog != 1 {
		t.Fatalf("partition backlog after retry: %+v, want p with 1", top)
	}
	if _, err := q.Retry(ctx, job.ID, "t"); !errors.Is(err, ErrNotRetryable) {
		t.Fatalf("retry of a queued job: got %v, want ErrNotRetryable", err)
	}
	// A worker takes it again, and it can die and be retried again.
	if took := finishAll(t, q, rdb, "stripe", die); !slices.Equal(took, []string{job.ID}) {
		t.Fatalf("a worker took %v, want the retried job", took)
	}
	again, err := q.Retry(ctx, job.ID, "")
	if err != nil || again.Retries != 2 || again.State != StateQueued {
		t.Fatalf("second retry: got %+v, %v", again, err)
	}
}

// TestRetryCancelled: a cancelled job reads with the attempts it had when
// cancelled, and a retry queues it again, no longer cancelled.
func TestRetryCancelled(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	q := newQueue(t, rdb, upstreams(0))
	job, _, _ := q.Enqueue(ctx, &Job{Tenant: "t", Upstream: "stripe", NotBefore: time.Now().Add(time.Hour)})
	cancelled, err := q.Cancel(ctx, job.ID, "t")
	if err != nil {
		t.Fatal(err)
	}
	read, err := q.Get(ctx, job.ID, "t")
	if err != nil || read.State != StateCancelled || read.Attempts != cancelled.Attempts || read.Attempts != 0 {
		t.Fatalf("cancel answered %d attempts, a read %+v (%v); want cancelled with 0 both times", cancelled.Attempts, read, err)
	}
	got, err := q.Retry(ctx, job.ID, "t")
	if err != nil || got.State != StateQueued || got.Attempts != 0 || got.PreviousError != "" {
		t.Fatalf("retry: got %+v, %v; want queued", got, err)
	}
	if n := rdb.Exists(ctx, q.cancelKey(job.ID)).Val(); n != 0 {
		t.Fatal("the cancel mark outlived the retry")
	}
}

// TestRetryDead: the bulk retry queues every dead job once, even with two
// running at once on separate connections, and leaves cancelled jobs and
// jobs whose sensitive headers are gone.
func TestRetryDead(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	q := newQueue(t, rdb, upstreams(0))
	var deadIDs []string
	for range 40 {
		info, _, _ := q.Enqueue(ctx, &Job{Tenant: "t", Upstream: "stripe"})
		deadIDs = append(deadIDs, info.ID)
	}
	secret, _, _ := q.Enqueue(ctx, &Job{Tenant: "t", Upstream: "stripe", Headers: map[string]string{"Authorization": "Bearer x"}})
	finishAll(t, q, rdb, "stripe", die)
	// A worker deletes a dead job's sensitive headers.
	sj, _ := q.Get(ctx, secret.ID, "")
	if err := DeleteSecrets(ctx, rdb, q.prefix, &sj.Job); err != nil {
		t.Fatal(err)
	}
	c, _, _ := q.Enqueue(ctx, &Job{Tenant: "t", Upstream: "stripe", NotBefore: time.Now().Add(time.Hour)})
	q.Cancel(ctx, c.ID, "t")
	if _, err := q.Retry(ctx, secret.ID, "t"); !errors.Is(err, ErrNotRetryable) {
		t.Fatalf("retry of a job without its sensitive headers: got %v, want ErrNotRetryable", err)
	}

	var wg sync.WaitGroup
	results := make([]RetryDeadResult, 2)
	for i := range results {
		other := newQueue(t, srv.Client(t), upstreams(0))
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := other.RetryDead(ctx, "stripe")
			if err != nil {
				t.Error(err)
			}
			results[i] = r
		}()
	}
	wg.Wait()
	if got := results[0].Retried + results[1].Retried; got != len(deadIDs) {
		t.Fatalf("retried %+v together, want %d", results, len(deadIDs))
	}
	if results[0].Skipped+results[1].Skipped < 1 {
		t.Fatalf("results %+v: want the job without its headers skipped", results)
	}
	counts, _ := q.Counts(ctx, "stripe")
	if d := counts["default"]; d.Pending != int64(len(deadIDs)) || d.Dead != 2 {
		t.Fatalf("counts %+v, want %d pending and 2 dead (the cancelled one, the one without headers)", d, len(deadIDs))
	}
	if info, _ := q.Get(ctx, c.ID, ""); info.State != StateCancelled {
		t.Fatalf("cancelled job after RetryDead: %s", info.State)
	}
	took := finishAll(t, q, rdb, "stripe", die)
	slices.Sort(took)
	slices.Sort(deadIDs)
	if !slices.Equal(took, deadIDs) {
		t.Fatalf("workers took %d jobs, want the %d retried once each", len(took), len(deadIDs))
	}
}

// TestRetryOnCluster: the retry script's keys share one slot.
func TestRetryOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-master Redis Cluster takes seconds to start: runs in make test")
	}
	cl := redistest.NewCluster(t)
	ctx := context.Background()
	q := newQueue(t, cl.Client(t), upstreams(0))
	info, _, err := q.Enqueue(ctx, &Job{Tenant: "t", Upstream: "stripe", NotBefore: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Cancel(ctx, info.ID, ""); err != nil {
		t.Fatal(err)
	}
	if got, err := q.Retry(ctx, info.ID, ""); err != nil || got.State != StateQueued {
		t.Fatalf("retry on a cluster: %+v, %v", got, err)
	}
	if p, err := q.List(ctx, ListOptions{Upstream: "stripe", Tenant: "t"}); err != nil || len(p.Jobs) != 1 {
		t.Fatalf("list on a cluster: %+v, %v", p, err)
	}
	if _, err := q.RetryDead(ctx, "stripe"); err != nil {
		t.Fatal(err)
	}
}

// TestRetryHonoursMaxPending: a retried job joins the backlog as an
// enqueued one does, so at max_pending it is refused (and stays dead), and
// a bulk retry stops there with what it did.
func TestRetryHonoursMaxPending(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	q := newQueue(t, rdb, upstreams(3))
	var dead []string
	for range 3 {
		info, _, err := q.Enqueue(ctx, &Job{Tenant: "t", Upstream: "stripe"})
		if err != nil {
			t.Fatal(err)
		}
		dead = append(dead, info.ID)
	}
	finishAll(t, q, rdb, "stripe", die)
	for range 2 {
		if _, _, err := q.Enqueue(ctx, &Job{Tenant: "t", Upstream: "stripe"}); err != nil {
			t.Fatal(err)
		}
	}
	// Two pending of three: one retry fits, the next does not.
	if _, err := q.Retry(ctx, dead[0], "t"); err != nil {
		t.Fatalf("first retry: %v", err)
	}
	var full *BacklogFullError
	if _, err := q.Retry(ctx, dead[1], "t"); !errors.As(err, &full) {
		t.Fatalf("retry at max_pending: got %v, want a BacklogFullError", err)
	}
	if info, _ := q.Get(ctx, dead[1], "t"); info.State != StateDead {
		t.Errorf("the refused job is %s, want still dead", info.State)
	}
	res, err := q.RetryDead(ctx, "stripe")
	if !errors.As(err, &full) || res.Retried != 0 {
		t.Errorf("RetryDead at max_pending: got %+v, %v; want none retried and a BacklogFullError", res, err)
	}
}
