package jobstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/leaky"
)

// cbRig is a rig whose jobs have callbacks.
func cbRig(t *testing.T) *rig {
	t.Helper()
	return newRig(t, jobstore.RedisServer().Client(t), shaper.Upstream{Name: "cb", BaseURL: "https://x.example",
		Limits: []leaky.Limit{leaky.PerSecond(1000)}}, time.Second)
}

func (r *rig) addCallback(ids ...string) {
	r.t.Helper()
	for _, id := range ids {
		e := r.entry(job{id: id})
		e.Callback = true
		if ok, err := r.space.Enqueue(context.Background(), r.rdb, e); err != nil || !ok {
			r.t.Fatalf("enqueue %s: created %v, err %v", id, ok, err)
		}
		r.ids = append(r.ids, id)
		r.lane[id] = e.Lane
		r.cb[id] = true
	}
}

// finishKept ends taken jobs with o, a succeeded one kept for an hour.
func (r *rig) finishKept(o jobstore.Outcome, ids ...string) {
	r.t.Helper()
	var items []jobstore.Finished
	for _, id := range ids {
		items = append(items, jobstore.Finished{ID: id, Lane: r.lane[id], Msg: &jobstore.Message{Type: "http", ID: id, Queue: r.space.Queue},
			Outcome: o, Retention: time.Hour, ErrMsg: "boom", Callback: r.cb[id]})
	}
	errs, err := jobstore.Finish(context.Background(), r.rdb, r.store, r.space.CountsKey(), r.space.BacklogKey(), items,
		jobstore.Callbacks(r.space.CallbacksDueKey()))
	if err != nil {
		r.t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			r.t.Fatalf("finish %s: %v", ids[i], e)
		}
	}
}

func (r *rig) due() map[string]float64 {
	r.t.Helper()
	zs, err := r.rdb.ZRangeWithScores(context.Background(), r.space.CallbacksDueKey(), 0, -1).Result()
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[string]float64{}
	for _, z := range zs {
		out[z.Member.(string)] = z.Score
	}
	return out
}

func (r *rig) callback(id string) jobstore.CallbackState {
	r.t.Helper()
	st, err := r.space.ReadCallback(context.Background(), r.rdb, id)
	if err != nil {
		r.t.Fatal(err)
	}
	return st
}

// Every way a job becomes final records its delivery in the same script:
// succeeded and dead through Finish, dead through Recover (a worker that
// died on the last attempt), cancelled through Cancel. A job without a
// callback, and one that only retries, records none.
func TestEveryFinalStateRecordsItsCallback(t *testing.T) {
	r := cbRig(t)
	ctx := context.Background()
	r.addCallback("ok", "dead", "retry", "lost", "cancel")
	r.add(job{id: "plain"})
	if err := r.space.Cancel(ctx, r.rdb, "cancel"); err != nil {
		t.Fatal(err)
	}
	if err := r.space.Cancel(ctx, r.rdb, "cancel"); err == nil {
		// Cancelled once already: not waiting any more.
		t.Fatalf("second cancel: got no error, want one")
	}
	got := r.takeIDs(10)
	if len(got) != 5 {
		t.Fatalf("took %v, want 5 jobs", got)
	}
	r.finishKept(jobstore.Succeeded, "ok", "plain")
	r.finishKept(jobstore.Dead, "dead")
	r.fail(time.Now().Add(time.Hour), "retry")
	// "lost": its worker died on its only attempt (Retry 0, so Exhausted).
	n, err := jobstore.Recover(ctx, r.rdb, r.store, r.space.CountsKey(), r.space.BacklogKey(), time.Now().Add(time.Hour), 10)
	if err != nil || n != 1 {
		t.Fatalf("recover: got %d, %v; want 1, nil", n, err)
	}
	due := r.due()
	for _, id := range []string{"ok", "dead", "lost", "cancel"} {
		if _, ok := due[id]; !ok {
			t.Errorf("%s: no delivery due, want one (due: %v)", id, due)
		}
		if st := r.callback(id); st.State != jobstore.CallbackPending || st.Attempts != 0 || st.Seq != 1 {
			t.Errorf("%s: got %+v, want pending, 0 attempts, seq 1", id, st)
		}
	}
	for _, id := range []string{"plain", "retry"} {
		if _, ok := due[id]; ok {
			t.Errorf("%s: a delivery is due, want none", id)
		}
		if st := r.callback(id); st.State != "" {
			t.Errorf("%s: got state %q, want none", id, st.State)
		}
	}
}

