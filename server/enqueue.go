package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/shaperhq/shaper/metrics"
	"github.com/shaperhq/shaper/queue"
)

// Both enqueue endpoints take the same steps in the same order: authenticate
// (authed), charge admission for the whole request, then judge each job
// (decode, validate, store) through one path, process, which also counts and
// logs. Charging before validating means a key that sends only invalid
// requests spends its allowance like any other and meets 429.

// outcome is what became of one job: its status and either the job as the
// API answers it or the problem. A single enqueue writes it as the
// response; a batch writes it as one item of its results.
type outcome struct {
	status  int
	job     any // accepted for 202, JobView for 200
	problem *problem
}

// write answers a single enqueue with o.
func (o outcome) write(w http.ResponseWriter) {
	switch {
	case o.problem != nil:
		writeProblem(w, *o.problem)
	case o.status == http.StatusAccepted:
		w.Header().Set("Location", "/v1/jobs/"+o.job.(accepted).ID)
		writeJSON(w, o.status, o.job)
	default:
		writeJSON(w, o.status, o.job)
	}
}

type accepted struct {
	ID             string      `json:"id"`
	State          queue.State `json:"state"`
	Upstream       string      `json:"upstream"`
	Lane           string      `json:"lane"`
	Partition      string      `json:"partition,omitempty"`
	IdempotencyKey string      `json:"idempotency_key"`
	CreatedAt      time.Time   `json:"created_at"`
}

// handleEnqueue answers POST /v1/jobs; it costs one admission token
// whatever its body.
func (s *Server) handleEnqueue(w http.ResponseWriter, r *http.Request) {
	var req JobRequest
	bad := s.decode(w, r, &req)
	r = s.withStoreBudget(r)
	if !s.admit(w, r, 1) {
		s.m.JobsRejected.WithLabelValues(s.upstreamLabel(req.Upstream), "rate_limited").Inc()
		return
	}
	o := s.process(r.Context(), caller(r), s.cfg.Now(), item{req: req, bad: bad}, "")
	if secs, ok := preferWait(r.Header); ok {
		var final bool
		if o, final = s.waitedOutcome(r, o, secs); final {
			preferenceApplied(w, secs)
		}
	}
	o.write(w)
}

// batchRequest is the body of POST /v1/jobs/batch.
type batchRequest struct {
	Jobs []json.RawMessage `json:"jobs"`
}

type batchResult struct {
	Index  int      `json:"index"`
	Status int      `json:"status"`
	Job    any      `json:"job,omitempty"`
	Error  *problem `json:"error,omitempty"`
}

// item is one job request as decoded, with the problem when it could not be.
type item struct {
	req JobRequest
	bad *problem
}

// handleBatch answers POST /v1/jobs/batch. It costs one admission token per
// item, valid or not, all or nothing (one token when the body cannot be read
// or holds no or too many items).
func (s *Server) handleBatch(w http.ResponseWriter, r *http.Request) {
	items, bad := s.decodeBatch(w, r)
	r = s.withStoreBudget(r)
	charge := int64(len(items))
	if bad != nil {
		charge = 1
	}
	if !s.admit(w, r, charge) {
		if bad != nil {
			s.m.JobsRejected.WithLabelValues(metrics.UnknownUpstream, "rate_limited").Inc()
		}
		for _, it := range items {
			s.m.JobsRejected.WithLabelValues(s.upstreamLabel(it.req.Upstream), "rate_limited").Inc()
		}
		return
	}
	if bad != nil {
		s.m.JobsRejected.WithLabelValues(metrics.UnknownUpstream, "invalid").Inc()
		writeProblem(w, *bad)
		return
	}
	results, waited := s.processAll(r, caller(r), items)
	if waited >= 0 {
		preferenceApplied(w, waited)
	}
	writeJSON(w, http.StatusOK, map[string]any{"results": results})
}

