package jobstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/leaky"
)

// Tests of what the take and finish leave out to save commands, and that
// they leave out nothing that is needed.

// A take that gives all it was asked for looks at the lease set at most
// once a second (its caller comes straight back); one that comes back
// short always does, so a lapsed lease is still found.
func TestFullTakesCheckLeasesOnceASecond(t *testing.T) {
	r := newRig(t, jobstore.RedisServer().Client(t), shaper.Upstream{Name: "leasecheck", BaseURL: "https://x.example",
		Limits: []leaky.Limit{leaky.PerSecond(100000)}}, time.Second)
	ctx := context.Background()
	for _, id := range []string{"a", "b", "c", "d"} {
		r.add(job{id: id})
	}
	// A lease that ran out long ago.
	if err := r.rdb.ZAdd(ctx, r.store.Lease(), redis.Z{Score: 1, Member: "ghost"}).Err(); err != nil {
		t.Fatal(err)
	}
	if tk := r.take(1); len(tk.Jobs) != 1 || !tk.Expired {
		t.Fatalf("first full take: %d jobs, expired %v; want 1, true (the first take checks)", len(tk.Jobs), tk.Expired)
	}
	if tk := r.take(1); len(tk.Jobs) != 1 || tk.Expired {
		t.Fatalf("second full take within the second: %d jobs, expired %v; want 1, false (not checked)", len(tk.Jobs), tk.Expired)
	}
	if tk := r.take(5); len(tk.Jobs) != 2 || !tk.Expired {
		t.Fatalf("short take: %d jobs, expired %v; want 2, true", len(tk.Jobs), tk.Expired)
	}
	if testing.Short() {
		return
	}
	r.add(job{id: "e"}, job{id: "f"})
	time.Sleep(1100 * time.Millisecond)
	if tk := r.take(1); len(tk.Jobs) != 1 || !tk.Expired {
		t.Fatalf("full take a second later: %d jobs, expired %v; want 1, true", len(tk.Jobs), tk.Expired)
	}
}

// Finish reads a task's cb field only for an item that says it has a
// callback, or that knows no lane (its caller could not decode the job);
// Callbacks declares the due set, where the delivery goes.
func TestFinishReadsCallbackOnlyWhenSaid(t *testing.T) {
	r := cbRig(t)
	ctx := context.Background()
	r.addCallback("said", "unsaid", "undecoded")
	if got := r.takeIDs(3); len(got) != 3 {
		t.Fatalf("took %v, want 3", got)
	}
	var items []jobstore.Finished
	for _, id := range []string{"said", "unsaid", "undecoded"} {
		it := jobstore.Finished{ID: id, Lane: r.lane[id], Msg: &jobstore.Message{Type: "http", ID: id, Queue: r.space.Queue},
			Outcome: jobstore.Succeeded, Retention: time.Hour, Callback: id == "said"}
		if id == "undecoded" {
			it.Lane = ""
		}
		items = append(items, it)
	}
	errs, err := jobstore.Finish(ctx, r.rdb, r.store, r.space.CountsKey(), r.space.BacklogKey(), items,
		jobstore.Callbacks(r.space.CallbacksDueKey()))
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			t.Fatalf("finish %s: %v", items[i].ID, e)
		}
	}
	due := r.due()
	for id, want := range map[string]bool{"said": true, "unsaid": false, "undecoded": true} {
		if _, got := due[id]; got != want {
			t.Errorf("%s: delivery due %v, want %v (due: %v)", id, got, want, due)
		}
	}
}
