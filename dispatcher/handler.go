package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/shaperhq/shaper/queue"
)

// Handler runs one job of an upstream served by Go code instead of HTTP (a
// bulk e-mail sender, a report generator). It is called only once the job's
// slot has come, with the job's concurrency lease held, so it gets the same
// pacing as HTTP upstreams. It returns what to store as the job's result (nil
// stores nothing) and an error that says what to do next:
//
//   - nil: done.
//   - Permanent(err): dead at once, no more attempts.
//   - Pushback(d, err): the far side is saturated; the whole upstream pauses
//     for d on every replica and the job waits without spending an attempt.
//   - any other error: retry with exponential backoff and full jitter, up to
//     the job's attempts.
type Handler func(ctx context.Context, job *queue.Job) (*queue.Response, error)

// HandlerFunc adapts a function that needs no result.
func HandlerFunc(f func(ctx context.Context, job *queue.Job) error) Handler {
	return func(ctx context.Context, job *queue.Job) (*queue.Response, error) {
		return nil, f(ctx, job)
	}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks an error as final: the job goes dead.
func Permanent(err error) error { return &permanentError{err: err} }

type pushbackError struct {
	wait time.Duration
	err  error
}

func (e *pushbackError) Error() string {
	return fmt.Sprintf("pushback for %v: %v", e.wait, e.err)
}
func (e *pushbackError) Unwrap() error { return e.err }

// Pushback says the far side is over its limit: the upstream is blocked for
// d fleet-wide and the job retried after it without spending an attempt.
func Pushback(d time.Duration, err error) error { return &pushbackError{wait: d, err: err} }

// handlerVerdict turns a Handler's error into the same verdict an HTTP
// answer gets.
func handlerVerdict(err error) verdict {
	var pe *permanentError
	var pb *pushbackError
	switch {
	case err == nil:
		return verdict{kind: kindDone}
	case errors.As(err, &pb):
		if pb.wait <= 0 {
			// No time given: a bare pushback, growing while repeated.
			return verdict{kind: kindPushback, bare: true, refused: true, reason: err.Error()}
		}
		return verdict{kind: kindPushback, wait: pb.wait, block: pb.wait, blockReason: queue.BlockRefused, refused: true, reason: err.Error()}
	case errors.As(err, &pe):
		return verdict{kind: kindDead, reason: err.Error()}
	default:
		return verdict{kind: kindRetry, reason: err.Error()}
	}
}