// decodeBatch reads a batch and each of its items; the problem is for the
// batch as a whole (unreadable, or no or too many items).
func (s *Server) decodeBatch(w http.ResponseWriter, r *http.Request) ([]item, *problem) {
	var req batchRequest
	if bad := s.decode(w, r, &req); bad != nil {
		return nil, bad
	}
	if n := len(req.Jobs); n == 0 || n > s.maxBatch {
		why := ""
		if s.maxBatch < s.cfg.MaxBatch {
			why = fmt.Sprintf(" (api.admission.capacity %d caps a batch, since a batch is admitted whole)", s.maxBatch)
		}
		return nil, &problem{Type: problemInvalid, Title: "Invalid request", Status: http.StatusBadRequest,
			Detail: fmt.Sprintf("jobs: a batch holds 1 to %d jobs%s, got %d; split the batch", s.maxBatch, why, n),
			Errors: []fieldError{{Field: "jobs", Message: fmt.Sprintf("must hold 1 to %d jobs", s.maxBatch)}}}
	}
	items := make([]item, len(req.Jobs))
	for i, raw := range req.Jobs {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&items[i].req); err != nil {
			items[i].bad = &problem{Type: problemInvalid, Title: "Invalid job", Status: http.StatusBadRequest,
				Detail: fmt.Sprintf("jobs[%d]: %s", i, describeJSONError(err))}
		}
	}
	return items, nil
}

// processAll judges every item of a batch as process does, then stores
// the valid ones together, in the batch's order (queue.EnqueueBatch), so
// that the jobs of one flow leave in the order the batch gives them.
//
// With Prefer: wait=N, every stored job is waited for, together, up to N
// seconds: each final by then is answered 200 with its final job, the
// others as without it (202, or 200 for an existing one); the batch says
// Preference-Applied when every stored job is final (waited is then N,
// else -1).
func (s *Server) processAll(r *http.Request, k *keyEntry, items []item) (results []batchResult, waited int64) {
	ctx := r.Context()
	now := s.cfg.Now()
	outs := make([]outcome, len(items))
	var jobs []*queue.Job
	var at []int
	for i, it := range items {
		job, o, ok := s.judge(k, now, it, fmt.Sprintf("jobs[%d].", i))
		if !ok {
			outs[i] = o
			continue
		}
		jobs = append(jobs, job)
		at = append(at, i)
	}
	if len(jobs) > 0 {
		for k, o := range s.storeJobs(ctx, jobs) {
			outs[at[k]] = o
		}
	}
	waited = s.waitBatch(r, outs)
	results = make([]batchResult, len(items))
	for i, o := range outs {
		results[i] = batchResult{Index: i, Status: o.status, Job: o.job, Error: o.problem}
	}
	return results, waited
}

// process judges one job request and, when it is valid, stores it. With
// processAll it is the one path of single and batch enqueues: every
// outcome is counted here or there, and store failures are logged in
// storeOutcome. prefix names the item's fields ("jobs[3]." in a batch).
func (s *Server) process(ctx context.Context, k *keyEntry, now time.Time, it item, prefix string) outcome {
	job, o, ok := s.judge(k, now, it, prefix)
	if !ok {
		return o
	}
	return s.storeJobs(ctx, []*queue.Job{job})[0]
}

// judge decodes and validates one job request: the job, or the outcome of
// its refusal (counted) and false.
func (s *Server) judge(k *keyEntry, now time.Time, it item, prefix string) (*queue.Job, outcome, bool) {
	if it.bad != nil {
		return nil, s.reject(it.req.Upstream, "invalid", *it.bad), false
	}
	job, status, errs := s.toJob(&it.req, k, now, prefix)
	if errs != nil {
		reason, title, typ := "invalid", "Invalid job", problemInvalid
		if status == http.StatusNotFound {
			reason, title, typ = "unknown_upstream", "Unknown upstream", problemNotFound
		}
		return nil, s.reject(it.req.Upstream, reason, problem{Type: typ, Title: title, Status: status, Detail: summarize(errs), Errors: errs}), false
	}
	return job, outcome{}, true
}

