package queue

import (
	"context"
	"testing"
	"time"

	"github.com/shaperhq/shaper/internal/jobstore"
)

// TestWaitReadsAgainAfterReconnect: a job made final while the
// announcement is lost (a finish that announces nothing stands for a
// message published while the subscription was down) is still answered
// when the subscription is made again, without waiting out the wait: every
// waiter reads its job again then.
func TestWaitReadsAgainAfterReconnect(t *testing.T) {
	r := newWaitRig(t)
	ctx := context.Background()
	info := r.enqueue(Job{Path: "/v1/charges"})
	type answer struct {
		info *Info
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		i, err := r.q.Wait(ctx, info.ID, "", 30*time.Second)
		done <- answer{i, err}
	}()
	for deadline := time.Now().Add(5 * time.Second); r.q.Waiters() != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the wait never registered")
		}
	}
	// Let the subscription be made and its first wake-up read, so that
	// what answers the wait below is the reconnect's.
	for deadline := time.Now().Add(5 * time.Second); r.q.rdb.PubSubNumSub(ctx, jobstore.FinalChannel("")).Val()[jobstore.FinalChannel("")] != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the subscription was never made")
		}
	}
	time.Sleep(100 * time.Millisecond)
	r.takeAndEnd(func(_ string, f *jobstore.Finished) bool {
		f.Outcome, f.Retention = jobstore.Succeeded, time.Hour
		return true
	})
	select {
	case a := <-done:
		t.Fatalf("answered %v, %v with no announcement and no reconnect", a.info.State, a.err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := r.q.rdb.ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-done:
		if a.err != nil || a.info.State != StateSucceeded {
			t.Fatalf("after the reconnect: got %+v, %v; want succeeded", a.info, a.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the wait was not answered after the subscription was made again")
	}
}

// TestWaitAll: one wait for several jobs (a duplicate among them) answers
// each once every one is final; a job not there is an error at once that
// ends no other's wait.
func TestWaitAll(t *testing.T) {
	r := newWaitRig(t)
	ctx := context.Background()
	a, b := r.enqueue(Job{Path: "/a"}), r.enqueue(Job{Path: "/b"})
	ids := []string{a.ID, b.ID, a.ID, "stripe.default.nope"}
	type answer struct {
		infos []*Info
		errs  []error
	}
	done := make(chan answer, 1)
	go func() {
		infos, errs := r.q.WaitAll(ctx, ids, "", 30*time.Second)
		done <- answer{infos, errs}
	}()
	for deadline := time.Now().Add(5 * time.Second); r.q.Waiters() != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the wait never registered")
		}
	}
	if _, err := r.q.Cancel(ctx, a.ID, ""); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-done:
		t.Fatalf("answered with %s still queued: %+v", b.ID, got.errs)
	case <-time.After(200 * time.Millisecond):
	}
	if _, err := r.q.Cancel(ctx, b.ID, ""); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-done:
		for i, want := range []State{StateCancelled, StateCancelled, StateCancelled} {
			if got.errs[i] != nil || got.infos[i].State != want {
				t.Errorf("%s: got %v, %v; want %s", ids[i], got.infos[i], got.errs[i], want)
			}
		}
		if got.errs[3] == nil {
			t.Errorf("a job not there: got %v, want an error", got.infos[3])
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no answer after both jobs were cancelled")
	}
	if n := r.q.Waiters(); n != 0 {
		t.Errorf("%d waiters after the wait, want 0", n)
	}
}
