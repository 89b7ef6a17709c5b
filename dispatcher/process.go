package dispatcher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// processor is the asynq handler for one upstream's jobs.
func (d *Dispatcher) processor(u *upstream) func(context.Context, *asynq.Task) error {
	name := u.cfg.Name
	return func(ctx context.Context, task *asynq.Task) (err error) {
		var job queue.Job
		if err := json.Unmarshal(task.Payload(), &job); err != nil {
			d.m.Dispatches.WithLabelValues(name, "dead").Inc()
			return fmt.Errorf("undecodable job: %v: %w", err, asynq.SkipRetry)
		}
		read := false // the side key was read, so Redis answered just now
		if job.Secrets != "" {
			defer func() {
				switch {
				case err == nil || errors.Is(err, asynq.SkipRetry):
					d.forgetSecrets(ctx, &job)
				case read:
					// Handed back: the headers must outlast the wait, however
					// long (a pause until resumed hands back for up to a
					// year). Not after a failed read: Redis is likely down,
					// and the read left the TTL as it was.
					d.keepSecrets(ctx, &job, retryDelay(err, func() time.Duration { return u.cfg.Retry.MaxBackoff }))
				}
			}()
		}
		if !job.ExpiresAt.IsZero() && time.Now().After(job.ExpiresAt) {
			d.m.Dispatches.WithLabelValues(name, "expired").Inc()
			return fmt.Errorf("expired at %s before it could be dispatched: %w", job.ExpiresAt.Format(time.RFC3339), asynq.SkipRetry)
		}
		if err := d.withSecrets(ctx, &job); err != nil {
			return err
		}
		read = true
		attempt := queue.Attempt(ctx)

		var v verdict
		var resp *queue.Response
		var r *leaky.Reservation
		for {
			var err error
			r, err = d.pace(ctx, u, &job)
			if err != nil {
				var df *queue.Deferral
				if errors.As(err, &df) {
					d.m.Dispatches.WithLabelValues(name, "handed_back").Inc()
				}
				if u.cfg.Concurrency > 0 {
					// A slot skipped as late keeps the job's lease; let it go.
					rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
					u.bucket.ReleaseLease(rctx, job.ID)
					cancel()
				}
				return err
			}
			var sent bool
			if v, resp, sent = d.send(ctx, u, &job, r); sent {
				break
			}
			// The slot slipped past the guard before the request left.
			d.m.LateSlots.WithLabelValues(name).Inc()
		}
		if r.Lease != "" {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			if err := u.bucket.Release(rctx, r); err != nil {
				d.m.RedisErrors.WithLabelValues("pacing").Inc()
			}
			cancel()
		}
		if resp != nil {
			d.keepResponse(ctx, task, &job, u.stored(resp))
		}
		if v.block > 0 {
			d.block(ctx, u, v.block, v.blockReason)
		}
		switch v.kind {
		case kindDone:
			d.m.Dispatches.WithLabelValues(name, "succeeded").Inc()
			return nil
		case kindPushback:
			d.m.Dispatches.WithLabelValues(name, "deferred").Inc()
			return &queue.Deferral{Delay: v.wait, Why: v.reason}
		case kindRetry:
			if !queue.LastAttempt(&job, attempt) {
				d.m.Dispatches.WithLabelValues(name, "retry").Inc()
				delay := max(backoff(attempt, u.cfg.Retry.MinBackoff, u.cfg.Retry.MaxBackoff), v.wait)
				return &retryLater{delay: delay, why: fmt.Sprintf("attempt %d of %d: %s", attempt, job.MaxAttempts, v.reason)}
			}
			d.m.Dispatches.WithLabelValues(name, "dead").Inc()
			return fmt.Errorf("gave up after %d attempts: %s: %w", attempt, v.reason, asynq.SkipRetry)
		default:
			d.m.Dispatches.WithLabelValues(name, "dead").Inc()
			return fmt.Errorf("%s: %w", v.reason, asynq.SkipRetry)
		}
	}
}

