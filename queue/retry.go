package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/jobstore"
)

// ErrNotRetryable: the job is not dead or cancelled (or it is, but its
// sensitive headers are gone, so it could not be sent as given).
var ErrNotRetryable = errors.New("job cannot be retried")

// Retry sends a dead or cancelled job back to its queue: queued again
// under the same ID and idempotency key, at the back of its flow, with
// fresh attempts. What it keeps and resets:
//
//   - attempts 0, no last error, no last_failed_at, no stored response;
//   - created_at and idempotency_key as they were;
//   - retried_at now, retries one more, previous_error the last error the
//     job died with (empty for a cancelled job that never failed);
//   - expires_at cleared: a job given up for its ttl would otherwise die
//     again at once, and retrying it is the operator's decision.
//
// Tenant scopes it as for Get. A job in another state is ErrNotRetryable;
// so is one whose sensitive headers were deleted when it finished (they
// are deleted then, see DeleteSecrets): enqueue it again with them. The
// move is one script, atomic against workers and other retries; the
// upstream's sleeping workers are woken.
func (q *Queue) Retry(ctx context.Context, id, tenant string) (*Info, error) {
	info, err := q.Get(ctx, id, tenant)
	if err != nil {
		return nil, err
	}
	if info.State != StateDead && info.State != StateCancelled {
		return info, fmt.Errorf("job %s is %s: %w", id, info.State, ErrNotRetryable)
	}
	// A retried job joins the backlog as an enqueued one does, under the
	// same max_pending bound (BacklogFullError).
	if err := q.checkBacklog(ctx, info.Upstream, q.ups[info.Upstream]); err != nil {
		return nil, err
	}
	if err := q.revive(ctx, info.Upstream, id, tenant, true); err != nil {
		return nil, err
	}
	q.noteEnqueued(info.Upstream)
	return q.Get(ctx, id, tenant)
}

// RetryDeadResult is what RetryDead did.
type RetryDeadResult struct {
	// Retried jobs are queued again.
	Retried int `json:"retried"`
	// Skipped jobs stay dead: their sensitive headers are gone.
	Skipped int `json:"skipped"`
}

// RetryDead retries (as Retry does) every dead job of an upstream, of
// every tenant, newest first; cancelled jobs stay cancelled. Each job
// moves in its own script, so workers and concurrent retries see each one
// either dead or queued; a job that dies while RetryDead runs is left for
// the next call. It stops at ctx's end, or when the upstream's backlog
// reaches max_pending (a BacklogFullError), returning what it did so far.
func (q *Queue) RetryDead(ctx context.Context, upstream string) (RetryDeadResult, error) {
	var res RetryDeadResult
	if _, ok := q.ups[upstream]; !ok {
		return res, fmt.Errorf("upstream %q: %w", upstream, ErrUnknownUpstream)
	}
	keys := jobstore.AsynqKeys(jobstore.QueueName(upstream))
	cur := cursor{}
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		v, err := keys.ReadIndex(ctx, q.rdb, jobstore.IndexArchived, cur.Score, cur.Member, 200)
		if err != nil {
			return res, fmt.Errorf("retry dead jobs of %s: %w", upstream, err)
		}
		for _, e := range v {
			cur.Score, cur.Member = e.Score, e.ID
			if e.State != "archived" {
				continue
			}
			if err := q.checkBacklog(ctx, upstream, q.ups[upstream]); err != nil {
				return res, err
			}
			err := q.revive(ctx, upstream, e.ID, "", false)
			switch {
			case err == nil:
				res.Retried++
				q.noteEnqueued(upstream)
			case errors.Is(err, errSecretsGone):
				res.Skipped++
			case errors.Is(err, ErrNotRetryable), errors.Is(err, ErrNotFound), errors.Is(err, errCancelled):
				// Taken by another retry, trimmed, or cancelled.
			default:
				return res, fmt.Errorf("retry dead jobs of %s: %w", upstream, err)
			}
		}
		if len(v) < 200 {
			return res, nil
		}
	}
}

var (
	errCancelled   = errors.New("job was cancelled")
	errSecretsGone = errors.New("its sensitive headers were deleted when it finished; enqueue it again with them")
)

// revive moves one archived job back to its flow (see Retry). With
// cancelled false, a cancelled job is left alone (errCancelled).
func (q *Queue) revive(ctx context.Context, upstream, id, tenant string, cancelled bool) error {
	space := jobstore.For(q.prefix, upstream)
	// A few tries: the message is rewritten in Go and set only if it is
	// unchanged, and a concurrent retry, trim or cancel can change it.
	for try := 0; ; try++ {
		var msgCmd, sdCmd *redis.StringCmd
		var markCmd *redis.IntCmd
		q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			msgCmd = p.HGet(ctx, space.TaskKey(id), "msg")
			sdCmd = p.HGet(ctx, space.TaskKey(id), "sd")
			markCmd = p.Exists(ctx, q.cancelKey(id))
			return nil
		})
		if errors.Is(msgCmd.Err(), redis.Nil) {
			return fmt.Errorf("job %s: %w", id, ErrNotFound)
		}
		// (Pipelined's own error is the first command's that failed, a
		// missing mark included.)
		for _, c := range []redis.Cmder{msgCmd, sdCmd, markCmd} {
			if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) {
				return fmt.Errorf("retry %s: %w", id, err)
			}
		}
		if markCmd.Val() == 1 && !cancelled {
			return fmt.Errorf("job %s: %w", id, errCancelled)
		}
		was := []byte(msgCmd.Val())
		msg, err := jobstore.Unmarshal(was)
		if err != nil {
			return fmt.Errorf("retry %s: %w", id, err)
		}
		job, err := DecodeJob(id, msg.Payload)
		if err != nil {
			return fmt.Errorf("retry %s: undecodable payload: %w", id, err)
		}
		if tenant != "" && job.Tenant != tenant {
			return fmt.Errorf("job %s: %w", id, ErrNotFound)
		}
		job.RetriedAt = time.Now().UTC()
		job.Retries++
		job.PreviousError = ""
		if _, back := jobstore.WaitsFor(sdCmd.Val()); !back {
			// (A job cancelled while handed back died of no error.)
			job.PreviousError = msg.ErrorMsg
		}
		job.ExpiresAt = time.Time{}
		if msg.Payload, err = EncodeJob(&job); err != nil {
			return fmt.Errorf("retry %s: encode job: %w", id, err)
		}
		msg.Retried, msg.ErrorMsg, msg.LastFailedAt, msg.CompletedAt = 0, "", 0, 0
		err = space.Revive(ctx, q.rdb, jobstore.Revival{ID: id, Was: was, Msg: msg.Marshal(),
			Forget: q.cancelKey(id), Needs: SecretsKey(q.prefix, &job)})
		switch {
		case err == nil:
			return nil
		case errors.Is(err, redis.Nil):
			return fmt.Errorf("job %s: %w", id, ErrNotFound)
		case errors.Is(err, jobstore.ErrNotArchived):
			return fmt.Errorf("job %s: %v: %w", id, err, ErrNotRetryable)
		case errors.Is(err, jobstore.ErrNeedMissing):
			return fmt.Errorf("job %s: %w: %w", id, errSecretsGone, ErrNotRetryable)
		case errors.Is(err, jobstore.ErrChanged) && try < 3:
			continue
		default:
			return fmt.Errorf("retry %s: %w", id, err)
		}
	}
}
