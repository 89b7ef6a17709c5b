package client

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"
)

// State is where a job is in its life.
type State string

// The states a job goes through. Queued, scheduled, active and retrying
// jobs are still in the server's hands; succeeded, dead and cancelled are
// final.
const (
	StateQueued    State = "queued"
	StateScheduled State = "scheduled"
	StateActive    State = "active"
	StateRetrying  State = "retrying"
	StateSucceeded State = "succeeded"
	StateDead      State = "dead"
	StateCancelled State = "cancelled"
)

// Final reports whether a job in state s will never change again.
func (s State) Final() bool {
	return s == StateSucceeded || s == StateDead || s == StateCancelled
}

// JobRequest is one call for shaper to make: an HTTP request relative to
// the upstream's base URL, or for an upstream served by a Go handler, a
// named Task with Body as its payload. Only Upstream is required; the
// server fills in the rest from the upstream's config.
type JobRequest struct {
	// Upstream names the configured upstream, e.g. "stripe".
	Upstream string
	// Method is the HTTP method; the server's default when empty.
	Method string
	// Path is relative to the upstream's base URL, e.g. "/v1/charges".
	Path string
	// Headers are added to the call; the upstream's own configured headers
	// (credentials) are added by the workers.
	Headers map[string]string
	// Body is sent as is. It travels as JSON text when it is valid UTF-8
	// and base64 otherwise, so binary bodies arrive intact either way.
	Body []byte
	// Task names the work for an upstream served by a Go handler.
	Task string
	// Cost is the job's amounts by name, e.g. {"tokens": 1200}, counted
	// against the upstream's limits that name them.
	Cost map[string]int64
	// Lane picks one of the upstream's lanes; empty is the lane named
	// "default", which every upstream has.
	Lane string
	// IdempotencyKey makes a repeat of the request return the first job
	// (with Job.Existing set) instead of making another, and is sent to
	// the upstream on every attempt. With WithRetry and no key, the client
	// makes one up.
	IdempotencyKey string
	// MaxAttempts bounds the attempts; the upstream's default when zero.
	MaxAttempts int
	// NotBefore delays the first attempt until then; zero means now.
	NotBefore time.Time
	// TTL gives the job up (dead) if it has not been dispatched this long
	// after it was enqueued; zero means never.
	TTL time.Duration
	// Partition is what the job is paced by within its upstream besides
	// the upstream's own limits, e.g. the recipient domain of an email or
	// a customer id: up to 200 bytes of UTF-8 text without control
	// characters, compared byte for byte. Where the upstream sets
	// partition limits, each partition gets its own; elsewhere it only
	// labels the job. Empty means none.
	Partition string
	// CallbackURL, when set, is POSTed the job's final view once it
	// succeeds, dies or is cancelled, signed per Standard Webhooks; its
	// host must be in the server's callbacks.allowed_hosts.
	CallbackURL string
}

// jobRequestJSON is JobRequest as it travels.
type jobRequestJSON struct {
	Upstream       string            `json:"upstream"`
	Method         string            `json:"method,omitempty"`
	Path           string            `json:"path,omitempty"`
	Headers        map[string]string `json:"headers,omitempty"`
	Body           string            `json:"body,omitempty"`
	BodyBase64     string            `json:"body_base64,omitempty"`
	Task           string            `json:"task,omitempty"`
	Cost           map[string]int64  `json:"cost,omitempty"`
	Lane           string            `json:"lane,omitempty"`
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	MaxAttempts    int               `json:"max_attempts,omitempty"`
	NotBefore      string            `json:"not_before,omitempty"`
	TTL            string            `json:"ttl,omitempty"`
	Partition      string            `json:"partition,omitempty"`
	CallbackURL    string            `json:"callback_url,omitempty"`
}

