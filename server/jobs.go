package server

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// JobRequest is the body of POST /v1/jobs and each item of a batch.
type JobRequest struct {
	Upstream       string            `json:"upstream"`
	Method         string            `json:"method"`
	Path           string            `json:"path"`
	Headers        map[string]string `json:"headers"`
	Body           *string           `json:"body"`
	BodyBase64     *string           `json:"body_base64"`
	Cost           map[string]int64  `json:"cost"`
	Lane           string            `json:"lane"`
	IdempotencyKey string            `json:"idempotency_key"`
	MaxAttempts    int               `json:"max_attempts"`
	NotBefore      string            `json:"not_before"`
	TTL            string            `json:"ttl"`
	Task           string            `json:"task"`
}

var (
	taskPattern   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$`)
	methodAllowed = map[string]bool{"GET": true, "POST": true, "PUT": true, "PATCH": true, "DELETE": true, "HEAD": true, "OPTIONS": true}
)

const maxIdempotencyKey = 255

// toJob validates a request against its upstream and builds the job. It
// returns the field problems, all of them, and the HTTP status they call for.
func (s *Server) toJob(req *JobRequest, k *keyEntry, now time.Time, prefix string) (*queue.Job, int, []fieldError) {
	var errs []fieldError
	bad := func(field, format string, args ...any) {
		errs = append(errs, fieldError{Field: prefix + field, Message: fmt.Sprintf(format, args...)})
	}
	if req.Upstream == "" {
		bad("upstream", "is required")
		return nil, http.StatusBadRequest, errs
	}
	up, ok := s.ups[req.Upstream]
	if !ok {
		bad("upstream", "no upstream %q is configured (have: %s)", req.Upstream, strings.Join(s.upstreamNames(), ", "))
		return nil, http.StatusNotFound, errs
	}
	job := &queue.Job{Tenant: k.Tenant, Upstream: req.Upstream, Lane: req.Lane, Headers: req.Headers,
		Cost: req.Cost, IdempotencyKey: req.IdempotencyKey, MaxAttempts: req.MaxAttempts, CreatedAt: now.UTC()}

	if up.BaseURL == "" {
		if req.Task == "" {
			bad("task", "is required: upstream %s is served by a Go handler that takes named tasks", up.Name)
		} else if !taskPattern.MatchString(req.Task) {
			bad("task", "%q: must be 1-128 letters, digits and ._:/-", req.Task)
		}
		if req.Path != "" || req.Method != "" || len(req.Headers) > 0 {
			bad("path", "upstream %s is served by a Go handler: send task and body, not method, path or headers", up.Name)
		}
		job.Task = req.Task
	} else {
		if req.Task != "" {
			bad("task", "upstream %s is an HTTP API: send method and path, not task", up.Name)
		}
		switch {
		case req.Path == "":
			bad("path", "is required: the request path relative to %s", up.BaseURL)
		default:
			if _, err := queue.Target(up.base, req.Path); err != nil {
				bad("path", "%v", err)
			}
		}
		method := strings.ToUpper(req.Method)
		if req.Method != "" && !methodAllowed[method] {
			bad("method", "%q: must be one of GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS", req.Method)
		}
		job.Method, job.Path = method, req.Path
		for name, v := range req.Headers {
			canon := http.CanonicalHeaderKey(name)
			switch err := queue.CheckHeader(name, v); {
			case err != nil:
				bad("headers."+name, "%v", err)
			case up.headers[canon]:
				bad("headers."+name, "is set by shaper's workers for upstream %s; a job may not set it", up.Name)
			}
		}
	}

	switch {
	case req.Body != nil && req.BodyBase64 != nil:
		bad("body", "send either body or body_base64, not both")
	case req.Body != nil:
		job.Body = []byte(*req.Body)
	case req.BodyBase64 != nil:
		b, err := base64.StdEncoding.DecodeString(*req.BodyBase64)
		if err != nil {
			bad("body_base64", "is not valid base64: %v", err)
		}
		job.Body = b
	}

	for name, n := range req.Cost {
		switch {
		case n < 0:
			bad("cost."+name, "%d: must not be negative", n)
		case !up.costs[name]:
			bad("cost."+name, "upstream %s has no limit counting %q (it counts: %s)", up.Name, name, strings.Join(costNames(up), ", "))
		}
	}
	if len(errs) == 0 {
		if err := up.bucket.CheckCosts(leaky.Costs(req.Cost)); err != nil {
			bad("cost", "%v; a single job cannot be sent within that limit: raise the limit's burst or split the job", err)
		}
	}
	if req.Lane != "" && !queue.ValidName(req.Lane) {
		bad("lane", "%q: not a valid lane name", req.Lane)
	} else if u, _ := s.q.Upstream(req.Upstream); req.Lane != "" && !contains(u.Lanes, req.Lane) {
		bad("lane", "upstream %s has no lane %q (lanes: %s)", up.Name, req.Lane, strings.Join(u.Lanes, ", "))
	}
	if len(req.IdempotencyKey) > maxIdempotencyKey || strings.ContainsFunc(req.IdempotencyKey, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		bad("idempotency_key", "must be at most %d printable characters", maxIdempotencyKey)
	}
	if req.MaxAttempts < 0 || req.MaxAttempts > 100 {
		bad("max_attempts", "%d: must be between 1 and 100 (0 or absent for the upstream's default)", req.MaxAttempts)
	}
	if req.NotBefore != "" {
		t, err := time.Parse(time.RFC3339Nano, req.NotBefore)
		switch {
		case err != nil:
			bad("not_before", "%q: must be an RFC 3339 time such as 2026-12-01T09:00:00Z", req.NotBefore)
		case t.After(now.Add(366 * 24 * time.Hour)):
			bad("not_before", "must be within a year")
		default:
			job.NotBefore = t.UTC()
		}
	}
	if req.TTL != "" {
		ttl, err := time.ParseDuration(req.TTL)
		switch {
		case err != nil:
			bad("ttl", "%q: must be a duration such as 30s, 10m or 24h", req.TTL)
		case ttl <= 0:
			bad("ttl", "%q: must be positive", req.TTL)
		default:
			start := now
			if job.NotBefore.After(now) {
				start = job.NotBefore
			}
			job.ExpiresAt = start.Add(ttl).UTC()
		}
	}
	if len(errs) > 0 {
		return nil, http.StatusBadRequest, errs
	}
	return job, 0, nil
}

func costNames(u upstreamEntry) []string {
	var out []string
	for c := range u.costs {
		out = append(out, c)
	}
	sort.Strings(out)
	if len(out) == 0 {
		return []string{"requests only"}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func (s *Server) upstreamNames() []string {
	var out []string
	for n := range s.ups {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// decode reads a JSON body strictly: the right content type, within the size
// limit, no unknown fields, nothing after the value.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	ct := r.Header.Get("Content-Type")
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
		writeProblem(w, problem{Type: problemUnsupportedMedia, Title: "Unsupported media type", Status: http.StatusUnsupportedMediaType,
			Detail: fmt.Sprintf("Content-Type %q: send application/json", ct)})
		return false
	}
	r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, extra := dec.Token(); extra != io.EOF {
			err = errors.New("unexpected data after the JSON value")
		}
	}
	if err == nil {
		return true
	}
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		writeProblem(w, problem{Type: problemTooLarge, Title: "Request too large", Status: http.StatusRequestEntityTooLarge,
			Detail: fmt.Sprintf("the body exceeds %d bytes (api.max_body_bytes)", s.cfg.MaxBodyBytes)})
		return false
	}
	writeProblem(w, problem{Type: problemInvalid, Title: "Invalid request", Status: http.StatusBadRequest,
		Detail: "malformed JSON: " + describeJSONError(err)})
	return false
}

// describeJSONError names the field a decoding error is about.
func describeJSONError(err error) string {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		field := te.Field
		if field == "" {
			field = "the body"
		}
		return fmt.Sprintf("%s: expected %s, got a JSON %s", field, te.Type, te.Value)
	case errors.As(err, &se):
		return fmt.Sprintf("syntax error at byte %d: %v", se.Offset, err)
	case errors.Is(err, io.EOF):
		return "the body is empty"
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return "unknown field " + strings.TrimPrefix(err.Error(), "json: unknown field ")
	}
	return err.Error()
}

func (s *Server) handleEnqueue(w http.ResponseWriter, r *http.Request) {
	var req JobRequest
	if !s.decode(w, r, &req) {
		s.m.JobsRejected.WithLabelValues(req.Upstream, "invalid").Inc()
		return
	}
	k := caller(r)
	job, status, errs := s.toJob(&req, k, s.cfg.Now(), "")
	if errs != nil {
		s.rejectJob(w, req.Upstream, status, errs)
		return
	}
	if !s.admit(w, r, 1) {
		s.m.JobsRejected.WithLabelValues(req.Upstream, "rate_limited").Inc()
		return
	}
	info, created, err := s.q.Enqueue(r.Context(), job)
	if err != nil {
		s.enqueueError(w, r, job.Upstream, err)
		return
	}
	if !created {
		writeJSON(w, http.StatusOK, jobView(info))
		return
	}
	s.m.JobsEnqueued.WithLabelValues(info.Upstream, info.Lane).Inc()
	w.Header().Set("Location", "/v1/jobs/"+info.ID)
	writeJSON(w, http.StatusAccepted, accepted{ID: info.ID, State: info.State, Upstream: info.Upstream, Lane: info.Lane,
		IdempotencyKey: info.IdempotencyKey, CreatedAt: info.CreatedAt})
}

func (s *Server) rejectJob(w http.ResponseWriter, upstream string, status int, errs []fieldError) {
	reason := "invalid"
	title := "Invalid job"
	typ := problemInvalid
	if status == http.StatusNotFound {
		reason, title, typ, upstream = "unknown_upstream", "Unknown upstream", problemNotFound, "unknown"
	}
	s.m.JobsRejected.WithLabelValues(upstream, reason).Inc()
	writeProblem(w, problem{Type: typ, Title: title, Status: status, Detail: summarize(errs), Errors: errs})
}

func summarize(errs []fieldError) string {
	parts := make([]string, len(errs))
	for i, e := range errs {
		parts[i] = e.Field + " " + e.Message
	}
	return strings.Join(parts, "; ")
}

// enqueueError answers a failed enqueue: 503 for a full backlog, with when
// to come back, else a store failure.
func (s *Server) enqueueError(w http.ResponseWriter, r *http.Request, upstream string, err error) {
	var full *queue.BacklogFullError
	if errors.As(err, &full) {
		s.m.JobsRejected.WithLabelValues(upstream, "backlog_full").Inc()
		retry := s.backlogRetryAfter(r.Context(), upstream, full)
		w.Header().Set("Retry-After", fmt.Sprint(retry))
		writeProblem(w, problem{Type: problemBacklogFull, Title: "Backlog full", Status: http.StatusServiceUnavailable,
			Detail: full.Error() + fmt.Sprintf("; retry in %ds", retry), RetryAfter: retry})
		return
	}
	s.m.JobsRejected.WithLabelValues(upstream, "store_error").Inc()
	s.internalError(w, r, "enqueue", err)
}

type accepted struct {
	ID             string      `json:"id"`
	State          queue.State `json:"state"`
	Upstream       string      `json:"upstream"`
	Lane           string      `json:"lane"`
	IdempotencyKey string      `json:"idempotency_key"`
	CreatedAt      time.Time   `json:"created_at"`
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

func (s *Server) handleBatch(w http.ResponseWriter, r *http.Request) {
	var req batchRequest
	if !s.decode(w, r, &req) {
		return
	}
	if len(req.Jobs) == 0 || len(req.Jobs) > s.cfg.MaxBatch {
		writeProblem(w, problem{Type: problemInvalid, Title: "Invalid request", Status: http.StatusBadRequest,
			Detail: fmt.Sprintf("jobs: a batch holds 1 to %d jobs, got %d", s.cfg.MaxBatch, len(req.Jobs)),
			Errors: []fieldError{{Field: "jobs", Message: fmt.Sprintf("must hold 1 to %d jobs", s.cfg.MaxBatch)}}})
		return
	}
	k := caller(r)
	now := s.cfg.Now()
	results := make([]batchResult, len(req.Jobs))
	jobs := make([]*queue.Job, len(req.Jobs))
	for i, raw := range req.Jobs {
		results[i].Index = i
		var jr JobRequest
		dec := json.NewDecoder(strings.NewReader(string(raw)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&jr); err != nil {
			results[i].Status = http.StatusBadRequest
			results[i].Error = &problem{Type: problemInvalid, Title: "Invalid job", Status: http.StatusBadRequest,
				Detail: fmt.Sprintf("jobs[%d]: %s", i, describeJSONError(err))}
			continue
		}
		job, status, errs := s.toJob(&jr, k, now, fmt.Sprintf("jobs[%d].", i))
		if errs != nil {
			typ := problemInvalid
			if status == http.StatusNotFound {
				typ = problemNotFound
			}
			results[i].Status = status
			results[i].Error = &problem{Type: typ, Title: "Invalid job", Status: status, Detail: summarize(errs), Errors: errs}
			s.m.JobsRejected.WithLabelValues(jr.Upstream, "invalid").Inc()
			continue
		}
		jobs[i] = job
	}
	valid := 0
	for _, j := range jobs {
		if j != nil {
			valid++
		}
	}
	if valid > 0 && !s.admit(w, r, int64(valid)) {
		return
	}
	// Enqueue concurrently, so the round trips share pipelines.
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i, job := range jobs {
		if job == nil {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			info, created, err := s.q.EnqueueMany(r.Context(), job)
			switch {
			case err != nil:
				var full *queue.BacklogFullError
				if errors.As(err, &full) {
					s.m.JobsRejected.WithLabelValues(job.Upstream, "backlog_full").Inc()
					results[i].Status = http.StatusServiceUnavailable
					results[i].Error = &problem{Type: problemBacklogFull, Title: "Backlog full", Status: http.StatusServiceUnavailable,
						Detail: full.Error(), RetryAfter: s.backlogRetryAfter(r.Context(), job.Upstream, full)}
					return
				}
				s.m.RedisErrors.WithLabelValues("enqueue").Inc()
				results[i].Status = http.StatusServiceUnavailable
				results[i].Error = &problem{Type: problemUnavailable, Title: "Service unavailable", Status: http.StatusServiceUnavailable,
					Detail: "could not enqueue: store unavailable", RetryAfter: 1}
			case !created:
				results[i].Status, results[i].Job = http.StatusOK, jobView(info)
			default:
				s.m.JobsEnqueued.WithLabelValues(info.Upstream, info.Lane).Inc()
				results[i].Status = http.StatusAccepted
				results[i].Job = accepted{ID: info.ID, State: info.State, Upstream: info.Upstream, Lane: info.Lane,
					IdempotencyKey: info.IdempotencyKey, CreatedAt: info.CreatedAt}
			}
		}()
	}
	wg.Wait()
	writeJSON(w, http.StatusOK, map[string]any{"results": results})
}

func (s *Server) handleGet(w http.ResponseWriter, r *http.Request) {
	info, err := s.q.Get(r.Context(), r.PathValue("id"), caller(r).Tenant)
	if err != nil {
		s.jobError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, jobView(info))
}

func (s *Server) handleCancel(w http.ResponseWriter, r *http.Request) {
	info, err := s.q.Cancel(r.Context(), r.PathValue("id"), caller(r).Tenant)
	if err != nil {
		s.jobError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, jobView(info))
}

func (s *Server) jobError(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, queue.ErrNotFound):
		writeProblem(w, problem{Type: problemNotFound, Title: "Job not found", Status: http.StatusNotFound,
			Detail: fmt.Sprintf("no job %q for this key's tenant", r.PathValue("id"))})
	case errors.Is(err, queue.ErrNotCancellable):
		writeProblem(w, problem{Type: problemConflict, Title: "Job cannot be cancelled", Status: http.StatusConflict, Detail: err.Error()})
	default:
		s.internalError(w, r, "jobs", err)
	}
}

// JobView is a job as the API shows it.
type JobView struct {
	ID             string           `json:"id"`
	Tenant         string           `json:"tenant"`
	Upstream       string           `json:"upstream"`
	Lane           string           `json:"lane"`
	State          queue.State      `json:"state"`
	Attempts       int              `json:"attempts"`
	MaxAttempts    int              `json:"max_attempts"`
	LastError      string           `json:"last_error,omitempty"`
	IdempotencyKey string           `json:"idempotency_key"`
	Method         string           `json:"method,omitempty"`
	Path           string           `json:"path,omitempty"`
	Task           string           `json:"task,omitempty"`
	Cost           map[string]int64 `json:"cost,omitempty"`
	CreatedAt      time.Time        `json:"created_at"`
	NotBefore      *time.Time       `json:"not_before,omitempty"`
	ExpiresAt      *time.Time       `json:"expires_at,omitempty"`
	NextAttemptAt  *time.Time       `json:"next_attempt_at,omitempty"`
	LastFailedAt   *time.Time       `json:"last_failed_at,omitempty"`
	CompletedAt    *time.Time       `json:"completed_at,omitempty"`
	Response       *ResponseView    `json:"response,omitempty"`
}

// ResponseView is the upstream's answer; the body is text when it is UTF-8,
// else base64.
type ResponseView struct {
	Status     int                 `json:"status"`
	Headers    map[string][]string `json:"headers,omitempty"`
	Body       *string             `json:"body,omitempty"`
	BodyBase64 *string             `json:"body_base64,omitempty"`
	Truncated  bool                `json:"truncated,omitempty"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func jobView(i *queue.Info) JobView {
	v := JobView{
		ID: i.ID, Tenant: i.Tenant, Upstream: i.Upstream, Lane: i.Lane, State: i.State, Attempts: i.Attempts,
		MaxAttempts: i.MaxAttempts, LastError: i.LastError, IdempotencyKey: i.IdempotencyKey, Method: i.Method,
		Path: i.Path, Task: i.Task, Cost: i.Cost, CreatedAt: i.CreatedAt.UTC(),
		NotBefore: timePtr(i.NotBefore), ExpiresAt: timePtr(i.ExpiresAt), NextAttemptAt: timePtr(i.NextAttemptAt),
		LastFailedAt: timePtr(i.LastFailedAt), CompletedAt: timePtr(i.CompletedAt),
	}
	if i.Response != nil {
		rv := &ResponseView{Status: i.Response.Status, Headers: i.Response.Headers, Truncated: i.Response.Truncated}
		if utf8.Valid(i.Response.Body) {
			b := string(i.Response.Body)
			rv.Body = &b
		} else {
			b := base64.StdEncoding.EncodeToString(i.Response.Body)
			rv.BodyBase64 = &b
		}
		v.Response = rv
	}
	return v
}
