package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/httplimit"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/internal/pushback"
	"github.com/shaperhq/shaper/internal/ratelimit"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
	"github.com/shaperhq/shaper/tokenbucket"
)

func targetOf(base *url.URL, path string) (*url.URL, error) { return queue.Target(base, path) }

func sortedStrings(s []string) []string { slices.Sort(s); return s }

func writeRateHeaders(w http.ResponseWriter, s *Server, res shaper.Result) {
	httplimit.WriteHeaders(w.Header(), s.policy, res)
}

// proxy runs one call: checks it, pays its admission, waits for its slot,
// sends it and relays the answer.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request, e *proxyEntry, path string) {
	name := e.up.Name
	code := "canceled"
	defer func() { s.m.ProxyCalls.WithLabelValues(name, code).Inc() }()
	c, p := s.readCall(r, e, path)
	if r.ContentLength > s.cfg.MaxBodyBytes {
		code = "413"
		s.tooLarge(w)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			code = "413"
			s.tooLarge(w)
		}
		return
	}
	c.method, c.header, c.hasBody = r.Method, outboundHeaders(r.Header, e.up.Headers), len(body) > 0 || r.ContentLength != 0
	c.held = holdBody(body)
	if len(r.Header.Values(headerCost)) == 0 {
		for cost, rule := range e.up.Proxy.Cost {
			if n, ok := rule.Amount(r.Header, body); ok {
				c.costs[cost] = n
			}
		}
	}
	if len(p.list) == 0 {
		checkCalledCosts(p, e, c)
	}
	if len(p.list) > 0 {
		code = "400"
		writeProblem(w, problem{Type: problemInvalid, Title: "Invalid call", Status: http.StatusBadRequest,
			Detail: fmt.Sprintf("the call cannot be proxied to %s: %s", name, p.list[0].Message), Errors: p.list})
		return
	}
	// Admission and the booking wait for a busy Redis within the call's
	// own wait (proxy_store.go).
	r = s.withCallBudget(r, time.Now().Add(c.maxWait))
	admit := s.callAdmit(r)
	if admit == nil {
		if ok, refused := s.admitCall(w, r); !ok {
			code = refused
			return
		}
	}
	code = s.call(w, r, e, c, body, admit)
}

func (s *Server) tooLarge(w http.ResponseWriter) {
	writeProblem(w, problem{Type: problemTooLarge, Title: "Request body too large", Status: http.StatusRequestEntityTooLarge,
		Detail: fmt.Sprintf("a proxied call's body may be at most %d bytes (api.max_body_bytes)", s.cfg.MaxBodyBytes)})
}