// withSecrets puts a job's sensitive headers (kept aside by the queue) back
// into its headers for the send. Without them the job cannot be sent as
// given: it waits while Redis cannot be reached, and dies for any other
// failure (expired, undecodable, a command the server refuses), which a
// wait would not cure: handing it back would loop forever.
func (d *Dispatcher) withSecrets(ctx context.Context, job *queue.Job) error {
	secret, err := queue.LoadSecrets(ctx, d.rdb, d.cfg.Prefix, job, time.Now())
	switch {
	case errors.Is(err, queue.ErrSecretsGone):
		d.m.Dispatches.WithLabelValues(job.Upstream, "dead").Inc()
		return fmt.Errorf("%v: %w", err, asynq.SkipRetry)
	case err != nil && unreachable(err):
		d.m.RedisErrors.WithLabelValues("secrets").Inc()
		d.log.Error("cannot read a job's sensitive headers; handing it back", "job", job.ID, "err", err)
		return handBack(time.Second, "sensitive headers unreadable")
	case err != nil:
		d.m.RedisErrors.WithLabelValues("secrets").Inc()
		d.m.Dispatches.WithLabelValues(job.Upstream, "dead").Inc()
		return fmt.Errorf("cannot use the job's sensitive headers: %v: %w", err, asynq.SkipRetry)
	case secret == nil:
		return nil
	}
	headers := make(map[string]string, len(job.Headers)+len(secret))
	for k, v := range job.Headers {
		headers[k] = v
	}
	for k, v := range secret {
		headers[k] = v
	}
	job.Headers = headers
	return nil
}

// unreachable reports whether a Redis error says the store could not be
// reached or is briefly unable to answer (a connection refused or dropped,
// a timeout, a server loading its data or failing over), which passes; a
// reply the server gave on purpose (an unknown command, a wrong type) or a
// value that cannot be decoded does not.
func unreachable(err error) bool {
	var netErr net.Error
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, redis.ErrClosed), errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrPoolExhausted),
		errors.As(err, &netErr):
		return true
	}
	var reply redis.Error
	if !errors.As(err, &reply) {
		return false
	}
	msg := reply.Error()
	for _, p := range []string{"LOADING", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "MOVED ", "ASK ", "BUSY ", "NOREPLICAS", "ERR max number of clients"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// keepSecrets renews the sensitive headers of a job handed back for delay;
// a failure leaves them the TTL the worker's read gave them.
func (d *Dispatcher) keepSecrets(ctx context.Context, job *queue.Job, delay time.Duration) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := queue.RenewSecrets(rctx, d.rdb, d.cfg.Prefix, job, time.Now(), delay); err != nil {
		d.m.RedisErrors.WithLabelValues("secrets").Inc()
		d.log.Warn("could not renew the sensitive headers of a job handed back", "job", job.ID, "for", delay, "err", err)
	}
}

// outcomeWait bounds how long a worker whose job was answered waits for an
// unreachable Redis before reporting the outcome anyway: well inside
// asynq's 30 s task lease, which its heartbeat renews every 5 s once Redis
// answers again, so that asynq can still record the outcome.
const outcomeWait = 20 * time.Second

// keepResponse stores the upstream's answer with the job. A failed write
// means Redis is most likely down, and then more than the response is at
// stake: asynq records the job's outcome right after the handler returns,
// and if that write fails it retries it (v0.26) with a context it has
// already cancelled, so the job stays active until lease recovery gives it
// back, about a minute later, and it is sent to the upstream a second time.
// So while Redis is unreachable the worker waits here, up to outcomeWait,
// for it to take the response; once it has, asynq's own write follows on a
// live connection. A Redis restart of up to outcomeWait costs the job a
// delay instead of a duplicate delivery; a longer outage still risks one.
func (d *Dispatcher) keepResponse(ctx context.Context, task *asynq.Task, job *queue.Job, resp *queue.Response) {
	b, err := json.Marshal(resp)
	if err != nil {
		return
	}
	_, err = task.ResultWriter().Write(b)
	if err == nil {
		return
	}
	d.m.RedisErrors.WithLabelValues("results").Inc()
	if !unreachable(err) {
		// Redis answered, and refused (out of memory, say): waiting
		// would only hold a worker.
		d.log.Warn("could not store a job's response", "job", job.ID, "err", err)
		return
	}
	d.log.Warn("cannot store a job's response; holding the job until Redis answers, so its outcome is not lost",
		"job", job.ID, "for_at_most", outcomeWait, "err", err)
	deadline := time.Now().Add(outcomeWait)
	for pause := 50 * time.Millisecond; time.Now().Before(deadline) && ctx.Err() == nil; pause = min(2*pause, time.Second) {
		sleep(ctx, pause)
		if _, err = task.ResultWriter().Write(b); err == nil {
			d.log.Info("stored the response of a job held while Redis was unreachable", "job", job.ID)
			return
		}
	}
	d.log.Error("gave up storing a job's response; if Redis cannot record its outcome either, lease recovery will send it again",
		"job", job.ID, "err", err)
}

