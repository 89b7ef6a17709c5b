package queue

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
)

// A job's sensitive request headers (a producer's own credentials) never
// enter asynq's task: asynq keeps the task, payload included, for the whole
// retention of a finished job, and rewrites it from its own copy when the
// job completes or dies, so stripping it in place would not hold. They go
// in a side key of shaper's own instead, one per enqueue:
//
//	PREFIX:secrets:{QUEUE}:ID:NONCE -> JSON object of header name to value
//
// (which headers: shaper.Upstream.SensitiveHeader) written before the task is enqueued and named by the job's Secrets field
// (NONCE), so an idempotent repeat that finds an existing job deletes only
// its own side key, never the first job's. The queue name is the key's hash
// tag, so a Redis Cluster keeps it in the slot of the queue's asynq keys.
// A worker reads it only for a job whose Secrets is set (no round trip for
// the others) and deletes it when the job finishes: succeeded, dead or
// expired; Cancel deletes it too. The key's TTL is a backstop for a job
// that finishes where no worker sees it (asynq archiving after repeated
// crashes); see secretsBackstop.

// secretsBackstop is how long a job without a ttl keeps its sensitive
// headers past the moment a worker is next due to look at it. Every look
// renews it (a worker taking the job, and a worker handing it back, for the
// hand-back's delay plus this), so a waiting job loses its headers only if
// no worker looks at it for this long: a backlog more than a month deep.
// What it bounds is a job that finishes where no worker sees it (asynq
// archiving a task after repeated worker crashes), whose headers then stay
// in Redis this long at most. A month, rather than the upstream's
// dead_retention (a week by default), because losing a waiting job's
// headers loses the job, while keeping a finished one's a little longer
// only delays their removal.
const secretsBackstop = 30 * 24 * time.Hour

// secretsSlack covers clocks that disagree a little with Redis's.
const secretsSlack = time.Minute

// SecretsTTL is how long a job's sensitive headers are kept from now when
// it is enqueued or taken by a worker: secretsTTL with the wait until its
// NotBefore.
func SecretsTTL(job *Job, now time.Time) time.Duration {
	return secretsTTL(job, now, job.NotBefore.Sub(now))
}

// secretsTTL is how long from now a job's sensitive headers must last if
// a worker is next due to look at it after wait. A job with a ttl cannot be
// sent after its ExpiresAt, so its headers live until then (plus a
// minute). A job without one can wait without bound (retries, pauses,
// pushback, a backlog), so its headers live until wait plus the backstop;
// a job left untouched longer than that goes dead as "sensitive headers
// expired" rather than being sent without them.
func secretsTTL(job *Job, now time.Time, wait time.Duration) time.Duration {
	if !job.ExpiresAt.IsZero() {
		return max(job.ExpiresAt.Sub(now), 0) + secretsSlack
	}
	return max(wait, 0) + secretsBackstop
}

// ErrSecretsGone: a job's sensitive headers expired or were deleted; it
// cannot be sent as given.
var ErrSecretsGone = errors.New("the job's sensitive headers are gone (expired before it could be sent)")

// SecretsKey is the side key of a job's sensitive headers, "" if it has
// none.
func SecretsKey(prefix string, job *Job) string {
	if job.Secrets == "" {
		return ""
	}
	return jobstore.For(prefix, job.Upstream).SecretsKey(job.ID, job.Secrets)
}

// splitSecrets returns the job as stored (its sensitive headers removed,
// Secrets set to a fresh nonce if there were any) and the removed headers.
// The caller's job and its map are left as they are.
func splitSecrets(job *Job, u shaper.Upstream) (Job, map[string]string) {
	stored := *job
	var secret map[string]string
	for name := range job.Headers {
		if !u.SensitiveHeader(name) {
			continue
		}
		if secret == nil {
			secret = map[string]string{}
			stored.Headers = make(map[string]string, len(job.Headers))
			for k, v := range job.Headers {
				stored.Headers[k] = v
			}
		}
		secret[name] = job.Headers[name]
		delete(stored.Headers, name)
	}
	if secret != nil {
		var b [8]byte
		rand.Read(b[:])
		stored.Secrets = hex.EncodeToString(b[:])
		if len(stored.Headers) == 0 {
			stored.Headers = nil
		}
	}
	return stored, secret
}

// putSecrets writes a job's side key before its task is enqueued.
func putSecrets(ctx context.Context, rdb redis.Cmdable, prefix string, job *Job, secret map[string]string, now time.Time) error {
	b, err := json.Marshal(secret)
	if err != nil {
		return err
	}
	return rdb.Set(ctx, SecretsKey(prefix, job), b, SecretsTTL(job, now)).Err()
}

// LoadSecrets reads a job's sensitive headers for a worker about to send
// it and renews their TTL (SecretsTTL). It returns nil for a job without
// any, and ErrSecretsGone if they expired.
func LoadSecrets(ctx context.Context, rdb redis.Cmdable, prefix string, job *Job, now time.Time) (map[string]string, error) {
	key := SecretsKey(prefix, job)
	if key == "" {
		return nil, nil
	}
	// GET and PEXPIRE in one round trip rather than GETEX, which needs
	// Redis 6.2 (shaper supports Redis 5). PEXPIRE on a missing key does
	// nothing, so the order cannot revive an expired key.
	var get *redis.StringCmd
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		get = p.Get(ctx, key)
		p.PExpire(ctx, key, SecretsTTL(job, now))
		return nil
	})
	b, gerr := get.Bytes()
	if errors.Is(gerr, redis.Nil) {
		return nil, fmt.Errorf("job %s: %w", job.ID, ErrSecretsGone)
	}
	if gerr != nil {
		err = gerr
	}
	if err != nil {
		return nil, fmt.Errorf("job %s: read sensitive headers: %w", job.ID, err)
	}
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("job %s: sensitive headers: %w", job.ID, err)
	}
	return m, nil
}

// RenewSecrets keeps a job's sensitive headers for a worker handing it
// back to wait delay: they must outlast the wait (a pause until resumed can
// hand a job back for a year) plus the backstop. A job without any costs
// nothing; one whose headers are gone stays so.
func RenewSecrets(ctx context.Context, rdb redis.Cmdable, prefix string, job *Job, now time.Time, delay time.Duration) error {
	key := SecretsKey(prefix, job)
	if key == "" {
		return nil
	}
	if err := rdb.PExpire(ctx, key, secretsTTL(job, now, delay)).Err(); err != nil {
		return fmt.Errorf("job %s: renew sensitive headers: %w", job.ID, err)
	}
	return nil
}

// DeleteSecrets removes a finished job's sensitive headers. A job without
// any costs nothing.
func DeleteSecrets(ctx context.Context, rdb redis.Cmdable, prefix string, job *Job) error {
	key := SecretsKey(prefix, job)
	if key == "" {
		return nil
	}
	if err := rdb.Del(ctx, key).Err(); err != nil {
		return fmt.Errorf("job %s: delete sensitive headers: %w", job.ID, err)
	}
	return nil
}