// MarshalJSON encodes r as the body of POST /v1/jobs.
func (r JobRequest) MarshalJSON() ([]byte, error) {
	w := jobRequestJSON{
		Upstream: r.Upstream, Method: r.Method, Path: r.Path, Headers: r.Headers,
		Task: r.Task, Cost: r.Cost, Lane: r.Lane, IdempotencyKey: r.IdempotencyKey,
		MaxAttempts: r.MaxAttempts, Partition: r.Partition, CallbackURL: r.CallbackURL,
	}
	w.Body, w.BodyBase64 = encodeBody(r.Body)
	if !r.NotBefore.IsZero() {
		w.NotBefore = r.NotBefore.Format(time.RFC3339Nano)
	}
	if r.TTL != 0 {
		w.TTL = r.TTL.String()
	}
	return json.Marshal(w)
}

// UnmarshalJSON reads the body of POST /v1/jobs, so a job described in a
// file decodes the way the server would read it.
func (r *JobRequest) UnmarshalJSON(data []byte) error {
	var w jobRequestJSON
	if err := json.Unmarshal(data, &w); err != nil {
		return err
	}
	body, err := decodeBody(w.Body, w.BodyBase64)
	if err != nil {
		return err
	}
	out := JobRequest{
		Upstream: w.Upstream, Method: w.Method, Path: w.Path, Headers: w.Headers,
		Body: body, Task: w.Task, Cost: w.Cost, Lane: w.Lane,
		IdempotencyKey: w.IdempotencyKey, MaxAttempts: w.MaxAttempts, Partition: w.Partition,
		CallbackURL: w.CallbackURL,
	}
	if w.NotBefore != "" {
		if out.NotBefore, err = time.Parse(time.RFC3339, w.NotBefore); err != nil {
			return fmt.Errorf("not_before: %w", err)
		}
	}
	if w.TTL != "" {
		if out.TTL, err = time.ParseDuration(w.TTL); err != nil {
			return fmt.Errorf("ttl: %w", err)
		}
	}
	*r = out
	return nil
}

// encodeBody splits a body into the JSON text or base64 form. JSON strings
// carry only valid UTF-8 (encoding/json would replace the rest), hence the
// second form.
func encodeBody(b []byte) (text, b64 string) {
	if len(b) == 0 {
		return "", ""
	}
	if utf8.Valid(b) {
		return string(b), ""
	}
	return "", base64.StdEncoding.EncodeToString(b)
}

func decodeBody(text, b64 string) ([]byte, error) {
	if b64 != "" {
		b, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			return nil, fmt.Errorf("body_base64: %w", err)
		}
		return b, nil
	}
	if text != "" {
		return []byte(text), nil
	}
	return nil, nil
}

// Job is a job as the server reports it. Enqueue's 202 answer carries only
// the identity fields (ID, State, Upstream, Lane, Partition,
// IdempotencyKey, CreatedAt); Get fills in the rest. Times the job does not have yet are
// zero.
type Job struct {
	ID       string `json:"id"`
	Tenant   string `json:"tenant,omitempty"`
	Upstream string `json:"upstream"`
	Lane     string `json:"lane,omitempty"`
	// Partition is the job's partition, empty if it has none.
	Partition string `json:"partition,omitempty"`
	State     State  `json:"state"`
	// WaitingFor, for a scheduled job held back, says by what: "pause",
	// "pushback" or "limit" (its partition's); empty otherwise.
	WaitingFor string `json:"waiting_for,omitempty"`
	// Attempts counts the calls made to the upstream so far.
	Attempts    int `json:"attempts,omitempty"`
	MaxAttempts int `json:"max_attempts,omitempty"`
	// LastError is why the last attempt failed, if it did.
	LastError      string           `json:"last_error,omitempty"`
	IdempotencyKey string           `json:"idempotency_key,omitempty"`
	Method         string           `json:"method,omitempty"`
	Path           string           `json:"path,omitempty"`
	Task           string           `json:"task,omitempty"`
	Cost           map[string]int64 `json:"cost,omitempty"`

	CreatedAt     time.Time `json:"created_at,omitzero"`
	NotBefore     time.Time `json:"not_before,omitzero"`
	ExpiresAt     time.Time `json:"expires_at,omitzero"`
	NextAttemptAt time.Time `json:"next_attempt_at,omitzero"`
	LastFailedAt  time.Time `json:"last_failed_at,omitzero"`
	CompletedAt   time.Time `json:"completed_at,omitzero"`

	// RetriedAt is when the job was last sent back to the queue by
	// RetryJob or RetryDead, Retries how often that happened, and
	// PreviousError the error it had died with then (a retry resets
	// Attempts and LastError).
	RetriedAt     time.Time `json:"retried_at,omitzero"`
	Retries       int       `json:"retries,omitempty"`
	PreviousError string    `json:"previous_error,omitempty"`

	// Response is what the upstream answered the last attempt; nil until
	// there is an answer.
	Response *Response `json:"response,omitempty"`

	// CallbackURL is where the job's final view is POSTed; Callback how
	// that delivery stands once the job is final (nil before).
	CallbackURL string    `json:"callback_url,omitempty"`
	Callback    *Callback `json:"callback,omitempty"`

	// Existing reports that the enqueue found a job already made under
	// the same idempotency key (the server answered 200, not 202), and
	// this is that job. A retry that finds its own first attempt's job
	// reports it too.
	Existing bool `json:"-"`
}

