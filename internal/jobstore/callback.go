package jobstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/script"
)

// Callback deliveries. A job enqueued with Entry.Callback carries, in its
// task hash's cb field, the name of its upstream's due set
// (CallbacksDueKey), a sorted set of job id -> µs when its delivery is due.
// The script that makes the job final (finish.lua for succeeded and dead,
// cancel.lua for cancelled) adds the id, due at once, and sets the task's
// callback fields: cbs (state: pending, delivered, failed), cba (attempts
// made), cbe (the last attempt's error), cbn (how many final states the
// job reached: each is a delivery of its own). A deliverer claims due ids
// (ClaimCallbacks), which moves each id's score to the end of its lease, and
// records each attempt's outcome (CallbackDone). Every field lives in the
// task hash and goes with it when the job's retention ends; an id whose
// task is gone leaves the due set at its next claim.

// CallbacksDueKey is the upstream's due set of callback deliveries.
func (s Space) CallbacksDueKey() string { return s.our + "cb" }

// FailedCallbacksKey is the upstream's set of jobs whose callback failed
// for good: job id -> Unix seconds when, for a week (or until retried).
func (s Space) FailedCallbacksKey() string { return s.our + "cbf" }

// CallbacksFailedSince counts the upstream's callbacks that failed for good
// since t and were not retried since (jobs deleted in the meantime
// included: the set is kept by the scripts, not swept).
func (s Space) CallbacksFailedSince(ctx context.Context, rdb redis.Cmdable, t time.Time) (int64, error) {
	return rdb.ZCount(ctx, s.FailedCallbacksKey(), strconv.FormatInt(t.Unix(), 10), "+inf").Result()
}

// callbackArg is enqueue.lua's ARGV[14].
func (e Entry) callbackArg(s Space) string {
	if !e.Callback {
		return ""
	}
	return s.CallbacksDueKey()
}

// CallbackState is a job's callback as its task hash keeps it.
type CallbackState struct {
	// State is "pending" (due, being delivered, or waiting to retry),
	// "delivered" (a 2xx came back) or "failed" (attempts ran out); ""
	// when the job has no callback or has not reached a final state.
	State     string
	Attempts  int
	LastError string
	// Seq counts the job's final states (a job retried after it died
	// reaches another): each is delivered under a webhook-id of its own.
	Seq int
}

// Callback states.
const (
	CallbackPending   = "pending"
	CallbackDelivered = "delivered"
	CallbackFailed    = "failed"
)

// ReadCallback reads job id's callback fields.
func (s Space) ReadCallback(ctx context.Context, rdb redis.Cmdable, id string) (CallbackState, error) {
	v, err := rdb.HMGet(ctx, s.TaskKey(id), "cbs", "cba", "cbe", "cbn").Result()
	if err != nil {
		return CallbackState{}, err
	}
	str := func(i int) string { x, _ := v[i].(string); return x }
	a, _ := strconv.Atoi(str(1))
	n, _ := strconv.Atoi(str(3))
	return CallbackState{State: str(0), Attempts: a, LastError: str(2), Seq: n}, nil
}

// CallbackClaim is one delivery a deliverer claimed: the job, which
// attempt this is (from 1; the claim's fence) and the job's final state's
// Seq.
type CallbackClaim struct {
	ID      string
	Attempt int
	Seq     int
}

// nowArg is a script's now override: "" for Redis's clock.
func nowArg(now time.Time) string {
	if now.IsZero() {
		return ""
	}
	return strconv.FormatInt(now.UnixMicro(), 10)
}

// CallbacksChannel is where the scripts publish the id of a delivery that
// became due (a job made final, a retry): the due set's own name, as a
// channel.
func (s Space) CallbacksChannel() string { return s.CallbacksDueKey() }

// ClaimCallbacks claims up to limit due deliveries of the upstream for
// lease: until the lease ends no other caller claims them, and a claim
// whose holder dies is due again once it does. Each claim spends an attempt
// of maxAttempts; a delivery whose holder died on its last attempt fails.
// A zero now is Redis's clock (tests pass their own).
func (s Space) ClaimCallbacks(ctx context.Context, rdb redis.Scripter, now time.Time, lease time.Duration, limit, maxAttempts int) ([]CallbackClaim, error) {
	c, _, err := s.ClaimCallbacksNext(ctx, rdb, now, lease, limit, maxAttempts)
	return c, err
}

