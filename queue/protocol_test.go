package queue

import (
	"testing"

	"github.com/hibiken/asynq"
)

func TestBlockWaitsFor(t *testing.T) {
	for reason, want := range map[string]string{BlockRefused: WaitingPushback, BlockQuota: WaitingPushback,
		BlockStatedLimit: WaitingPushback, "paused by ops": WaitingPause, "": WaitingPause} {
		if got := BlockWaitsFor(reason); got != want {
			t.Errorf("BlockWaitsFor(%q): got %q, want %q", reason, got, want)
		}
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
}