// Callback is the delivery of a final job's callback_url: State is
// "pending" (being delivered or waiting to retry), "delivered" or "failed"
// (its retries ran out; RetryCallback delivers it again).
type Callback struct {
	State     string `json:"state"`
	Attempts  int    `json:"attempts"`
	LastError string `json:"last_error,omitempty"`
}

// Done reports whether the job is in a final state: succeeded, dead or
// cancelled.
func (j *Job) Done() bool { return j.State.Final() }

// Response is an upstream's answer as the server stored it.
type Response struct {
	Status  int
	Headers http.Header
	// Body is the answer's body, as bytes whichever way it travelled.
	Body []byte
	// Truncated reports that the server kept only the start of the body.
	Truncated bool
}

type responseJSON struct {
	Status     int                 `json:"status"`
	Headers    map[string][]string `json:"headers,omitempty"`
	Body       string              `json:"body,omitempty"`
	BodyBase64 string              `json:"body_base64,omitempty"`
	Truncated  bool                `json:"truncated,omitempty"`
}

// MarshalJSON encodes r as the server does, with the body as text when it
// is valid UTF-8 and as body_base64 otherwise.
func (r Response) MarshalJSON() ([]byte, error) {
	w := responseJSON{Status: r.Status, Headers: r.Headers, Truncated: r.Truncated}
	w.Body, w.BodyBase64 = encodeBody(r.Body)
	return json.Marshal(w)
}

// UnmarshalJSON decodes the body from whichever of body and body_base64
// the server sent.
func (r *Response) UnmarshalJSON(data []byte) error {
	var w responseJSON
	if err := json.Unmarshal(data, &w); err != nil {
		return err
	}
	body, err := decodeBody(w.Body, w.BodyBase64)
	if err != nil {
		return err
	}
	*r = Response{Status: w.Status, Headers: http.Header(w.Headers), Body: body, Truncated: w.Truncated}
	return nil
}

// Enqueue hands one job to the server. The job is accepted (Job.State
// queued or scheduled) when err is nil; it then runs until it succeeds,
// dies or is cancelled. Use Wait to see how it ended.
func (c *Client) Enqueue(ctx context.Context, req JobRequest) (*Job, error) {
	if req.IdempotencyKey == "" && c.maxRetries > 0 {
		req.IdempotencyKey = newIdempotencyKey()
	}
	var job Job
	status, err := c.do(ctx, http.MethodPost, "/v1/jobs", req, &job)
	if err != nil {
		return nil, fmt.Errorf("enqueue to %s: %w", req.Upstream, err)
	}
	job.Existing = status == http.StatusOK
	return &job, nil
}