// ClaimCallbacksNext is ClaimCallbacks that also says how long until the
// earliest delivery left is due (a retry's backoff, a lease ending), on
// Redis's clock: 0 when one is due already, -1 when none is left.
func (s Space) ClaimCallbacksNext(ctx context.Context, rdb redis.Scripter, now time.Time, lease time.Duration, limit, maxAttempts int) ([]CallbackClaim, time.Duration, error) {
	if limit <= 0 || lease <= 0 || maxAttempts <= 0 {
		return nil, 0, fmt.Errorf("claim callbacks: limit %d, lease %v, max attempts %d: want each more than 0", limit, lease, maxAttempts)
	}
	v, err := script.Run(ctx, rdb, "claim callbacks", callbackClaimScript, []string{s.CallbacksDueKey(), s.FailedCallbacksKey()},
		nowArg(now), lease.Microseconds(), limit, s.taskPrefix(), maxAttempts)
	if err != nil {
		return nil, 0, err
	}
	rows, ok := v.([]any)
	if !ok || len(rows)%3 != 1 {
		return nil, 0, fmt.Errorf("script claim callbacks: reply %v, want a wait and triples", v)
	}
	next := time.Duration(-1)
	if us, _ := rows[0].(int64); us >= 0 {
		next = time.Duration(us) * time.Microsecond
	}
	rows = rows[1:]
	out := make([]CallbackClaim, 0, len(rows)/3)
	for i := 0; i < len(rows); i += 3 {
		id, _ := rows[i].(string)
		a, _ := rows[i+1].(int64)
		var n int
		switch x := rows[i+2].(type) {
		case string:
			n, _ = strconv.Atoi(x)
		case int64:
			n = int(x)
		}
		out = append(out, CallbackClaim{ID: id, Attempt: int(a), Seq: n})
	}
	return out, next, nil
}

// CallbackOutcome is what CallbackDone recorded.
type CallbackOutcome int

const (
	// CallbackStale: the claim was no longer the caller's (its lease ran
	// out and another claimed it); nothing changed.
	CallbackStale CallbackOutcome = iota
	// CallbackWasDelivered: done, for good.
	CallbackWasDelivered
	// CallbackDueAgain: failed, and due again after the backoff.
	CallbackDueAgain
	// CallbackGaveUp: failed on its last attempt.
	CallbackGaveUp
)

func (o CallbackOutcome) String() string {
	switch o {
	case CallbackStale:
		return "stale"
	case CallbackWasDelivered:
		return "delivered"
	case CallbackDueAgain:
		return "retry"
	case CallbackGaveUp:
		return "failed"
	}
	return "CallbackOutcome(" + strconv.Itoa(int(o)) + ")"
}

// CallbackDone records how claim c's attempt went: delivered, or failed
// with errMsg and, if it was not the last of maxAttempts, due again in
// retryIn. A zero now is Redis's clock.
func (s Space) CallbackDone(ctx context.Context, rdb redis.Scripter, now time.Time, c CallbackClaim, delivered bool, errMsg string, retryIn time.Duration, maxAttempts int) (CallbackOutcome, error) {
	ok := "0"
	if delivered {
		ok, errMsg = "1", ""
	}
	v, err := script.Run(ctx, rdb, "callback done", callbackDoneScript, []string{s.CallbacksDueKey(), s.TaskKey(c.ID), s.FailedCallbacksKey()},
		nowArg(now), c.ID, c.Attempt, ok, errMsg, max(retryIn, 0).Microseconds(), maxAttempts, max(c.Seq, 1))
	if err != nil {
		return CallbackStale, err
	}
	n, _ := v.(int64)
	return CallbackOutcome(n), nil
}

// ErrNoCallbackToRetry is RetryCallback's error for a job whose callback
// has not failed; it wraps the state found ("" for none).
var ErrNoCallbackToRetry = errors.New("no failed callback to retry")

// RetryCallback queues job id's failed callback delivery again, due now,
// its attempts counted afresh. A job whose callback has not failed (or that
// has none) is left alone with ErrNoCallbackToRetry; the state found is
// returned either way.
func (s Space) RetryCallback(ctx context.Context, rdb redis.Scripter, id string) (string, error) {
	v, err := script.Run(ctx, rdb, "retry callback", callbackRetryScript, []string{s.CallbacksDueKey(), s.TaskKey(id), s.FailedCallbacksKey()}, "", id)
	if err != nil {
		return "", err
	}
	st, _ := v.(string)
	if st != CallbackFailed {
		return st, ErrNoCallbackToRetry
	}
	return st, nil
}
