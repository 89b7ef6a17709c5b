package jobstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/shaperhq/shaper/internal/jobstore"
)

// commandCalls is how many times Redis has run cmd (INFO commandstats).
func commandCalls(t *testing.T, cmd string) int64 {
	t.Helper()
	return commandStats(t)[cmd]
}

// commandStats is how many times Redis has run each command, by its name
// in lower case (INFO commandstats).
func commandStats(t *testing.T) map[string]int64 {
	t.Helper()
	return jobstore.RedisServer().CommandCalls(t)
}

// A finished task's result is written in the HSET of its message and
// state, one HSET a task; a task deleted on finishing writes none.
func TestFinishWritesResultWithMessage(t *testing.T) {
	r := cbRig(t)
	ctx := context.Background()
	r.add(job{id: "kept"}, job{id: "gone"}, job{id: "again"})
	if got := r.takeIDs(3); len(got) != 3 {
		t.Fatalf("took %v, want 3", got)
	}
	item := func(id string) jobstore.Finished {
		return jobstore.Finished{ID: id, Lane: r.lane[id], Msg: &jobstore.Message{Type: "http", ID: id, Queue: r.space.Queue},
			Result: []byte("result of " + id)}
	}
	kept, gone, again := item("kept"), item("gone"), item("again")
	kept.Outcome, kept.Retention = jobstore.Succeeded, time.Hour
	gone.Outcome = jobstore.Succeeded
	again.Outcome, again.Failure, again.RetryAt = jobstore.Retry, true, time.Now().Add(time.Hour)
	before := commandCalls(t, "hset")
	errs, err := jobstore.Finish(ctx, r.rdb, r.store, r.space.CountsKey(), r.space.BacklogKey(),
		[]jobstore.Finished{kept, gone, again})
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			t.Fatalf("finish item %d: %v", i, e)
		}
	}
	if n := commandCalls(t, "hset") - before; n != 2 {
		t.Errorf("finish ran %d HSETs, want 2 (one a kept task, none for the deleted one)", n)
	}
	for id, state := range map[string]string{"kept": "completed", "again": "retry"} {
		got, err := r.rdb.HMGet(ctx, r.store.Task(id), "result", "state").Result()
		if err != nil {
			t.Fatal(err)
		}
		if got[0] != "result of "+id || got[1] != state {
			t.Errorf("%s: result %v, state %v; want %q, %s", id, got[0], got[1], "result of "+id, state)
		}
	}
	if n := r.rdb.Exists(ctx, r.store.Task("gone")).Val(); n != 0 {
		t.Errorf("the task not kept is still there")
	}
}