// BatchResult is the outcome of one job of a batch.
type BatchResult struct {
	// Index is the job's position in the batch.
	Index int
	// Status is the job's own HTTP status: 202 accepted, 200 existing (a
	// repeated idempotency key), or the status of its error.
	Status int
	// Job is the accepted job; nil when Err is set.
	Job *Job
	// Err is why the job was refused, an *Error that matches the sentinels
	// as a whole request's would.
	Err error
}

type batchItemJSON struct {
	Index  int             `json:"index"`
	Status int             `json:"status"`
	Job    *Job            `json:"job"`
	Error  json.RawMessage `json:"error"`
}

// EnqueueBatch hands several jobs to the server in one request. Admission
// charges one token per job and refuses the whole batch at once (an error
// matching ErrRateLimited); otherwise each job succeeds or fails on its
// own, and the results, one per job in the order of reqs, say which. The
// error is only for failures of the batch as a whole. With WithRetry, only
// whole-batch refusals are retried, never single jobs.
func (c *Client) EnqueueBatch(ctx context.Context, reqs []JobRequest) ([]BatchResult, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	if c.maxRetries > 0 {
		withKeys := make([]JobRequest, len(reqs))
		for i, r := range reqs {
			if r.IdempotencyKey == "" {
				r.IdempotencyKey = newIdempotencyKey()
			}
			withKeys[i] = r
		}
		reqs = withKeys
	}
	in := struct {
		Jobs []JobRequest `json:"jobs"`
	}{reqs}
	var out struct {
		Results []batchItemJSON `json:"results"`
	}
	if _, err := c.do(ctx, http.MethodPost, "/v1/jobs/batch", in, &out); err != nil {
		return nil, fmt.Errorf("enqueue batch of %d: %w", len(reqs), err)
	}
	results := make([]BatchResult, len(reqs))
	seen := make([]bool, len(reqs))
	for _, item := range out.Results {
		if item.Index < 0 || item.Index >= len(reqs) || seen[item.Index] {
			return nil, fmt.Errorf("enqueue batch of %d: server answered for job index %d", len(reqs), item.Index)
		}
		seen[item.Index] = true
		results[item.Index] = batchResult(item)
	}
	for i, ok := range seen {
		if !ok {
			return nil, fmt.Errorf("enqueue batch of %d: server gave no result for job index %d", len(reqs), i)
		}
	}
	return results, nil
}

func batchResult(item batchItemJSON) BatchResult {
	res := BatchResult{Index: item.Index, Status: item.Status}
	success := item.Status >= 200 && item.Status <= 299
	if success && item.Job != nil {
		item.Job.Existing = item.Status == http.StatusOK
		res.Job = item.Job
		return res
	}
	e := &Error{StatusCode: item.Status}
	var p problem
	if len(item.Error) > 0 && json.Unmarshal(item.Error, &p) == nil {
		e.fromProblem(p)
	}
	if e.Title == "" {
		e.Title = http.StatusText(e.StatusCode)
	}
	if success {
		// A 2xx without a job breaks the contract; say so rather than
		// hand back a nil job with a nil error.
		e.Detail = "server reported success but returned no job"
	}
	res.Status = e.StatusCode
	res.Err = e
	return res
}

// Get reads a job's current state. A key sees only its own tenant's jobs;
// any other ID is ErrNotFound.
func (c *Client) Get(ctx context.Context, id string) (*Job, error) {
	if id == "" {
		return nil, errors.New("get job: empty id")
	}
	var job Job
	if _, err := c.do(ctx, http.MethodGet, "/v1/jobs/"+pathSegment(id), nil, &job); err != nil {
		return nil, fmt.Errorf("get job %s: %w", id, err)
	}
	return &job, nil
}

// Cancel stops a job that has not been dispatched and returns it, now
// cancelled. A job being dispatched or already finished (cancelled
// included: a second Cancel) cannot be cancelled: that is ErrConflict.
func (c *Client) Cancel(ctx context.Context, id string) (*Job, error) {
	if id == "" {
		return nil, errors.New("cancel job: empty id")
	}
	var job Job
	if _, err := c.do(ctx, http.MethodDelete, "/v1/jobs/"+pathSegment(id), nil, &job); err != nil {
		return nil, fmt.Errorf("cancel job %s: %w", id, err)
	}
	return &job, nil
}

