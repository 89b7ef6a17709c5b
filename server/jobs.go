package server

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/shaperhq/shaper"
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
	Partition      string            `json:"partition"`
	CallbackURL    string            `json:"callback_url"`
}

// taskPattern is what a Go handler's task name may be; a compiled pattern
// is the package's only variable.
var taskPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$`)

// methodAllowed reports the methods a job may use (upper case).
func methodAllowed(m string) bool {
	switch m {
	case "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS":
		return true
	}
	return false
}

const maxIdempotencyKey = 255

// fieldProblems collects a request's field problems, each field named with
// the item's prefix ("jobs[3]." in a batch).
type fieldProblems struct {
	prefix string
	list   []fieldError
}

func (p *fieldProblems) add(field, format string, args ...any) {
	p.list = append(p.list, fieldError{Field: p.prefix + field, Message: fmt.Sprintf(format, args...)})
}

// has reports whether field already has a problem.
func (p *fieldProblems) has(field string) bool {
	return slices.ContainsFunc(p.list, func(e fieldError) bool { return e.Field == p.prefix+field })
}

// toJob validates a request against its upstream and builds the job. It
// returns the field problems, all of them, and the HTTP status they call
// for: 404 for an unknown upstream, else 400.
func (s *Server) toJob(req *JobRequest, k *keyEntry, now time.Time, prefix string) (*queue.Job, int, []fieldError) {
	p := &fieldProblems{prefix: prefix}
	status := http.StatusBadRequest
	up, ok := s.ups[req.Upstream]
	switch {
	case req.Upstream == "":
		p.add("upstream", "is required")
	case !ok:
		p.add("upstream", "no upstream %q is configured (have: %s)", req.Upstream, strings.Join(s.upstreamNames(), ", "))
		status = http.StatusNotFound
	}
	job := &queue.Job{Tenant: k.Tenant, Upstream: req.Upstream, Lane: req.Lane, Headers: req.Headers,
		Cost: req.Cost, IdempotencyKey: req.IdempotencyKey, MaxAttempts: req.MaxAttempts, CreatedAt: now.UTC()}
	// Without its upstream a job is still checked as far as it can be, so
	// that a producer hears of every mistake in one answer rather than one
	// per attempt.
	switch {
	case !ok:
		checkMethod(p, req)
	case up.BaseURL == "":
		checkTask(p, up, req, job)
	default:
		checkRequest(p, up, req, job)
	}
	checkBody(p, req, job)
	if ok {
		checkCost(p, up, req)
		checkPartition(p, up, req, job)
		checkLane(p, up, req)
	}
	checkAttempts(p, req)
	checkSchedule(p, req, job, now)
	s.checkCallback(p, req, job, k)
	if len(p.list) > 0 {
		return nil, status, p.list
	}
	return job, 0, nil
}

// checkMethod reads method, which must be one shaper sends.
func checkMethod(p *fieldProblems, req *JobRequest) {
	if req.Method != "" && !methodAllowed(strings.ToUpper(req.Method)) {
		p.add("method", "%q: must be one of GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS", req.Method)
	}
}

// checkTask reads a job for a Go handler upstream: a named task, and no
// HTTP request parts.
func checkTask(p *fieldProblems, up upstreamEntry, req *JobRequest, job *queue.Job) {
	if req.Task == "" {
		p.add("task", "is required: upstream %s is served by a Go handler that takes named tasks", up.Name)
	} else if !taskPattern.MatchString(req.Task) {
		p.add("task", "%q: must be 1-128 letters, digits and ._:/-", req.Task)
	}
	if req.Path != "" || req.Method != "" || len(req.Headers) > 0 {
		p.add("path", "upstream %s is served by a Go handler: send task and body, not method, path or headers", up.Name)
	}
	job.Task = req.Task
}

// checkRequest reads a job for an HTTP upstream: method, path and headers.
func checkRequest(p *fieldProblems, up upstreamEntry, req *JobRequest, job *queue.Job) {
	if req.Task != "" {
		p.add("task", "upstream %s is an HTTP API: send method and path, not task", up.Name)
	}
	// The path must stay on the upstream.
	switch {
	case req.Path == "":
		p.add("path", "is required: the request path relative to %s", up.BaseURL)
	default:
		if _, err := queue.Target(up.base, req.Path); err != nil {
			p.add("path", "%v", err)
		}
	}
	checkMethod(p, req)
	job.Method, job.Path = strings.ToUpper(req.Method), req.Path
	// Header names and values must be sendable, and not the ones the HTTP
	// client or the workers set.
	names := slices.Sorted(maps.Keys(req.Headers))
	seen := map[string]string{}
	for _, name := range names {
		canon := http.CanonicalHeaderKey(name)
		if first, dup := seen[canon]; dup {
			// HTTP names are case-insensitive: only one of the two values
			// could be sent, and which one would be chance.
			p.add("headers."+name, "names the same header as headers.%s (header names ignore case); send it once", first)
			continue
		}
		seen[canon] = name
		switch err := queue.CheckHeader(name, req.Headers[name]); {
		case err != nil:
			p.add("headers."+name, "%v", err)
		case up.headers[canon]:
			p.add("headers."+name, "is set by shaper's workers for upstream %s; a job may not set it", up.Name)
		}
	}
}

// checkBody reads the body, given as text or as base64.
func checkBody(p *fieldProblems, req *JobRequest, job *queue.Job) {
	switch {
	case req.Body != nil && req.BodyBase64 != nil:
		p.add("body", "send either body or body_base64, not both")
	case req.Body != nil:
		job.Body = []byte(*req.Body)
	case req.BodyBase64 != nil:
		b, err := base64.StdEncoding.DecodeString(*req.BodyBase64)
		if err != nil {
			p.add("body_base64", "is not valid base64: %v", err)
		}
		job.Body = b
	}
}

// checkCost requires every named cost to be one the upstream's limits
// count, and the job to fit within each limit's burst: a job that no
// reservation could carry would wait forever.
func checkCost(p *fieldProblems, up upstreamEntry, req *JobRequest) {
	for _, name := range slices.Sorted(maps.Keys(req.Cost)) {
		switch n := req.Cost[name]; {
		case n < 0:
			p.add("cost."+name, "%d: must not be negative", n)
		case !up.costs[name]:
			p.add("cost."+name, "upstream %s has no limit counting %q (it counts: %s)", up.Name, name, strings.Join(costNames(up), ", "))
		default:
			// The bucket's limits are the ones its reservations check.
			if l, ok := tightest(up.bucket.Config().Limits, name, n); ok {
				p.add("cost."+name, "%s", neverFits(n, "limit", l))
			}
		}
	}
}

// tightest is the limit counting cost that lets the least through per job,
// when that is less than n.
func tightest(limits []leaky.Limit, cost string, n int64) (leaky.Limit, bool) {
	var worst leaky.Limit
	found := false
	for _, l := range limits {
		if l.Cost == cost && n > l.Capacity() && (!found || l.Capacity() < worst.Capacity()) {
			worst, found = l, true
		}
	}
	return worst, found
}

// neverFits says, in one sentence, why a job's cost n can never be sent:
// which limit refuses it, the most it takes per job, and what to change.
// The limit is named by rate and window only (its String adds the burst,
// which the sentence states on its own).
func neverFits(n int64, what string, l leaky.Limit) string {
	fix := "raise its burst"
	if l.Capacity() >= l.Rate {
		// burst is already the rate, its maximum.
		fix = "split the job"
	}
	return fmt.Sprintf("%d can never be sent: %s \"%d %s per %v\" takes at most %d per job (%s)",
		n, what, l.Rate, l.Unit(), l.Per, l.Capacity(), fix)
}

// checkPartition bounds the partition (see shaper.CheckPartition) and
// requires the job's costs to fit within each of the partition's own
// limits, as checkCost does for the upstream's: a job that no slot of its
// partition could carry would wait forever. A partition on an upstream
// that limits no partition is accepted: it labels the job.
func checkPartition(p *fieldProblems, up upstreamEntry, req *JobRequest, job *queue.Job) {
	if req.Partition == "" {
		return
	}
	if err := shaper.CheckPartition(req.Partition); err != nil {
		p.add("partition", "%v (a partition is a recipient domain, customer or credential id: up to %d bytes of UTF-8 text without control characters)", err, shaper.MaxPartitionBytes)
		return
	}
	job.Partition = req.Partition
	limits := up.PartitionLimitsFor(req.Partition)
	for _, name := range slices.Sorted(maps.Keys(req.Cost)) {
		if p.has("cost." + name) {
			// The upstream's own limit already refused it; one reason is enough.
			continue
		}
		if l, ok := tightest(limits, name, req.Cost[name]); ok {
			p.add("cost."+name, "%s", neverFits(req.Cost[name], fmt.Sprintf("partition %q's limit", req.Partition), l))
		}
	}
}

// checkLane requires the lane, when given, to be one of the upstream's.
func checkLane(p *fieldProblems, up upstreamEntry, req *JobRequest) {
	if req.Lane == "" {
		return
	}
	if !queue.ValidName(req.Lane) {
		p.add("lane", "%q: not a valid lane name", req.Lane)
	} else if !up.HasLane(req.Lane) {
		p.add("lane", "upstream %s has no lane %q (lanes: %s)", up.Name, req.Lane, strings.Join(up.LaneNames(), ", "))
	}
}

// checkAttempts bounds the idempotency key and max_attempts.
func checkAttempts(p *fieldProblems, req *JobRequest) {
	if len(req.IdempotencyKey) > maxIdempotencyKey || strings.ContainsFunc(req.IdempotencyKey, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		p.add("idempotency_key", "must be at most %d printable characters", maxIdempotencyKey)
	}
	if req.MaxAttempts < 0 || req.MaxAttempts > 100 {
		p.add("max_attempts", "%d: must be between 1 and 100 (0 or absent for the upstream's default)", req.MaxAttempts)
	}
}

// checkSchedule reads not_before and ttl; a ttl counts from not_before
// when that is later than now.
func checkSchedule(p *fieldProblems, req *JobRequest, job *queue.Job, now time.Time) {
	if req.NotBefore != "" {
		t, err := time.Parse(time.RFC3339Nano, req.NotBefore)
		switch {
		case err != nil:
			p.add("not_before", "%q: must be an RFC 3339 time such as 2026-12-01T09:00:00Z", req.NotBefore)
		case t.After(now.Add(366 * 24 * time.Hour)):
			p.add("not_before", "must be within a year")
		default:
			job.NotBefore = t.UTC()
		}
	}
	if req.TTL != "" {
		ttl, err := time.ParseDuration(req.TTL)
		switch {
		case err != nil:
			p.add("ttl", "%q: must be a duration such as 30s, 10m or 24h", req.TTL)
		case ttl <= 0:
			p.add("ttl", "%q: must be positive", req.TTL)
		default:
			start := now
			if job.NotBefore.After(now) {
				start = job.NotBefore
			}
			job.ExpiresAt = start.Add(ttl).UTC()
		}
	}
}

func costNames(u upstreamEntry) []string {
	if out := u.CostNames(); len(out) > 0 {
		return out
	}
	return []string{"requests only"}
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
// limit, no unknown fields, nothing after the value. It returns the problem
// to answer with, or nil; the caller decides when to answer, so that a bad
// request can be charged to admission first.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) *problem {
	ct := r.Header.Get("Content-Type")
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
		return &problem{Type: problemUnsupportedMedia, Title: "Unsupported media type", Status: http.StatusUnsupportedMediaType,
			Detail: fmt.Sprintf("Content-Type %q: send application/json", ct)}
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
		return nil
	}
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return &problem{Type: problemTooLarge, Title: "Request too large", Status: http.StatusRequestEntityTooLarge,
			Detail: fmt.Sprintf("the body exceeds %d bytes (api.max_body_bytes)", s.cfg.MaxBodyBytes)}
	}
	return &problem{Type: problemInvalid, Title: "Invalid request", Status: http.StatusBadRequest,
		Detail: "malformed JSON: " + describeJSONError(err)}
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

func (s *Server) handleGet(w http.ResponseWriter, r *http.Request) {
	if q := r.URL.Query(); q.Has("wait") {
		s.handleGetWait(w, r, q.Get("wait"))
		return
	}
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
	var full *queue.BacklogFullError
	switch {
	case errors.Is(err, queue.ErrNoLongerKept):
		writeProblem(w, problem{Type: problemJobExpired, Title: "Job no longer kept", Status: http.StatusNotFound,
			Detail: fmt.Sprintf("job %q finished and its result is no longer kept (its upstream keeps finished jobs up to result_max_count or dead_max_count, and for result_retention or dead_retention)", r.PathValue("id"))})
	case errors.Is(err, queue.ErrNotFound):
		writeProblem(w, problem{Type: problemNotFound, Title: "Job not found", Status: http.StatusNotFound,
			Detail: fmt.Sprintf("no job %q for this key's tenant", r.PathValue("id"))})
	case errors.Is(err, queue.ErrNotCancellable):
		writeProblem(w, problem{Type: problemConflict, Title: "Job cannot be cancelled", Status: http.StatusConflict, Detail: err.Error()})
	case errors.Is(err, queue.ErrNoCallbackToRetry):
		writeProblem(w, problem{Type: problemConflict, Title: "No failed callback to retry", Status: http.StatusConflict, Detail: err.Error()})
	case errors.Is(err, queue.ErrNotRetryable):
		writeProblem(w, problem{Type: problemConflict, Title: "Job cannot be retried", Status: http.StatusConflict, Detail: err.Error()})
	case errors.As(err, &full):
		retry := s.backlogRetryAfter(r.Context(), full.Upstream, full)
		writeProblem(w, problem{Type: problemBacklogFull, Title: "Backlog full", Status: http.StatusServiceUnavailable,
			Detail: fmt.Sprintf("%v; the job stays where it was; retry in %ds", full, retry), RetryAfter: retry})
	default:
		s.internalError(w, r, "jobs", err)
	}
}

// JobView is a job as the API shows it.
type JobView struct {
	ID        string      `json:"id"`
	Tenant    string      `json:"tenant"`
	Upstream  string      `json:"upstream"`
	Lane      string      `json:"lane"`
	Partition string      `json:"partition,omitempty"`
	State     queue.State `json:"state"`
	// WaitingFor says what holds a scheduled job back: pause, pushback or
	// limit; empty (absent) otherwise.
	WaitingFor     string           `json:"waiting_for,omitempty"`
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
	// RetriedAt, Retries and PreviousError tell of retries by an operator
	// (POST /v1/jobs/{id}/retry): when the last was, how many, and the
	// error the job had died with then.
	RetriedAt     *time.Time    `json:"retried_at,omitempty"`
	Retries       int           `json:"retries,omitempty"`
	PreviousError string        `json:"previous_error,omitempty"`
	Response      *ResponseView `json:"response,omitempty"`
	// CallbackURL is where the job's final view is POSTed, signed; Callback
	// how that delivery stands once the job is final.
	CallbackURL string        `json:"callback_url,omitempty"`
	Callback    *CallbackView `json:"callback,omitempty"`
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
		ID: i.ID, Tenant: i.Tenant, Upstream: i.Upstream, Lane: i.Lane, Partition: i.Partition, State: i.State, WaitingFor: i.WaitingFor, Attempts: i.Attempts,
		MaxAttempts: i.MaxAttempts, LastError: i.LastError, IdempotencyKey: i.IdempotencyKey, Method: i.Method,
		Path: i.Path, Task: i.Task, Cost: i.Cost, CreatedAt: i.CreatedAt.UTC(),
		NotBefore: timePtr(i.NotBefore), ExpiresAt: timePtr(i.ExpiresAt), NextAttemptAt: timePtr(i.NextAttemptAt),
		LastFailedAt: timePtr(i.LastFailedAt), CompletedAt: timePtr(i.CompletedAt),
		RetriedAt: timePtr(i.RetriedAt), Retries: i.Retries, PreviousError: i.PreviousError,
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
	v.CallbackURL, v.Callback = i.CallbackURL, callbackView(i.Callback)
	return v
}