// call waits for the call's slot and sends it, again after a 429 while
// the wait allows; it answers the caller and returns the code for the
// metric.
func (s *Server) call(w http.ResponseWriter, r *http.Request, e *proxyEntry, c callSpec, body []byte, admit *tokenbucket.Admission) string {
	ctx := r.Context()
	start := time.Now()
	deadline := start.Add(c.maxWait)
	bg := context.WithoutCancel(ctx)
	// The fleet sees the call waiting once it waits (proxy_mark.go).
	mark := &waitMark{s: s, e: e, deadline: deadline}
	defer mark.done(bg)
	limits := e.up.PartitionLimitsFor(c.partition)
	queueTime := func() {
		w.Header().Set(headerQueueTime, strconv.FormatFloat(time.Since(start).Seconds(), 'f', 3, 64))
	}
	waitObserved := false
	fk := jobstore.FairKey(e.up, caller(r).Tenant, c.partition)
	// The call's name in its key's line of waiting calls, and its
	// concurrency lease when the upstream caps concurrency.
	id, lease := newWaiterID(), ""
	if e.up.Concurrency > 0 {
		lease = id
	}
	for {
		var t jobstore.Turn
		err := s.book(ctx, deadline, func(ctx context.Context) (err error) {
			t, err = s.reserveCall(ctx, e, c, fk, id, lease, limits, deadline, admit)
			return err
		})
		if admit != nil {
			switch {
			case t.Denied != nil:
				s.refuseCall(w, r, *t.Denied)
				return "429"
			case t.Admitted:
				s.m.AdmissionDecisions.WithLabelValues("allowed").Inc()
			case err != nil && ctx.Err() == nil:
				// The script call failed, and whether it decided
				// admission is unknown: admission decides under its
				// policy for a Redis that fails, as when it was asked
				// first, without asking Redis again (which could spend
				// a second token for the call).
				if ok, refused := s.admitFailed(w, r, err); !ok {
					return refused
				}
			}
			admit = nil
		}
		if err != nil {
			if t.Slot != nil {
				// Booked after the call's budget: give it back, and its
				// costs when its slot had begun already.
				cctx, cancel := context.WithTimeout(bg, time.Second)
				restored, cerr := e.bucket.Cancel(cctx, t.Slot)
				cancel()
				if cerr == nil && restored == 0 {
					s.giveBackCosts(bg, e, c, limits)
				}
			}
			if ctx.Err() != nil {
				return "canceled"
			}
			return s.pacingDown(w, r, err)
		}
		res := t.Slot
		if res == nil {
			pause := t.Wait
			if t.Reason == leaky.ReasonConcurrency {
				pause = min(pause, 10*time.Millisecond)
			}
			if t.Refused || time.Until(deadline) < pause {
				// Beyond the wait: a call waiting as long gets a slot
				// RetryAfter later.
				queueTime()
				s.answerSlotRefused(w, e, pause, reasonText(t.Reason))
				return "429"
			}
			mark.waits(ctx, pause)
			if sleepCtx(ctx, pause) != nil {
				return "canceled"
			}
			continue
		}
		mark.waits(ctx, res.Delay)
		if err := res.Wait(ctx); err != nil {
			if ctx.Err() != nil {
				// Wait gave the slot back: nothing is sent.
				return "canceled"
			}
			// Too late or blocked: book again, without this slot's lease
			// or (too late: the slot is spent) its costs.
			e.bucket.Release(bg, res)
			if errors.Is(err, leaky.ErrLate) {
				s.giveBackCosts(bg, e, c, limits)
			}
			continue
		}
		if !waitObserved {
			s.m.ProxyWait.WithLabelValues(e.up.Name).Observe(time.Since(start).Seconds())
			waitObserved = true
		}
		resp, err := s.send(ctx, e, c, body, res)
		if err != nil {
			e.bucket.Release(bg, res)
			if errors.Is(err, errSlotGone) {
				s.giveBackCosts(bg, e, c, limits)
			}
			if ctx.Err() != nil {
				return "canceled"
			}
			if errors.Is(err, errSlotGone) {
				continue
			}
			// Without the URL, whose query may hold a secret.
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err
			}
			s.log.Warn("proxied call failed", "upstream", e.up.Name, "err", err)
			queueTime()
			writeProblem(w, problem{Type: problemUnavailable, Title: "Upstream unreachable", Status: http.StatusBadGateway,
				Detail: fmt.Sprintf("upstream %s did not answer: %v", e.up.Name, err)})
			return "502"
		}
		rd := ratelimit.Read(resp.Header, time.Now())
		s.learn(bg, e, pushback.Stated(&rd))
		if resp.StatusCode == http.StatusTooManyRequests {
			again := s.refused(ctx, e, resp, rd, res)
			if !again.IsZero() && again.Before(deadline) {
				resp.Body.Close()
				e.bucket.Release(bg, res)
				mark.waits(ctx, time.Until(again))
				if sleepCtx(ctx, time.Until(again)) != nil {
					return "canceled"
				}
				continue
			}
		} else if next := rd.NextUnit(); next > e.spacing {
			// A success that says nothing is left of a quota: hold the
			// fleet until its next unit, as for jobs.
			if _, err := e.bucket.Block(bg, next, queue.BlockQuota); err == nil {
				s.m.UpstreamBlocks.WithLabelValues(e.up.Name, queue.BlockQuota).Inc()
			}
		}
		queueTime()
		stop := s.holdLease(bg, e, res)
		s.relay(w, e, c, resp)
		stop()
		e.bucket.Release(bg, res)
		return strconv.Itoa(resp.StatusCode)
	}
}

// pacingDown answers a call whose slot could not be booked because Redis
// failed: 503 at once, nothing sent.
func (s *Server) pacingDown(w http.ResponseWriter, r *http.Request, err error) string {
	if r.Context().Err() != nil {
		return "canceled"
	}
	s.m.RedisErrors.WithLabelValues("pacing").Inc()
	s.log.Error("cannot book a proxied call's slot", "path", proxyRoute, "err", err)
	writeProblem(w, storeUnavailable("shaper could not reach Redis to book the call's send slot; nothing was sent: retry shortly"))
	return "503"
}