// reject counts a job refused for reason and makes p its outcome.
func (s *Server) reject(upstream, reason string, p problem) outcome {
	s.m.JobsRejected.WithLabelValues(s.upstreamLabel(upstream), reason).Inc()
	return outcome{status: p.Status, problem: &p}
}

// storeJobs stores validated jobs, in order, within the store budget and
// behind the breaker, and makes each one's outcome (storeOutcome).
func (s *Server) storeJobs(ctx context.Context, jobs []*queue.Job) []outcome {
	outs := make([]outcome, len(jobs))
	if !s.store.allow() {
		for i, job := range jobs {
			outs[i] = s.reject(job.Upstream, "store_error", storeUnavailable(
				"could not store the job: Redis failed moments ago and is not answering yet; nothing was enqueued"))
		}
		return outs
	}
	tctx, cancel := context.WithDeadline(ctx, storeDeadline(ctx, s.cfg.StoreTimeout))
	var rs []queue.Result
	if len(jobs) == 1 {
		info, created, err := s.q.Enqueue(tctx, jobs[0])
		rs = []queue.Result{{Info: info, Created: created, Err: err}}
	} else {
		rs = s.q.EnqueueBatch(tctx, jobs)
	}
	cancel()
	for i, r := range rs {
		outs[i] = s.storeOutcome(ctx, jobs[i], r)
	}
	return outs
}

// storeOutcome is the outcome of storing job: 202 created, 200 an existing
// job with the same idempotency key, 503 backlog full or store unavailable.
func (s *Server) storeOutcome(ctx context.Context, job *queue.Job, r queue.Result) outcome {
	info, created, err := r.Info, r.Created, r.Err
	var full *queue.BacklogFullError
	switch {
	case errors.As(err, &full):
		s.store.succeeded()
		retry := s.backlogRetryAfter(ctx, job.Upstream, full)
		return s.reject(job.Upstream, "backlog_full", problem{Type: problemBacklogFull, Title: "Backlog full",
			Status: http.StatusServiceUnavailable, Detail: fmt.Sprintf("%v; retry in %ds", full, retry), RetryAfter: retry})
	case err != nil:
		s.store.record(ctx, err)
		if ctx.Err() == nil { // else the producer left: nothing to say about Redis
			s.m.RedisErrors.WithLabelValues("enqueue").Inc()
			s.log.Error("enqueue failed", "upstream", job.Upstream, "err", err)
		}
		// A timed-out write may still have reached Redis: say so, rather
		// than promise that nothing was stored.
		return s.reject(job.Upstream, "store_error", storeUnavailable("could not store the job: Redis did not answer in time; "+
			"it may or may not have been enqueued, so retry with the same idempotency_key (a repeat returns the stored job)"))
	}
	s.store.succeeded()
	if !created {
		return outcome{status: http.StatusOK, job: jobView(info)}
	}
	s.m.JobsEnqueued.WithLabelValues(info.Upstream, info.Lane).Inc()
	return outcome{status: http.StatusAccepted, job: accepted{ID: info.ID, State: info.State, Upstream: info.Upstream,
		Lane: info.Lane, Partition: info.Partition, IdempotencyKey: info.IdempotencyKey, CreatedAt: info.CreatedAt}}
}

// upstreamLabel is the upstream label for a name a request gave: the name
// when it is configured, else "unknown", so no request can add a series.
func (s *Server) upstreamLabel(name string) string {
	if _, ok := s.ups[name]; ok {
		return name
	}
	return metrics.UnknownUpstream
}

func summarize(errs []fieldError) string {
	parts := make([]string, len(errs))
	for i, e := range errs {
		parts[i] = e.Field + " " + e.Message
	}
	return strings.Join(parts, "; ")
}
