package queue

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/hibiken/asynq"
)

// What a worker and the queue agree on about a job's life in asynq: how a
// hand-back is told from a failure, and how attempts are counted. Both
// sides call these; neither spells the rules itself.

// deferredPrefix starts a hand-back's message in asynq's last error, which
// is all asynq keeps of it; it reads well in asynq's own tools too
// ("deferred: upstream blocked until ...").
const deferredPrefix = "deferred: "

// Deferral is a worker handing a job back to its queue to wait for its
// upstream (pacing, a 429, a pause, shutdown) rather than failing it: asynq
// counts no attempt for it (IsFailure says no) and runs it again after
// Delay. The job shows as scheduled, not retrying, and a resume makes it
// due at once (RunDeferred).
type Deferral struct {
	// Delay is how long the job waits in its queue before a worker takes
	// it again; zero makes it due at once. The worker renews the job's
	// sensitive headers to outlast it (RenewSecrets).
	Delay time.Duration
	// Why says what the job waits for ("upstream blocked until ..."); it
	// becomes the job's last error, after the "deferred: " that marks a
	// hand-back there.
	Why string
}

func (d *Deferral) Error() string { return deferredPrefix + d.Why }

// IsFailure is asynq's Config.IsFailure for shaper's workers: every error
// but a Deferral spends an attempt.
func IsFailure(err error) bool {
	var d *Deferral
	return !errors.As(err, &d)
}

// deferred reports whether asynq's last error of a task was a Deferral.
func deferred(lastErr string) bool { return strings.HasPrefix(lastErr, deferredPrefix) }

// Attempts are counted by one rule, from asynq's retry count, which counts
// failed attempts only (a Deferral is not a failure):
//
//   - the worker running a job is making attempt retried+1 (Attempt);
//   - a job waiting (queued, scheduled, retrying) has made retried attempts,
//     one running or finished retried+1 (what Info.Attempts shows);
//   - attempt MaxAttempts is the last: the worker ends the job itself after
//     it (LastAttempt), and the task's asynq MaxRetry is MaxAttempts, one
//     more than that needs, so asynq never archives on its own a job that
//     was only handed back.

// Attempt is the number, from 1, of the attempt a worker is making at a
// job, read from asynq's handler context.
func Attempt(ctx context.Context) int {
	retried, _ := asynq.GetRetryCount(ctx)
	return retried + 1
}

// LastAttempt reports whether attempt is the job's last.
func LastAttempt(job *Job, attempt int) bool { return attempt >= job.MaxAttempts }

// asynqMaxRetry is the MaxRetry a job's task is enqueued with.
func asynqMaxRetry(maxAttempts int) int { return maxAttempts }

// attemptsMade is how many attempts a job in an asynq state has made.
func attemptsMade(state asynq.TaskState, retried int) int {
	switch state {
	case asynq.TaskStateActive, asynq.TaskStateCompleted, asynq.TaskStateArchived:
		return retried + 1
	}
	return retried
}
