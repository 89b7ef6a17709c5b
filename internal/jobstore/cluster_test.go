package jobstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

// TestOnCluster runs every script on a real 3-master Redis Cluster, for
// queues whose slots lie on different masters, and reads the result back
// through asynq's Inspector.
func TestOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-master Redis Cluster takes seconds to start: runs in make test")
	}
	ctx := context.Background()
	cl := redistest.NewCluster(t)
	rdb := cl.Client(t)
	queues := []string{"alpha", "beta", "gamma", "delta", "epsilon", "zeta"}
	for _, q := range queues {
		e := newEnvOn(t, rdb, q)
		ok := e.taken("ok", "default", "p", asynq.Unique(time.Hour))
		gone := e.taken("gone", "default", "p")
		retry := e.taken("retry", "bulk", "p")
		dead := e.taken("dead", "bulk", "p")
		e.enqueue("lost", "default", "p")
		e.take("lost", time.Now().Add(-time.Second))
		e.taken("held", "default", "")
		errs := e.finish(
			Finished{ID: "ok", Lane: "default", Partition: "p", Msg: ok, Outcome: Succeeded, Result: []byte("r"), Retention: time.Hour},
			Finished{ID: "gone", Lane: "default", Partition: "p", Msg: gone, Outcome: Succeeded},
			Finished{ID: "retry", Lane: "bulk", Partition: "p", Msg: retry, Outcome: Retry, Failure: true,
				RetryAt: time.Now().Add(time.Minute), ErrMsg: "503"},
			Finished{ID: "dead", Lane: "bulk", Partition: "p", Msg: dead, Outcome: Dead, ErrMsg: "400"},
			Finished{ID: "ghost", Lane: "bulk", Msg: &Message{ID: "ghost", Queue: q}, Outcome: Dead},
		)
		for i, want := range []error{nil, nil, nil, nil, ErrNotActive} {
			if errs[i] != want {
				t.Fatalf("%s item %d: got %v, want %v", q, i, errs[i], want)
			}
		}
		if err := ExtendLeases(ctx, rdb, e.k, []string{"held", "ok"}, time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if n, err := Recover(ctx, rdb, e.k, e.counts, e.pbacklog, time.Now(), 10); err != nil || n != 1 {
			t.Fatalf("%s: recover: got %d, %v, want 1", q, n, err)
		}
		for id, want := range map[string]asynq.TaskState{"ok": asynq.TaskStateCompleted, "retry": asynq.TaskStateRetry,
			"dead": asynq.TaskStateArchived, "lost": asynq.TaskStateRetry, "held": asynq.TaskStateActive} {
			if got := e.info(id).State; got != want {
				t.Fatalf("%s/%s: got %v, want %v", q, id, got, want)
			}
		}
		if got, want := e.sizes(), [10]int{0, 1, 0, 2, 1, 1, 5, 3, 5, 3}; got != want {
			t.Fatalf("%s: queue sizes: got %v, want %v", q, got, want)
		}
		if n, err := DeleteExpired(ctx, rdb, e.k, e.counts, Archived, time.Now().Add(time.Second), 10); err != nil || n != 1 {
			t.Fatalf("%s: delete expired: got %d, %v, want 1", q, n, err)
		}
		got := e.countsNow()
		if got["active:default"] != 1 || got["succeeded:default"] != 1 || got["retry:bulk"] != 1 ||
			got["retry:default"] != 1 || len(got) != 4 {
			t.Fatalf("%s: counts: got %v", q, got)
		}
		if got := e.backlog(); got["p"] != 2 {
			t.Fatalf("%s: pbacklog: got %v, want p 2", q, got)
		}
	}
	// The queues really were spread over the masters.
	masters := 0
	for _, n := range cl.Nodes {
		keys, err := n.Client(t).Keys(ctx, "asynq:{*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) > 0 {
			masters++
		}
		for _, key := range keys {
			if !strings.HasPrefix(key, "asynq:{") {
				t.Fatalf("key %s lacks a queue's hash tag", key)
			}
		}
	}
	if masters < 2 {
		t.Fatalf("queue keys on %d masters, want at least two", masters)
	}
}
