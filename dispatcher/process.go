package dispatcher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/ratelimit"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// withSecrets puts a job's sensitive headers (kept aside by the queue) back
// into its headers for the send; it reports false, with the job's
// outcome, when the job cannot be sent as given. Then it waits while Redis
// cannot be reached, and dies for any other failure (expired,
// undecodable, a command the server refuses), which a wait would not
// cure: handing it back would loop forever.
func (d *Dispatcher) withSecrets(ctx context.Context, job *queue.Job) (outcome, bool) {
	secret, err := queue.LoadSecrets(ctx, d.rdb, d.cfg.Prefix, job, time.Now())
	switch {
	case errors.Is(err, queue.ErrSecretsGone):
		d.m.Dispatches.WithLabelValues(job.Upstream, "dead").Inc()
		return dead("%v", err), false
	case err != nil && unreachable(err):
		d.m.RedisErrors.WithLabelValues("secrets").Inc()
		d.log.Error("cannot read a job's sensitive headers; handing it back", "job", job.ID, "err", err)
		return handBack(time.Second, "sensitive headers unreadable"), false
	case err != nil:
		d.m.RedisErrors.WithLabelValues("secrets").Inc()
		d.m.Dispatches.WithLabelValues(job.Upstream, "dead").Inc()
		return dead("cannot use the job's sensitive headers: %v", err), false
	case secret == nil:
		return outcome{}, true
	}
	headers := make(map[string]string, len(job.Headers)+len(secret))
	for k, v := range job.Headers {
		headers[k] = v
	}
	for k, v := range secret {
		headers[k] = v
	}
	job.Headers = headers
	return outcome{}, true
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

// block pauses the upstream for every replica; it returns the block's
// end (zero if it could not be placed).
func (d *Dispatcher) block(ctx context.Context, u *upstream, dur time.Duration, reason string) time.Time {
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	until, err := u.bucket.Block(bctx, dur, reason)
	if err != nil {
		d.m.RedisErrors.WithLabelValues("pacing").Inc()
		d.log.Error("could not block upstream after pushback", "upstream", u.cfg.Name, "for", dur, "err", err)
		return time.Time{}
	}
	d.m.UpstreamBlocks.WithLabelValues(u.cfg.Name, reason).Inc()
	d.log.Warn("upstream pushed back; blocked fleet-wide", "upstream", u.cfg.Name, "reason", reason, "until", until.Format(time.RFC3339Nano))
	return until
}

// send performs the job under reservation r and reads the answer. It
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
		v := handlerVerdict(err)
		v.sentAt = r.Now.Add(r.Delay)
		return v, resp, true
	}
	resp, failed, sent := u.do(ctx, job, r)
	switch {
	case !sent:
		return verdict{}, nil, false
	case resp == nil:
		d.m.UpstreamResponses.WithLabelValues(name, "error").Inc()
		return failed, nil, true
	}
	d.m.UpstreamResponses.WithLabelValues(name, responseClass(resp.Status)).Inc()
	h := http.Header(resp.Headers)
	rd := ratelimit.Read(h, time.Now())
	v := classify(resp.Status, h, rd, u.spacing())
	v.rd = &rd
	v.sentAt = r.Now.Add(r.Delay)
	return v, resp, true
}

// do sends an HTTP job under reservation r and returns the answer. Without
// one, the verdict says why: dead for a request that cannot be built, a
// retry for one that failed on the way. It reports sent false, having sent
// nothing, if the slot slipped past the guard before the request left.
func (u *upstream) do(ctx context.Context, job *queue.Job, r *leaky.Reservation) (_ *queue.Response, failed verdict, sent bool) {
	target, err := queue.Target(u.base, job.Path)
	if err != nil {
		return nil, verdict{kind: kindDead, reason: err.Error()}, true
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
		return nil, verdict{kind: kindDead, reason: "build request: " + err.Error()}, true
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
		return nil, verdict{}, false
	}
	resp, err := u.client.Do(req)
	if err != nil {
		return nil, verdict{kind: kindRetry, reason: fmt.Sprintf("send to %s: %v", u.cfg.Name, err)}, true
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, u.cfg.MaxResponseBytes+1))
	if err != nil {
		return nil, verdict{kind: kindRetry, reason: fmt.Sprintf("read answer of %s: %v", u.cfg.Name, err)}, true
	}
	out := &queue.Response{Status: resp.StatusCode, Headers: resp.Header}
	if int64(len(body)) > u.cfg.MaxResponseBytes {
		body, out.Truncated = body[:u.cfg.MaxResponseBytes], true
	}
	out.Body = body
	// Drain what is left so the connection can be reused.
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<20))
	return out, verdict{}, true
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