// forgetSecrets deletes a finished job's sensitive headers; the side key's
// TTL covers a failed delete.
func (d *Dispatcher) forgetSecrets(ctx context.Context, job *queue.Job) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := queue.DeleteSecrets(dctx, d.rdb, d.cfg.Prefix, job); err != nil {
		d.m.RedisErrors.WithLabelValues("secrets").Inc()
		d.log.Warn("could not delete a finished job's sensitive headers; they expire with their TTL", "job", job.ID, "err", err)
	}
}

// block pauses the upstream for every replica.
func (d *Dispatcher) block(ctx context.Context, u *upstream, dur time.Duration, reason string) {
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	until, err := u.bucket.Block(bctx, dur, reason)
	if err != nil {
		d.m.RedisErrors.WithLabelValues("pacing").Inc()
		d.log.Error("could not block upstream after pushback", "upstream", u.cfg.Name, "for", dur, "err", err)
		return
	}
	d.m.UpstreamBlocks.WithLabelValues(u.cfg.Name, reason).Inc()
	d.log.Warn("upstream pushed back; blocked fleet-wide", "upstream", u.cfg.Name, "reason", reason, "until", until.Format(time.RFC3339Nano))
}

// pace waits for the job's slot. It returns the reservation to send under,
// or a deferral when the job should go back to the queue (shutdown, or the
// upstream will not take it within MaxHold).
func (d *Dispatcher) pace(ctx context.Context, u *upstream, job *queue.Job) (*leaky.Reservation, error) {
	start := time.Now()
	name := u.cfg.Name
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(d.stopping, cancel)
	defer stop()

	costs := leaky.Costs(job.Cost)
	redisPause := 50 * time.Millisecond
	paused := false
	defer func() {
		if paused {
			d.m.UpstreamPaused.WithLabelValues(name).Set(0)
		}
	}()
	for {
		if waitCtx.Err() != nil {
			return nil, handBack(0, "worker shutting down")
		}
		r, err := u.bucket.Reserve(waitCtx, costs, leaky.WithLease(job.ID))
		switch {
		case errors.Is(err, leaky.ErrCostTooLarge):
			return nil, fmt.Errorf("%v: %w", err, asynq.SkipRetry)
		case err != nil:
			if waitCtx.Err() != nil {
				continue
			}
			// Pacing fails closed: no send without a reservation.
			d.m.RedisErrors.WithLabelValues("pacing").Inc()
			d.log.Error("cannot reserve a send slot; holding the job", "upstream", name, "job", job.ID, "err", err)
			if time.Since(start) > d.cfg.MaxHold {
				return nil, handBack(time.Second, "pacing store unreachable")
			}
			sleep(waitCtx, redisPause)
			redisPause = min(2*redisPause, 2*time.Second)
			continue
		case !r.OK:
			if r.Reason == leaky.ReasonBlocked && !paused {
				paused = true
				d.m.UpstreamPaused.WithLabelValues(name).Set(1)
			}
			switch {
			case r.Reason == leaky.ReasonConcurrency:
				// Leases free up as requests finish, not on a schedule.
				sleep(waitCtx, min(r.RetryAfter, 5*time.Millisecond)+rand.N(5*time.Millisecond))
			case r.RetryAfter <= d.cfg.Horizon:
				sleep(waitCtx, r.RetryAfter)
			case time.Since(start) >= d.cfg.MaxHold:
				// Held long enough: give the job back for when the upstream
				// expects it. Handing back at once instead would only make
				// this worker take the next job and hand that back too,
				// churning the whole backlog through Redis.
				return nil, handBack(r.RetryAfter, fmt.Sprintf("upstream %s until about %s", r.Reason, time.Now().Add(r.RetryAfter+d.cfg.Horizon).Format(time.RFC3339)))
			default:
				// Look again now and then: a resume lifts a block early.
				sleep(waitCtx, min(r.RetryAfter, time.Second, d.cfg.MaxHold-time.Since(start)))
			}
			continue
		}
		if err := r.Wait(waitCtx); err != nil {
			if errors.Is(err, leaky.ErrLate) {
				d.m.LateSlots.WithLabelValues(name).Inc()
			}
			// ErrBlocked: the upstream was paused after the slot was booked.
			// Otherwise ctx ended and Wait gave the slot back.
			continue
		}
		d.m.PacingWait.WithLabelValues(name).Observe(time.Since(start).Seconds())
		return r, nil
	}
}