// A claim leases: nobody else claims the id until the lease ends, then it
// is claimed again (its claimer died) with the next attempt number, and the
// first claimer's late outcome changes nothing.
func TestClaimLeasesAndFences(t *testing.T) {
	r := cbRig(t)
	ctx := context.Background()
	r.addCallback("a")
	r.takeIDs(1)
	r.finishKept(jobstore.Succeeded, "a")
	now := time.Now().Add(time.Second)
	const most = 3
	c1, err := r.space.ClaimCallbacks(ctx, r.rdb, now, time.Minute, 10, most)
	if err != nil || len(c1) != 1 || c1[0].ID != "a" || c1[0].Attempt != 1 || c1[0].Seq != 1 {
		t.Fatalf("claim: got %+v, %v; want a, attempt 1, seq 1", c1, err)
	}
	if again, next, _ := r.space.ClaimCallbacksNext(ctx, r.rdb, now.Add(59*time.Second), time.Minute, 10, most); len(again) != 0 || next != time.Second {
		t.Fatalf("claim within the lease: got %+v, next due in %v; want none, and the lease's end in 1s", again, next)
	}
	c2, err := r.space.ClaimCallbacks(ctx, r.rdb, now.Add(61*time.Second), time.Minute, 10, most)
	if err != nil || len(c2) != 1 || c2[0].Attempt != 2 {
		t.Fatalf("claim after the lease: got %+v, %v; want attempt 2", c2, err)
	}
	out, err := r.space.CallbackDone(ctx, r.rdb, now.Add(62*time.Second), c1[0], true, "", 0, most)
	if err != nil || out != jobstore.CallbackStale {
		t.Fatalf("late outcome: got %v, %v; want stale", out, err)
	}
	out, err = r.space.CallbackDone(ctx, r.rdb, now.Add(62*time.Second), c2[0], false, "answered 500", 10*time.Second, most)
	if err != nil || out != jobstore.CallbackDueAgain {
		t.Fatalf("failed attempt: got %v, %v; want retry", out, err)
	}
	if st := r.callback("a"); st.State != jobstore.CallbackPending || st.Attempts != 2 || st.LastError != "answered 500" {
		t.Fatalf("after a failed attempt: got %+v", st)
	}
	if c, _ := r.space.ClaimCallbacks(ctx, r.rdb, now.Add(71*time.Second), time.Minute, 10, most); len(c) != 0 {
		t.Fatalf("claim during the backoff: got %+v, want none", c)
	}
	c3, err := r.space.ClaimCallbacks(ctx, r.rdb, now.Add(73*time.Second), time.Minute, 10, most)
	if err != nil || len(c3) != 1 || c3[0].Attempt != 3 {
		t.Fatalf("claim after the backoff: got %+v, %v; want attempt 3", c3, err)
	}
	out, err = r.space.CallbackDone(ctx, r.rdb, now.Add(74*time.Second), c3[0], true, "", 0, most)
	if err != nil || out != jobstore.CallbackWasDelivered {
		t.Fatalf("delivered: got %v, %v", out, err)
	}
	if st := r.callback("a"); st.State != jobstore.CallbackDelivered || st.Attempts != 3 || st.LastError != "" {
		t.Fatalf("after delivery: got %+v", st)
	}
	if len(r.due()) != 0 {
		t.Fatalf("due after delivery: %v, want none", r.due())
	}
	if _, next, _ := r.space.ClaimCallbacksNext(ctx, r.rdb, now.Add(75*time.Second), time.Minute, 10, most); next != -1 {
		t.Fatalf("next due with none left: got %v, want -1", next)
	}
	if _, err := r.space.RetryCallback(ctx, r.rdb, "a"); !errors.Is(err, jobstore.ErrNoCallbackToRetry) {
		t.Fatalf("retry a delivered callback: got %v, want ErrNoCallbackToRetry", err)
	}
}

