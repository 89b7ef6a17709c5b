package jobstore

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestRecoveryLeavesARetakenTaskAlone: a recovery lists a task whose lease
// ran out, but before it ends the task another caller recovers it and a
// worker takes it again under a fresh lease. The late recovery must not
// end the task the worker now holds (it would be sent again).
func TestRecoveryLeavesARetakenTaskAlone(t *testing.T) {
	e := newEnv(t, "race")
	ctx := context.Background()
	now := time.Now()
	e.enqueue("x", "default", "")
	e.take("x", now.Add(-time.Second))
	exp, err := ExpiredLeases(ctx, e.rdb, e.k, now, 10)
	if err != nil || len(exp) != 1 {
		t.Fatalf("expired leases %v, %v; want x", exp, err)
	}
	// Meanwhile: x was recovered and taken again, with a lease a minute on.
	must(t, e.rdb.ZAdd(ctx, e.k.Lease(), redisZ(now.Add(time.Minute), "x")).Err())
	errs, err := Finish(ctx, e.rdb, e.k, e.counts, e.pbacklog, []Finished{{
		ID: "x", Lane: "default", Msg: exp[0].Msg, Outcome: Retry, Failure: true, RetryAt: now,
		ErrMsg: LeaseExpiredError, LeaseLapsedBy: now,
	}})
	if err != nil || !errors.Is(errs[0], ErrNotActive) {
		t.Fatalf("late recovery: %v, %v; want ErrNotActive", errs, err)
	}
	if st := e.info("x").State.String(); st != "active" {
		t.Fatalf("x is %s after the late recovery, want still active", st)
	}
	// Without the guard the same call ends it: the test can fail.
	errs, err = Finish(ctx, e.rdb, e.k, e.counts, e.pbacklog, []Finished{{
		ID: "x", Lane: "default", Msg: exp[0].Msg, Outcome: Retry, Failure: true, RetryAt: now, ErrMsg: LeaseExpiredError,
	}})
	if err != nil || errs[0] != nil {
		t.Fatalf("unguarded finish: %v, %v; want it to end x", errs, err)
	}
}
