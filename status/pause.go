package status

import (
	"context"
	"fmt"
	"time"

	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// Indefinitely is how long a pause without a duration lasts: until resumed,
// within reason (every key shaper writes expires). It is also the longest
// pause that may be given a duration.
const Indefinitely = 365 * 24 * time.Hour

// untilResumedAbove is the time left beyond which a pause is shown as one
// without a duration: an indefinite pause stays above it for its first 65
// days, and a pause given a duration rarely asks for more than 300.
const untilResumedAbove = 300 * 24 * time.Hour

// UntilResumed reports whether the upstream's pause, seen at now, is one
// that lasts until resumed rather than one with a duration (as far as can
// be told from its end alone). False when not paused.
func (u Upstream) UntilResumed(now time.Time) bool {
	return u.PausedUntil != nil && u.PausedUntil.Sub(now) > untilResumedAbove
}

// Pause blocks the upstream for every worker replica for d, or
// Indefinitely when d is 0, giving reason; status shows the reason. Jobs
// keep queueing and workers hand back the ones they hold, spending no
// attempts. It returns when the pause ends.
func (r *Reader) Pause(ctx context.Context, name string, d time.Duration, reason string) (time.Time, error) {
	if d < 0 || d > Indefinitely {
		return time.Time{}, fmt.Errorf("pause %s for %v: must be positive and at most %v", name, d, Indefinitely)
	}
	if d == 0 {
		d = Indefinitely
	}
	b, err := r.bucket(name)
	if err != nil {
		return time.Time{}, err
	}
	return b.Block(ctx, d, reason)
}

// AsynqPauseReason is the pause reason status shows for an upstream whose
// queue was paused through asynq (Inspector.PauseQueue, asynq's CLI or
// asynqmon).
const AsynqPauseReason = "paused through asynq (PauseQueue)"

// Resume lifts any pause or pushback block on the upstream, so every
// replica may send to it again at once, and makes due now the jobs handed
// back while it was blocked: they were scheduled for the block's end. It
// also lifts a pause placed through asynq's PauseQueue on the upstream's
// queue, as asynq's UnpauseQueue would. It returns how many jobs it made
// due. This is the only resume: the API and the command line both call it.
func (r *Reader) Resume(ctx context.Context, name string) (int, error) {
	b, err := r.bucket(name)
	if err != nil {
		return 0, err
	}
	// First: the unblock below announces the resume, which wakes the
	// workers.
	if _, err := r.q.ClearAsynqPause(ctx, name); err != nil {
		return 0, fmt.Errorf("resume %s: %w", name, err)
	}
	if err := b.Unblock(ctx); err != nil {
		return 0, err
	}
	moved, err := r.q.RunDeferred(ctx, name)
	if err != nil {
		return 0, fmt.Errorf("resume %s: %w", name, err)
	}
	return moved, nil
}

func (r *Reader) bucket(name string) (*leaky.Bucket, error) {
	b, ok := r.buckets[name]
	if !ok {
		return nil, fmt.Errorf("upstream %q: %w", name, queue.ErrUnknownUpstream)
	}
	return b, nil
}