// Attempts run out: the last failure fails the delivery for good, as does a
// claimer that died on the last attempt; a retry queues it again from 0.
func TestCallbackAttemptsRunOut(t *testing.T) {
	r := cbRig(t)
	ctx := context.Background()
	r.addCallback("a", "b")
	r.takeIDs(2)
	r.finishKept(jobstore.Dead, "a", "b")
	now := time.Now().Add(time.Second)
	cs, err := r.space.ClaimCallbacks(ctx, r.rdb, now, time.Minute, 10, 1)
	if err != nil || len(cs) != 2 {
		t.Fatalf("claim: got %+v, %v", cs, err)
	}
	for _, c := range cs {
		if c.ID != "a" {
			continue
		}
		out, err := r.space.CallbackDone(ctx, r.rdb, now, c, false, "answered 302 (redirects are not followed)", time.Second, 1)
		if err != nil || out != jobstore.CallbackGaveUp {
			t.Fatalf("last attempt failed: got %v, %v; want failed", out, err)
		}
	}
	// b's claimer died: past its lease, it fails rather than go again.
	if c, err := r.space.ClaimCallbacks(ctx, r.rdb, now.Add(2*time.Minute), time.Minute, 10, 1); err != nil || len(c) != 0 {
		t.Fatalf("claim after the last lease: got %+v, %v; want none", c, err)
	}
	if st := r.callback("a"); st.State != jobstore.CallbackFailed || st.Attempts != 1 || st.LastError == "" {
		t.Fatalf("a: got %+v, want failed after 1 attempt", st)
	}
	if st := r.callback("b"); st.State != jobstore.CallbackFailed || st.LastError == "" {
		t.Fatalf("b: got %+v, want failed (lease expired)", st)
	}
	if n, err := r.space.CallbacksFailedSince(ctx, r.rdb, now.Add(-time.Hour)); err != nil || n != 2 {
		t.Fatalf("failed since an hour ago: got %d, %v; want 2", n, err)
	}
	if n, _ := r.space.CallbacksFailedSince(ctx, r.rdb, now.Add(time.Hour)); n != 0 {
		t.Fatalf("failed since an hour ahead: got %d, want 0", n)
	}
	if st, err := r.space.RetryCallback(ctx, r.rdb, "a"); err != nil || st != jobstore.CallbackFailed {
		t.Fatalf("retry: got %q, %v", st, err)
	}
	if st := r.callback("a"); st.State != jobstore.CallbackPending || st.Attempts != 0 {
		t.Fatalf("after retry: got %+v, want pending, 0 attempts", st)
	}
	if n, _ := r.space.CallbacksFailedSince(ctx, r.rdb, now.Add(-time.Hour)); n != 1 {
		t.Fatalf("failed after a's retry: got %d, want 1 (b)", n)
	}
	if c, err := r.space.ClaimCallbacks(ctx, r.rdb, time.Time{}, time.Minute, 10, 1); err != nil || len(c) != 1 || c[0].ID != "a" || c[0].Attempt != 1 {
		t.Fatalf("claim after retry: got %+v, %v; want a, attempt 1", c, err)
	}
	if _, err := r.space.RetryCallback(ctx, r.rdb, "nosuch"); !errors.Is(err, jobstore.ErrNoCallbackToRetry) {
		t.Fatalf("retry of no job: got %v, want ErrNoCallbackToRetry", err)
	}
}

