package jobstore_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/leaky"
)

// A queue paused through asynq's own Inspector gives no job, whatever is
// ready, and says to look again within PausedPoll; unpaused, it gives its
// jobs again. Both views of the hold say so.
func TestAsynqPauseIsHonoured(t *testing.T) {
	ctx := context.Background()
	rdb := srv().Client(t)
	r := newRig(t, rdb, fast("apause"), 50*time.Millisecond)
	insp := asynq.NewInspectorFromRedisClient(rdb)
	r.add(job{id: "a1", tenant: "t"}, job{id: "a2", tenant: "t"})
	if err := insp.PauseQueue(r.space.Queue); err != nil {
		t.Fatal(err)
	}
	tk := r.take(10)
	if len(tk.Jobs) != 0 {
		t.Fatalf("took %v from a queue paused through asynq, want none", ids(tk))
	}
	if tk.Reason != leaky.ReasonBlocked || tk.Wait <= 0 || tk.Wait > jobstore.PausedPoll {
		t.Fatalf("take of a paused queue: reason %v, wait %v; want blocked, within %v", tk.Reason, tk.Wait, jobstore.PausedPoll)
	}
	r.check("paused take")

	bk := r.bucket.Layout().Block
	h, err := r.space.ReadHolds(ctx, rdb, bk)
	if err != nil {
		t.Fatal(err)
	}
	if !h.AsynqPaused || time.Since(h.PausedSince) > time.Minute || !h.BlockedUntil.IsZero() {
		t.Fatalf("holds: paused %v since %v, blocked until %v; want paused through asynq just now, no block", h.AsynqPaused, h.PausedSince, h.BlockedUntil)
	}
	if got := h.Counts["default"]["pending"]; got != 2 {
		t.Fatalf("holds: %d pending, want 2 (counts %v)", got, h.Counts)
	}
	jh, err := r.space.ReadJobHold(ctx, rdb, bk, "a1")
	if err != nil {
		t.Fatal(err)
	}
	if !jh.AsynqPaused || jh.State != "aggregating" {
		t.Fatalf("job hold: paused %v, state %q; want paused, aggregating", jh.AsynqPaused, jh.State)
	}

	if err := insp.UnpauseQueue(r.space.Queue); err != nil {
		t.Fatal(err)
	}
	if got := r.takeIDs(10); !slices.Equal(got, []string{"a1", "a2"}) {
		t.Fatalf("took %v once unpaused, want [a1 a2]", got)
	}
	r.check("unpaused take")
}

// A partition parked for its limits is seen as such: its waiting jobs
// are counted parked in their lane, and each reads its park's end; once
// the park ends, neither view shows it.
func TestParkedPartitionHolds(t *testing.T) {
	ctx := context.Background()
	rdb := srv().Client(t)
	u := fast("parkhold")
	u.Lanes = map[string]int{"default": 1, "bulk": 1}
	u.PartitionLimits = []leaky.Limit{{Rate: 1, Per: 400 * time.Millisecond}}
	r := newRig(t, rdb, u, 50*time.Millisecond)
	r.add(job{id: "p1", tenant: "t", partition: "a.example"}, job{id: "p2", tenant: "t", partition: "a.example"},
		job{id: "p3", tenant: "t", partition: "a.example"}, job{id: "b1", lane: "bulk", tenant: "t", partition: "b.example"})
	if got := r.takeIDs(10); !slices.Equal(got, []string{"p1", "b1"}) && !slices.Equal(got, []string{"b1", "p1"}) {
		t.Fatalf("took %v, want p1 and b1", got)
	}
	r.check("take")
	bk := r.bucket.Layout().Block
	h, err := r.space.ReadHolds(ctx, rdb, bk)
	if err != nil {
		t.Fatal(err)
	}
	if h.Parked["default"] != 2 || len(h.Parked) != 1 || h.Partial || h.AsynqPaused {
		t.Fatalf("holds: parked %v (partial %v, paused %v); want default=2", h.Parked, h.Partial, h.AsynqPaused)
	}
	jh, err := r.space.ReadJobHold(ctx, rdb, bk, "p2")
	if err != nil {
		t.Fatal(err)
	}
	if wait := time.Until(jh.ParkedUntil); wait <= 0 || wait > 450*time.Millisecond {
		t.Fatalf("p2 parked until %v (in %v), want within the partition's 400ms", jh.ParkedUntil, wait)
	}
	time.Sleep(time.Until(jh.ParkedUntil) + 10*time.Millisecond)
	if h, err = r.space.ReadHolds(ctx, rdb, bk); err != nil || len(h.Parked) != 0 {
		t.Fatalf("holds after the park ended: parked %v, %v; want none", h.Parked, err)
	}
	if jh, err = r.space.ReadJobHold(ctx, rdb, bk, "p2"); err != nil || !jh.ParkedUntil.IsZero() {
		t.Fatalf("p2 after the park ended: parked until %v, %v; want not parked", jh.ParkedUntil, err)
	}
	r.finish(jobstore.Succeeded, time.Time{}, "p1", "b1")
	r.check("finish")
}

// A job handed back reads as deferred; one that failed does not.
func TestJobHoldDeferred(t *testing.T) {
	ctx := context.Background()
	rdb := srv().Client(t)
	r := newRig(t, rdb, fast("deferhold"), 50*time.Millisecond)
	r.add(job{id: "d1", tenant: "t"}, job{id: "f1", tenant: "t"})
	if got := r.takeIDs(10); len(got) != 2 {
		t.Fatalf("took %v, want both", got)
	}
	r.finish(jobstore.Retry, time.Now().Add(time.Hour), "d1")
	r.fail(time.Now().Add(time.Hour), "f1")
	r.check("retry")
	for id, want := range map[string]bool{"d1": true, "f1": false} {
		jh, err := r.space.ReadJobHold(ctx, rdb, r.bucket.Layout().Block, id)
		if err != nil {
			t.Fatal(err)
		}
		if jh.State != "retry" || jh.Deferred != want {
			t.Errorf("%s: state %q, deferred %v; want retry, %v", id, jh.State, jh.Deferred, want)
		}
	}
	if err := r.space.Cancel(ctx, rdb, "d1"); err != nil {
		t.Fatal(err)
	}
	if err := r.space.Cancel(ctx, rdb, "f1"); err != nil {
		t.Fatal(err)
	}
	r.check("cancel")
}
