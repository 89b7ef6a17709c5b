package status

import (
	"context"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// A callback whose retries ran out counts as failing until it is retried.
func TestCallbacksFailed(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	q, err := queue.New(rdb, queue.Config{Upstreams: []shaper.Upstream{
		{Name: "api", Limits: []leaky.Limit{leaky.PerSecond(100)}, ResultRetention: time.Hour, DeadRetention: time.Hour}}})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	r, err := NewReader(rdb, q, "")
	if err != nil {
		t.Fatal(err)
	}
	info, _, err := q.Enqueue(ctx, &queue.Job{Tenant: "t", Upstream: "api", Path: "/x", NotBefore: time.Now().Add(time.Hour), CallbackURL: "https://hooks.example.com/x"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Cancel(ctx, info.ID, "t"); err != nil {
		t.Fatal(err)
	}
	read := func() int64 {
		t.Helper()
		u, err := r.Upstream(ctx, "api")
		if err != nil {
			t.Fatal(err)
		}
		return u.CallbacksFailed
	}
	if n := read(); n != 0 {
		t.Fatalf("pending: got %d failing, want 0", n)
	}
	space := jobstore.For("", "api")
	c, err := space.ClaimCallbacks(ctx, rdb, time.Time{}, time.Minute, 1, 1)
	if err != nil || len(c) != 1 {
		t.Fatalf("claim: %v %v", c, err)
	}
	if out, err := space.CallbackDone(ctx, rdb, time.Time{}, c[0], false, "answered 500", 0, 1); err != nil || out != jobstore.CallbackGaveUp {
		t.Fatalf("done: %v %v", out, err)
	}
	if n := read(); n != 1 {
		t.Fatalf("failed: got %d failing, want 1", n)
	}
	if _, err := q.RetryCallback(ctx, info.ID, "t"); err != nil {
		t.Fatal(err)
	}
	if n := read(); n != 0 {
		t.Fatalf("retried: got %d failing, want 0", n)
	}
}
