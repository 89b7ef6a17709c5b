package queue

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

func TestDeferralProtocol(t *testing.T) {
	d := &Deferral{Delay: time.Second, Why: "upstream blocked"}
	if IsFailure(d) || IsFailure(fmt.Errorf("wrapped: %w", d)) {
		t.Error("a deferral counts as a failure")
	}
	if !IsFailure(errors.New("upstream answered 500")) {
		t.Error("a plain error does not count as a failure")
	}
	// asynq keeps only the message; it must still say "deferred".
	if !deferred(d.Error()) || deferred("upstream answered 500") {
		t.Errorf("deferred(%q) and deferred of a failure disagree with Deferral", d.Error())
	}
}

func TestAttemptCounting(t *testing.T) {
	for _, tc := range []struct {
		state   asynq.TaskState
		retried int
		want    int
	}{
		{asynq.TaskStatePending, 0, 0},
		{asynq.TaskStateScheduled, 0, 0},
		{asynq.TaskStateRetry, 2, 2},
		{asynq.TaskStateActive, 2, 3},
		{asynq.TaskStateCompleted, 0, 1},
		{asynq.TaskStateArchived, 2, 3},
	} {
		if got := attemptsMade(tc.state, tc.retried); got != tc.want {
			t.Errorf("attemptsMade(%v, %d): got %d, want %d", tc.state, tc.retried, got, tc.want)
		}
	}
	job := &Job{MaxAttempts: 3}
	if LastAttempt(job, 2) || !LastAttempt(job, 3) {
		t.Error("LastAttempt: want attempt 3 of 3 to be the last, and 2 not")
	}
	// asynq would archive a job itself once retried reaches MaxRetry; the
	// worker's own last attempt must come first.
	if retriedAtLast := 3 - 1; retriedAtLast >= asynqMaxRetry(job.MaxAttempts) {
		t.Errorf("asynq MaxRetry %d: asynq would end the job before its last attempt", asynqMaxRetry(job.MaxAttempts))
	}
}