// A delivery whose job is gone (its retention ended) leaves the due set at
// the next claim instead of being delivered.
func TestClaimDropsGoneJobs(t *testing.T) {
	r := cbRig(t)
	ctx := context.Background()
	r.addCallback("a")
	r.takeIDs(1)
	r.finishKept(jobstore.Succeeded, "a")
	if err := r.rdb.Del(ctx, r.space.TaskKey("a")).Err(); err != nil {
		t.Fatal(err)
	}
	if c, err := r.space.ClaimCallbacks(ctx, r.rdb, time.Now().Add(time.Second), time.Minute, 10, 3); err != nil || len(c) != 0 {
		t.Fatalf("claim: got %+v, %v; want none", c, err)
	}
	if len(r.due()) != 0 {
		t.Fatalf("due: %v, want none", r.due())
	}
}

// A job whose callback is still to be delivered outlives its bounds: the
// count bound (result_max_count) and the retention both pass over it, and
// it goes at a later trim, once its callback was delivered. Without that,
// a delivery due to a job dropped first would be lost.
func TestPendingCallbacksOutliveTheirBounds(t *testing.T) {
	r := cbRig(t)
	ctx := context.Background()
	r.addCallback("a", "b")
	r.add(job{id: "c"}, job{id: "d"})
	if got := r.takeIDs(10); len(got) != 4 {
		t.Fatalf("took %v, want 4 jobs", got)
	}
	r.finishKept(jobstore.Succeeded, "a", "b", "c", "d")
	exists := func(id string) bool { return r.rdb.Exists(ctx, r.space.TaskKey(id)).Val() == 1 }
	// A bound of one: the oldest go, but not the two waiting for their
	// callbacks.
	n, err := jobstore.DeleteExpired(ctx, r.rdb, r.store, r.space.CountsKey(), jobstore.Completed, time.Unix(0, 0), 100, jobstore.Bounds{Completed: 1})
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]bool{"a": true, "b": true} {
		if exists(id) != want {
			t.Errorf("after the count bound: %s exists %v, want %v", id, !want, want)
		}
	}
	if n != 1 || exists("c") == exists("d") {
		t.Errorf("after the count bound: deleted %d, c %v, d %v; want 1 of c and d deleted", n, exists("c"), exists("d"))
	}
	// Past their retention: still kept while pending.
	if _, err := jobstore.DeleteExpired(ctx, r.rdb, r.store, r.space.CountsKey(), jobstore.Completed, time.Now().Add(2*time.Hour), 100); err != nil {
		t.Fatal(err)
	}
	if !exists("a") || !exists("b") || exists("c") || exists("d") {
		t.Errorf("past retention: a %v b %v c %v d %v, want only a and b", exists("a"), exists("b"), exists("c"), exists("d"))
	}
	if z := r.rdb.ZCard(ctx, r.store.Completed()).Val(); z != 2 {
		t.Errorf("the completed set holds %d, want the 2 kept", z)
	}
	// a's callback is delivered: then it goes as any other.
	claims, err := r.space.ClaimCallbacks(ctx, r.rdb, time.Time{}, time.Minute, 10, 12)
	if err != nil || len(claims) != 2 {
		t.Fatalf("claim: %v, %v; want 2", claims, err)
	}
	for _, c := range claims {
		if c.ID == "a" {
			if o, err := r.space.CallbackDone(ctx, r.rdb, time.Time{}, c, true, "", 0, 12); err != nil || o != jobstore.CallbackWasDelivered {
				t.Fatalf("done: %v, %v", o, err)
			}
		}
	}
	if _, err := jobstore.DeleteExpired(ctx, r.rdb, r.store, r.space.CountsKey(), jobstore.Completed, time.Now().Add(2*time.Hour), 100); err != nil {
		t.Fatal(err)
	}
	if exists("a") || !exists("b") {
		t.Errorf("after a's delivery: a %v b %v, want only b", exists("a"), exists("b"))
	}
}
