package queue

import (
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

func TestDeferralProtocol(t *testing.T) {
	d := &Deferral{Delay: time.Second, For: WaitingPushback, Why: "upstream blocked"}
	// asynq keeps only the message: it must read plainly, and still tell
	// a deferral, and what it waits for, from a failure.
	for _, tc := range []struct {
		lastErr  string
		deferred bool
		waits    string
	}{
		{d.Error(), true, WaitingPushback},
		{"waiting for pushback: upstream blocked until 2026-11-30T14:02:07.250Z (429 from upstream)", true, WaitingPushback},
		{(&Deferral{Why: "sensitive headers unreadable"}).Error(), true, ""},
		{"waiting: sensitive headers unreadable", true, ""},
		{"upstream answered 500", false, ""},
		{"attempt 1 of 3: waiting for pushback: x", false, ""},
		{"", false, ""},
	} {
		waits, ok := deferredFor(tc.lastErr)
		if ok != tc.deferred || waits != tc.waits || deferred(tc.lastErr) != tc.deferred {
			t.Errorf("deferredFor(%q): got %q, %v; want %q, %v", tc.lastErr, waits, ok, tc.waits, tc.deferred)
		}
	}
	if got, want := d.Error(), "waiting for pushback: upstream blocked"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
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
