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

// A take that gives all it was asked for, after one that did, and within
// the look's period of the last full look, leaves the due sets alone and
// does not look at the leases (its caller comes straight back); one that
// comes back short always looks, so a lapsed lease is still found and a
// due job still moves.
func TestFullTakesLookOncePerPeriod(t *testing.T) {
	r := newRig(t, jobstore.RedisServer().Client(t), shaper.Upstream{Name: "look", BaseURL: "https://x.example",
		Limits: []leaky.Limit{leaky.PerSecond(100000)}}, time.Second)
	r.taker.SetLookEvery(time.Hour)
	ctx := context.Background()
	for _, id := range []string{"a", "b", "c", "d"} {
		r.add(job{id: id})
	}
	// A lease that ran out long ago.
	if err := r.rdb.ZAdd(ctx, r.store.Lease(), redis.Z{Score: 1, Member: "ghost"}).Err(); err != nil {
		t.Fatal(err)
	}
	if tk := r.take(1); len(tk.Jobs) != 1 || !tk.Expired {
		t.Fatalf("first take: %d jobs, expired %v; want 1, true (the first take looks)", len(tk.Jobs), tk.Expired)
	}
	// Due at once, but left for a later take.
	r.add(job{id: "due", at: time.Now().Add(50 * time.Millisecond)})
	time.Sleep(100 * time.Millisecond)
	if tk := r.take(1); len(tk.Jobs) != 1 || tk.Expired {
		t.Fatalf("second take, full after a full one: %d jobs, expired %v; want 1, false (no look)", len(tk.Jobs), tk.Expired)
	}
	// Short, though it did not look: it reads what comes due, and the
	// leases.
	if tk := r.take(5); len(tk.Jobs) != 2 || !tk.Expired || tk.Next <= 0 || tk.Next > time.Millisecond {
		t.Fatalf("short take: %d jobs, expired %v, next %v; want 2, true, the due job at once", len(tk.Jobs), tk.Expired, tk.Next)
	}
	if n := r.rdb.ZCard(ctx, r.store.Scheduled()).Val(); n != 1 {
		t.Fatalf("scheduled set holds %d jobs, want 1 (not moved by a take that did not look)", n)
	}
	if got := r.takeIDs(5); len(got) != 1 || got[0] != "due" {
		t.Fatalf("take after a short one: %v, want [due] (it looks)", got)
	}
	r.add(job{id: "e"}, job{id: "f"})
	if got := r.takeIDs(1); len(got) != 1 {
		t.Fatalf("take: %v, want one job", got)
	}
	r.taker.SetLookEvery(0)
	// Full after a full one, but the period is over: it looks.
	if tk := r.take(1); len(tk.Jobs) != 1 || !tk.Expired {
		t.Fatalf("take after the period: %d jobs, expired %v; want 1, true", len(tk.Jobs), tk.Expired)
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
