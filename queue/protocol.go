package queue

import (
	"github.com/hibiken/asynq"
)

// What a worker and the queue agree on about a job's life in asynq: what a
// held job waits for, and how attempts are counted. Both sides call these;
// neither spells the rules itself. (A hand-back is told from a failure by
// the task's typed mark, jobstore.Finished.WaitsFor, never by its last
// error's words.)

// What a waiting job waits for (Info.WaitingFor): it could otherwise go
// now, and is held back by one of these.
const (
	// WaitingPause: its upstream is paused, by an operator (shaper pause,
	// the API) or through asynq's PauseQueue.
	WaitingPause = "pause"
	// WaitingPushback: the upstream pushed back (a 429, an exhausted
	// quota, a lower stated limit): the fleet-wide block it placed, or,
	// for the job that met a 429, that job's own wait.
	WaitingPushback = "pushback"
	// WaitingLimit: its partition's limits park it until its next slot.
	WaitingLimit = "limit"
)

// The reasons the dispatcher gives the fleet-wide blocks it places when
// an upstream pushes back; status shows them as pause_reason. A block
// with any other reason is an operator's pause.
const (
	// BlockRefused: a 429 that said when to come back, or a bare one.
	BlockRefused = "429"
	// BlockQuota: a success whose quota headers say nothing is left.
	BlockQuota = "quota_exhausted"
	// BlockStatedLimit: the upstream stated a lower limit; slots booked at
	// the old pace are given back.
	BlockStatedLimit = "stated_limit"
)

// BlockWaitsFor is what jobs wait for while their upstream is blocked
// with reason: WaitingPushback for the dispatcher's own blocks,
// WaitingPause for any other.
func BlockWaitsFor(reason string) string {
	switch reason {
	case BlockRefused, BlockQuota, BlockStatedLimit:
		return WaitingPushback
	}
	return WaitingPause
}

// Attempts are counted by one rule, from asynq's retry count, which counts
// failed attempts only (a hand-back is not a failure):
//
//   - the worker running a job is making attempt retried+1;
//   - a job waiting (queued, scheduled, retrying) has made retried attempts,
//     one running or finished retried+1 (what Info.Attempts shows);
//   - attempt MaxAttempts is the last: the worker ends the job itself after
//     it (LastAttempt), and the task's asynq MaxRetry is MaxAttempts, one
//     more than that needs, so asynq never archives on its own a job that
//     was only handed back.

// LastAttempt reports whether attempt is the job's last.
func LastAttempt(job *Job, attempt int) bool { return attempt >= job.MaxAttempts }

// attemptsMade is how many attempts a job in an asynq state has made.
func attemptsMade(state asynq.TaskState, retried int) int {
	switch state {
	case asynq.TaskStateActive, asynq.TaskStateCompleted, asynq.TaskStateArchived:
		return retried + 1
	}
	return retried
}