// handBack returns the job to its queue after delay, spending no attempt.
func handBack(delay time.Duration, why string) error {
	return &queue.Deferral{Delay: delay, Why: why}
}

// errTooLate: the reservation's slot slipped past the guard before the
// request could leave; nothing was sent.
var errTooLate = errors.New("slot slipped before the send")

// send performs the job under reservation r and reads the outcome. It
// reports false, having sent nothing, if the slot slipped past the guard
// before the request left.
func (d *Dispatcher) send(ctx context.Context, u *upstream, job *queue.Job, r *leaky.Reservation) (_ verdict, _ *queue.Response, sent bool) {
	name := u.cfg.Name
	if u.handler != nil && r.TooLate() {
		return verdict{}, nil, false
	}
	d.m.InFlight.WithLabelValues(name).Inc()
	defer d.m.InFlight.WithLabelValues(name).Dec()
	start := time.Now()
	defer func() {
		// A request that never left is no send: status's drain rate and
		// the upstream's timings count only real ones.
		if sent {
			d.drain.Sent(name, time.Now())
			d.m.RequestDuration.WithLabelValues(name).Observe(time.Since(start).Seconds())
		}
	}()

	if u.handler != nil {
		hctx, cancel := context.WithTimeout(ctx, u.cfg.Timeout)
		defer cancel()
		resp, err := u.handler(hctx, job)
		class := "2xx"
		if err != nil {
			class = "error"
		}
		d.m.UpstreamResponses.WithLabelValues(name, class).Inc()
		return handlerVerdict(err, u.cfg.PushbackDefault), resp, true
	}
	resp, err := u.do(ctx, job, r)
	if errors.Is(err, errTooLate) {
		return verdict{}, nil, false
	}
	if err != nil {
		d.m.UpstreamResponses.WithLabelValues(name, "error").Inc()
		var pe *permanentError
		if errors.As(err, &pe) {
			return verdict{kind: kindDead, reason: err.Error()}, nil, true
		}
		return verdict{kind: kindRetry, reason: err.Error()}, nil, true
	}
	d.m.UpstreamResponses.WithLabelValues(name, responseClass(resp.Status)).Inc()
	return classify(resp.Status, http.Header(resp.Headers), time.Now(), u.cfg.PushbackDefault), resp, true
}

// do sends an HTTP job under reservation r.
func (u *upstream) do(ctx context.Context, job *queue.Job, r *leaky.Reservation) (*queue.Response, error) {
	target, err := queue.Target(u.base, job.Path)
	if err != nil {
		return nil, Permanent(err)
	}
	method := job.Method
	if method == "" {
		// As curl does: POST with a body, GET without.
		method = http.MethodGet
		if len(job.Body) > 0 {
			method = http.MethodPost
		}
	}
	rctx, cancel := context.WithTimeout(ctx, u.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, method, target.String(), bytes.NewReader(job.Body))
	if err != nil {
		return nil, Permanent(fmt.Errorf("build request: %w", err))
	}
	// The URL as Target built it, not reparsed: its raw path is the one sent.
	req.URL = target
	for k, v := range job.Headers {
		req.Header.Set(k, v)
	}
	for k, v := range u.cfg.Headers {
		req.Header.Set(k, v)
	}
	if u.cfg.IdempotencyHeader != "" {
		req.Header.Set(u.cfg.IdempotencyHeader, job.IdempotencyKey)
	}
	// The last moment to judge the slot: any later and the bytes are out.
	if r.TooLate() {
		return nil, errTooLate
	}
	resp, err := u.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("send to %s: %w", u.cfg.Name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, u.cfg.MaxResponseBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read answer of %s: %w", u.cfg.Name, err)
	}
	out := &queue.Response{Status: resp.StatusCode, Headers: resp.Header}
	if int64(len(body)) > u.cfg.MaxResponseBytes {
		body, out.Truncated = body[:u.cfg.MaxResponseBytes], true
	}
	out.Body = body
	// Drain what is left so the connection can be reused.
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<20))
	return out, nil
}

func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