// DefaultWaitWindow is how long each long poll of Wait asks the server to
// hold its answer, when the HTTP client's timeout leaves room for it.
const DefaultWaitWindow = 20 * time.Second

// maxWaitWindow is the server's bound on one long poll.
const maxWaitWindow = 60 * time.Second

// WaitOption tunes one Wait.
type WaitOption func(*waitConfig)

type waitConfig struct {
	window   time.Duration
	progress func(*Job)
}

// WithWaitWindow makes each long poll of Wait ask for up to d (default
// DefaultWaitWindow, at most a minute, the server's bound). Wait shortens
// it to fit ctx's deadline and the HTTP client's timeout. Values that are
// not positive keep the default.
func WithWaitWindow(d time.Duration) WaitOption {
	return func(w *waitConfig) {
		if d > 0 {
			w.window = min(d, maxWaitWindow)
		}
	}
}

// WithProgress calls fn with the job as it is each time a long poll of Wait
// ends with the job not final yet.
func WithProgress(fn func(*Job)) WaitOption {
	return func(w *waitConfig) { w.progress = fn }
}

// Wait returns a job once it reaches a final state (succeeded, dead or
// cancelled); check Job.State for which. It does not poll: each request
// is a long poll (GET /v1/jobs/{id}?wait=) that the server answers within
// milliseconds of the job finishing, or when its window ends, so a job
// that takes a minute costs a few requests. ctx bounds the whole wait. On
// any error, including ctx ending first, Wait returns the job as last seen
// (nil if never) with the error, which matches ctx's error when that is
// the cause.
func (c *Client) Wait(ctx context.Context, id string, opts ...WaitOption) (*Job, error) {
	if id == "" {
		return nil, errors.New("wait: empty id")
	}
	cfg := waitConfig{window: DefaultWaitWindow}
	for _, opt := range opts {
		opt(&cfg)
	}
	if t := c.hc.Timeout; t > 0 {
		// Room for the answer to come back before the client gives up.
		cfg.window = max(min(cfg.window, t-max(t/5, time.Second)), time.Second)
	}
	var last *Job
	for early := 0; ; {
		window := cfg.window
		if dl, ok := ctx.Deadline(); ok {
			window = max(min(window, dl.Sub(c.now())), time.Millisecond)
		}
		asked := c.now()
		job, err := c.GetWait(ctx, id, window)
		if err != nil {
			if last != nil && ctx.Err() != nil {
				return last, fmt.Errorf("wait for job %s (%s): %w", id, last.State, err)
			}
			return last, fmt.Errorf("wait: %w", err)
		}
		if job.Done() {
			return job, nil
		}
		last = job
		if cfg.progress != nil {
			cfg.progress(job)
		}
		// A window the server cut short (it shuts down, or predates long
		// polls and answers at once) must not become a busy loop: back
		// off, doubling from a quarter second to the window.
		if c.now().Sub(asked) >= window/2 {
			early = 0
			continue
		}
		pause := min(250*time.Millisecond<<min(early, 10), cfg.window)
		early++
		if err := c.sleep(ctx, pause); err != nil {
			return last, fmt.Errorf("wait for job %s (%s): %w", id, last.State, err)
		}
	}
}

// GetWait is one long poll: it reads a job as Get does, but the server
// holds its answer until the job is final or d (at most a minute) has
// passed, and answers the job as it is then.
func (c *Client) GetWait(ctx context.Context, id string, d time.Duration) (*Job, error) {
	if id == "" {
		return nil, errors.New("get job: empty id")
	}
	d = min(max(d, 0), maxWaitWindow)
	var job Job
	path := "/v1/jobs/" + pathSegment(id) + "?wait=" + strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	if _, err := c.do(ctx, http.MethodGet, path, nil, &job); err != nil {
		return nil, fmt.Errorf("get job %s: %w", id, err)
	}
	return &job, nil
}