// giveBackCosts gives back the named costs of a slot the call could not
// use because it woke too late for it: nothing was sent, so the upstream
// counted none of its tokens. The request it counted stays spent, as a
// late slot's does for a job: the slot has begun, and the bucket cannot
// tell whether a later send was spaced on it (leaky.Bucket.Cancel).
func (s *Server) giveBackCosts(ctx context.Context, e *proxyEntry, c callSpec, limits []leaky.Limit) {
	for cost, n := range c.costs {
		if n <= 0 {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := e.bucket.Settle(sctx, cost, n, 0, c.partition, limits)
		cancel()
		if err != nil {
			s.m.RedisErrors.WithLabelValues("pacing").Inc()
		}
	}
}

// send sends the call on its slot. It sends nothing, answering
// errSlotGone, when the slot slipped past its guard first.
func (s *Server) send(ctx context.Context, e *proxyEntry, c callSpec, body []byte, res *leaky.Reservation) (*http.Response, error) {
	req := outboundRequest(ctx, c, body)
	if res.TooLate() {
		return nil, errSlotGone
	}
	s.drain.Sent(e.up.Name, time.Now())
	resp, err := e.client.Do(req)
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// refused acts on a 429 to a call as the dispatcher does for a job's: a
// refusal of the whole upstream pauses the fleet. It returns when the
// call may be sent again (zero: not known).
func (s *Server) refused(ctx context.Context, e *proxyEntry, resp *http.Response, rd ratelimit.Reading, res *leaky.Reservation) time.Time {
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	rf := pushback.Read(resp.Header, rd)
	if rf.Whole && e.adaptive {
		if _, err := e.bucket.Feedback(bg, true); err != nil {
			s.m.RedisErrors.WithLabelValues("pacing").Inc()
		}
	}
	now := time.Now()
	again := now.Add(rf.Wait)
	switch {
	case rf.Bare:
		until, dur, placed, err := pushback.Pause(bg, e.bucket, e.up.PushbackDefault, e.spacing, res.Now.Add(res.Delay))
		if err != nil {
			s.m.RedisErrors.WithLabelValues("pacing").Inc()
			return time.Time{}
		}
		if placed {
			s.m.UpstreamBlocks.WithLabelValues(e.up.Name, queue.BlockRefused).Inc()
			s.log.Warn("upstream answered a proxied call 429 without a time; paused fleet-wide", "upstream", e.up.Name, "for", dur)
		}
		again = now.Add(max(dur, time.Until(until)))
	case rf.Whole:
		until, err := e.bucket.Block(bg, rf.Wait, queue.BlockRefused)
		if err != nil {
			s.m.RedisErrors.WithLabelValues("pacing").Inc()
			return time.Time{}
		}
		s.m.UpstreamBlocks.WithLabelValues(e.up.Name, queue.BlockRefused).Inc()
		s.log.Warn("upstream pushed back a proxied call; blocked fleet-wide", "upstream", e.up.Name, "for", rf.Wait)
		again = now.Add(max(rf.Wait, time.Until(until)))
	default:
		// One endpoint's or partition's quota: only this call waits.
		again = now.Add(max(rf.Wait, pushback.BareBase))
	}
	return again
}

// learn records the limits an answer states for the fleet (the bucket
// obeys them on top of the configured ones), when they changed or are
// due a refresh, as the dispatcher does for jobs' answers.
func (s *Server) learn(ctx context.Context, e *proxyEntry, stated []leaky.Limit) {
	if len(stated) == 0 {
		return
	}
	e.mu.Lock()
	same := slices.Equal(stated, e.stated) && time.Since(e.learnedAt) < pushback.Relearn
	e.mu.Unlock()
	if same {
		return
	}
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := e.bucket.Learn(lctx, stated); err != nil {
		s.m.RedisErrors.WithLabelValues("pacing").Inc()
		return
	}
	e.mu.Lock()
	e.stated, e.learnedAt = stated, time.Now()
	e.mu.Unlock()
}

// holdLease extends a concurrency lease while its answer streams, which
// may outlast the lease's lifetime (the upstream's timeout); the returned
// stop ends it and waits for it.
func (s *Server) holdLease(ctx context.Context, e *proxyEntry, res *leaky.Reservation) (stop func()) {
	if res.Lease == "" {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	every := max(e.up.Timeout/2, time.Second)
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				ectx, c := context.WithTimeout(ctx, 2*time.Second)
				e.bucket.ExtendLease(ectx, res.Lease, e.up.Timeout+10*time.Second)
				c()
			}
		}
	}()
	return func() { cancel(); <-done }
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func newWaiterID() string {
	return strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.FormatUint(rand.Uint64(), 36)
}
