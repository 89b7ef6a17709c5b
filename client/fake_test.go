package client_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// fake is a shaper API server kept in memory, written from the wire
// contract alone (it shares no types with the client), so the tests check
// the client against the contract rather than against itself. Workers are
// simulated: a job moves along its script of states each time it is read.
type fake struct {
	srv *httptest.Server

	mu        sync.Mutex
	keys      map[string]fakeKey
	upstreams map[string]*fakeUpstream
	jobs      map[string]*fakeJob
	idem      map[string]string // tenant \x00 idempotency key -> job id
	seq       int
	requests  []fakeRequest
	canned    []canned
	// states, when set, is what every new job goes through, one step per
	// GET; the last one sticks.
	states []string
	// tokens is each key's admission allowance; a key absent from it is
	// unlimited.
	tokens map[string]int
	// storeDown makes every enqueue fail as the real server does when it
	// cannot reach Redis.
	storeDown bool
	// ignoreWait makes GET answer at once whatever its wait, as a server
	// without long polls would.
	ignoreWait bool
	// passed is how far the fake's clock (now) is ahead of the real one:
	// a long poll that ends with its job not final lets its whole wait
	// pass there, so a client on that clock sees the window it asked for.
	passed time.Duration
}

// now is the fake's clock.
func (f *fake) now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return time.Now().Add(f.passed)
}

type fakeKey struct {
	tenant string
	admin  bool
}

type fakeUpstream struct {
	lanes      []string
	maxPending int
	pausedTo   time.Time
	reason     string
	// limits an operator set (PUT .../limits), as the request gave them;
	// partitions, by partition.
	limits     []map[string]any
	partitions map[string][]map[string]any
}

type fakeJob struct {
	wire   map[string]any // as GET answers it
	tenant string
	body   []byte
	states []string
}

// fakeRequest is one request as the fake received it.
type fakeRequest struct {
	Method string
	Path   string // escaped, as sent
	Query  string // raw, as sent
	Header http.Header
	Body   []byte
}

// canned is an answer the fake gives instead of serving the next request.
type canned struct {
	status int
	header http.Header
	body   string
}

// The fake's API keys.
const (
	producerKey = "sk_producer"
	adminKey    = "sk_admin"
	otherKey    = "sk_other_tenant"
)

func newFake() *fake {
	f := &fake{
		keys: map[string]fakeKey{
			producerKey: {tenant: "billing"},
			adminKey:    {tenant: "ops", admin: true},
			otherKey:    {tenant: "marketing"},
		},
		upstreams: map[string]*fakeUpstream{
			"stripe": {lanes: []string{"default", "bulk"}, maxPending: 1000},
			"openai": {lanes: []string{"default"}, maxPending: 1000},
		},
		jobs:   map[string]*fakeJob{},
		idem:   map[string]string{},
		tokens: map[string]int{},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/jobs", f.enqueue)
	mux.HandleFunc("POST /v1/jobs/batch", f.batch)
	mux.HandleFunc("GET /v1/jobs/{id}", f.get)
	mux.HandleFunc("DELETE /v1/jobs/{id}", f.cancel)
	mux.HandleFunc("GET /v1/jobs", f.list)
	mux.HandleFunc("POST /v1/jobs/{id}/retry", f.retry)
	mux.HandleFunc("POST /v1/upstreams/{name}/retry-dead", f.retryDead)
	mux.HandleFunc("GET /v1/upstreams", f.listUpstreams)
	mux.HandleFunc("GET /v1/upstreams/{name}", f.getUpstream)
	mux.HandleFunc("POST /v1/upstreams/{name}/pause", f.pause)
	mux.HandleFunc("POST /v1/upstreams/{name}/resume", f.resume)
	mux.HandleFunc("PUT /v1/upstreams/{name}/limits", f.putLimits)
	mux.HandleFunc("DELETE /v1/upstreams/{name}/limits", f.resetLimits)
	mux.HandleFunc("PUT /v1/upstreams/{name}/partitions/{partition}/limits", f.putPartitionLimits)
	mux.HandleFunc("DELETE /v1/upstreams/{name}/partitions/{partition}/limits", f.resetPartitionLimits)
	f.srv = httptest.NewServer(f.front(mux))
	return f
}

func (f *fake) Close() { f.srv.Close() }

// URL is the fake's base URL.
func (f *fake) URL() string { return f.srv.URL }

// front records each request, gives canned answers, and authenticates.
func (f *fake) front(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		f.mu.Lock()
		f.requests = append(f.requests, fakeRequest{Method: r.Method, Path: r.URL.EscapedPath(), Query: r.URL.RawQuery, Header: r.Header.Clone(), Body: body})
		var c *canned
		if len(f.canned) > 0 {
			c = &f.canned[0]
			f.canned = f.canned[1:]
		}
		f.mu.Unlock()
		if c != nil {
			for k, v := range c.header {
				w.Header()[k] = v
			}
			w.WriteHeader(c.status)
			io.WriteString(w, c.body)
			return
		}
		key, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if key == "" {
			key = r.Header.Get("X-API-Key")
		}
		if _, ok := f.keys[key]; !ok {
			writeProblem(w, http.StatusUnauthorized, "Unauthorized", "missing or unknown API key", nil)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// answer queues canned answers for the next requests, in order.
func (f *fake) answer(cs ...canned) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.canned = append(f.canned, cs...)
}

// log is every request received so far.
func (f *fake) log() []fakeRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.requests)
}

func (f *fake) setTokens(key string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tokens[key] = n
}

func (f *fake) setStoreDown(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.storeDown = down
}

func (f *fake) setStates(states ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.states = states
}

// rateLimited is a 429 as the server's admission answers it.
func rateLimited(retryAfter int) canned {
	return canned{
		status: http.StatusTooManyRequests,
		header: http.Header{
			"Content-Type":          {"application/problem+json"},
			"Retry-After":           {strconv.Itoa(retryAfter)},
			"Ratelimit-Policy":      {`"enqueue";q=10;w=10`},
			"Ratelimit":             {fmt.Sprintf(`"enqueue";r=0;t=%d`, retryAfter+1)},
			"X-Ratelimit-Limit":     {"10"},
			"X-Ratelimit-Remaining": {"0"},
			"X-Ratelimit-Reset":     {strconv.Itoa(retryAfter + 1)},
		},
		body: fmt.Sprintf(`{"type":"https://shaperhq.github.io/problems/rate-limited","title":"Rate limit exceeded","status":429,"detail":"Rate limit \"enqueue\" exceeded; retry in %d seconds.","retry_after":%d}`, retryAfter, retryAfter),
	}
}

// backlogFull is a 503 for an upstream at max_pending.
func backlogFull(retryAfter int) canned {
	return canned{
		status: http.StatusServiceUnavailable,
		header: http.Header{"Content-Type": {"application/problem+json"}, "Retry-After": {strconv.Itoa(retryAfter)}},
		body:   fmt.Sprintf(`{"type":"https://shaperhq.github.io/problems/backlog-full","title":"Backlog full","status":503,"detail":"upstream stripe has 1000 jobs pending","retry_after":%d}`, retryAfter),
	}
}

type problemField struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

type problemDoc struct {
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Status     int            `json:"status"`
	Detail     string         `json:"detail,omitempty"`
	Errors     []problemField `json:"errors,omitempty"`
	RetryAfter int            `json:"retry_after,omitempty"`
}

func newProblem(status int, title, detail string, fields []problemField) problemDoc {
	return problemDoc{
		Type:   "https://shaperhq.github.io/problems/" + strings.ReplaceAll(strings.ToLower(title), " ", "-"),
		Title:  title,
		Status: status,
		Detail: detail,
		Errors: fields,
	}
}

func writeProblem(w http.ResponseWriter, status int, title, detail string, fields []problemField) {
	writeProblemDoc(w, newProblem(status, title, detail, fields))
}

func writeProblemDoc(w http.ResponseWriter, p problemDoc) {
	if p.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(p.RetryAfter))
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(p.Status)
	json.NewEncoder(w).Encode(p)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func (f *fake) key(r *http.Request) fakeKey {
	key, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if key == "" {
		key = r.Header.Get("X-API-Key")
	}
	return f.keys[key]
}

func rawKey(r *http.Request) string {
	key, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return key
}

// admit charges n tokens to the request's key, or answers 429.
func (f *fake) admit(w http.ResponseWriter, r *http.Request, n int) bool {
	key := rawKey(r)
	left, limited := f.tokens[key]
	if !limited {
		return true
	}
	if left < n {
		c := rateLimited(1)
		for k, v := range c.header {
			w.Header()[k] = v
		}
		w.WriteHeader(c.status)
		io.WriteString(w, c.body)
		return false
	}
	f.tokens[key] = left - n
	return true
}

// readJSON decodes a request body strictly, as the server does: JSON
// only, known fields only, within the size limit.
func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		writeProblem(w, http.StatusUnsupportedMediaType, "Unsupported media type", "Content-Type must be application/json, not "+strconv.Quote(ct), nil)
		return false
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeProblem(w, http.StatusRequestEntityTooLarge, "Request too large", "body is over 1048576 bytes", nil)
			return false
		}
		writeProblem(w, http.StatusBadRequest, "Invalid request", "malformed JSON: "+err.Error(), nil)
		return false
	}
	return true
}

// wireJobRequest is the POST /v1/jobs body.
type wireJobRequest struct {
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
}

// create validates and stores one job for tenant, with f.mu held. It
// returns the status and the job's wire form, or a problem.
func (f *fake) create(tenant string, req wireJobRequest) (int, map[string]any, *problemDoc) {
	invalid := func(field, msg string) (int, map[string]any, *problemDoc) {
		p := newProblem(http.StatusBadRequest, "Invalid request", "1 field is invalid", []problemField{{field, msg}})
		return p.Status, nil, &p
	}
	if req.Upstream == "" {
		return invalid("upstream", "is required")
	}
	up, ok := f.upstreams[req.Upstream]
	if !ok {
		p := newProblem(http.StatusNotFound, "Not found", fmt.Sprintf("unknown upstream %q", req.Upstream), nil)
		return p.Status, nil, &p
	}
	if req.Body != nil && req.BodyBase64 != nil {
		return invalid("body", "give body or body_base64, not both")
	}
	var body []byte
	switch {
	case req.Body != nil:
		body = []byte(*req.Body)
	case req.BodyBase64 != nil:
		b, err := base64.StdEncoding.DecodeString(*req.BodyBase64)
		if err != nil {
			return invalid("body_base64", "not base64")
		}
		body = b
	}
	if req.Path != "" && (!strings.HasPrefix(req.Path, "/") || strings.HasPrefix(req.Path, "//")) {
		return invalid("path", "must be relative to the upstream's base URL")
	}
	if len(req.Partition) > 200 {
		return invalid("partition", fmt.Sprintf("%d bytes, at most 200", len(req.Partition)))
	}
	if req.Lane == "" {
		req.Lane = up.lanes[0]
	}
	if !slices.Contains(up.lanes, req.Lane) {
		return invalid("lane", "unknown lane")
	}
	now := time.Now().UTC()
	var notBefore time.Time
	if req.NotBefore != "" {
		t, err := time.Parse(time.RFC3339, req.NotBefore)
		if err != nil {
			return invalid("not_before", "must be RFC 3339")
		}
		notBefore = t
	}
	var ttl time.Duration
	if req.TTL != "" {
		d, err := time.ParseDuration(req.TTL)
		if err != nil || d <= 0 {
			return invalid("ttl", "must be a positive duration like 1h")
		}
		ttl = d
	}
	if req.IdempotencyKey != "" {
		if id, ok := f.idem[tenant+"\x00"+req.IdempotencyKey]; ok {
			return http.StatusOK, f.jobs[id].wire, nil
		}
	}
	if f.storeDown {
		p := newProblem(http.StatusServiceUnavailable, "Store unavailable", "could not store the job: Redis does not answer", nil)
		p.RetryAfter = 1
		return p.Status, nil, &p
	}
	pending := 0
	for _, j := range f.jobs {
		if j.wire["upstream"] == req.Upstream && !isFinal(j.wire["state"].(string)) {
			pending++
		}
	}
	if pending >= up.maxPending {
		p := newProblem(http.StatusServiceUnavailable, "Backlog full", fmt.Sprintf("upstream %s has %d jobs pending", req.Upstream, pending), nil)
		p.RetryAfter = 7
		return p.Status, nil, &p
	}
	f.seq++
	id := fmt.Sprintf("%s.%s.j%d", req.Upstream, req.Lane, f.seq)
	if req.MaxAttempts == 0 {
		req.MaxAttempts = 3
	}
	if req.Method == "" && req.Task == "" {
		req.Method = "POST"
	}
	if req.IdempotencyKey == "" {
		req.IdempotencyKey = id
	} else {
		f.idem[tenant+"\x00"+req.IdempotencyKey] = id
	}
	state := "queued"
	wire := map[string]any{
		"id": id, "tenant": tenant, "upstream": req.Upstream, "lane": req.Lane,
		"attempts": 0, "max_attempts": req.MaxAttempts, "idempotency_key": req.IdempotencyKey,
		"created_at": now.Format(time.RFC3339Nano),
	}
	if !notBefore.IsZero() {
		wire["not_before"] = notBefore.UTC().Format(time.RFC3339Nano)
		if notBefore.After(now) {
			state = "scheduled"
			wire["next_attempt_at"] = wire["not_before"]
		}
	}
	wire["state"] = state
	if ttl > 0 {
		wire["expires_at"] = now.Add(ttl).Format(time.RFC3339Nano)
	}
	for k, v := range map[string]string{"method": req.Method, "path": req.Path, "task": req.Task, "partition": req.Partition} {
		if v != "" {
			wire[k] = v
		}
	}
	if len(req.Cost) > 0 {
		wire["cost"] = req.Cost
	}
	f.jobs[id] = &fakeJob{wire: wire, tenant: tenant, body: body, states: slices.Clone(f.states)}
	return http.StatusAccepted, wire, nil
}

// accepted is the short shape of a 202.
func accepted(wire map[string]any) map[string]any {
	out := map[string]any{}
	for _, k := range []string{"id", "state", "upstream", "lane", "idempotency_key", "created_at", "partition"} {
		if v, ok := wire[k]; ok {
			out[k] = v
		}
	}
	return out
}

func isFinal(state string) bool {
	return state == "succeeded" || state == "dead" || state == "cancelled"
}

func (f *fake) enqueue(w http.ResponseWriter, r *http.Request) {
	var req wireJobRequest
	if !readJSON(w, r, &req) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.admit(w, r, 1) {
		return
	}
	status, wire, p := f.create(f.key(r).tenant, req)
	switch {
	case p != nil:
		writeProblemDoc(w, *p)
	case status == http.StatusAccepted:
		w.Header().Set("Location", "/v1/jobs/"+wire["id"].(string))
		writeJSON(w, status, accepted(wire))
	default:
		writeJSON(w, status, wire)
	}
}

func (f *fake) batch(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Jobs []wireJobRequest `json:"jobs"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	if len(req.Jobs) == 0 {
		writeProblem(w, http.StatusBadRequest, "Invalid request", "no jobs", []problemField{{"jobs", "is empty"}})
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.admit(w, r, len(req.Jobs)) {
		return
	}
	results := []map[string]any{}
	for i, jr := range req.Jobs {
		status, wire, p := f.create(f.key(r).tenant, jr)
		item := map[string]any{"index": i, "status": status}
		switch {
		case p != nil:
			item["error"] = p
		case status == http.StatusAccepted:
			item["job"] = accepted(wire)
		default:
			item["job"] = wire
		}
		results = append(results, item)
	}
	writeJSON(w, http.StatusOK, map[string]any{"results": results})
}

// job finds a job of the request's tenant, with f.mu held.
func (f *fake) job(w http.ResponseWriter, r *http.Request) *fakeJob {
	j, ok := f.jobs[r.PathValue("id")]
	if !ok || j.tenant != f.key(r).tenant {
		writeProblem(w, http.StatusNotFound, "Not found", fmt.Sprintf("no job %q", r.PathValue("id")), nil)
		return nil
	}
	return j
}

// advance moves a job one step along its script, as workers would.
func (j *fakeJob) advance() {
	if len(j.states) == 0 || isFinal(j.wire["state"].(string)) {
		return
	}
	state := j.states[0]
	if len(j.states) > 1 {
		j.states = j.states[1:]
	}
	j.wire["state"] = state
	now := time.Now().UTC().Format(time.RFC3339Nano)
	switch state {
	case "active":
		j.wire["attempts"] = j.wire["attempts"].(int) + 1
	case "retrying":
		j.wire["last_error"] = "upstream answered 500"
		j.wire["last_failed_at"] = now
		j.wire["next_attempt_at"] = now
	case "succeeded":
		// The fake upstream echoes the job's body, so a test can follow
		// bytes there and back.
		resp := map[string]any{"status": 200, "headers": map[string][]string{"Content-Type": {"application/octet-stream"}, "X-Request-Id": {"req_1"}}}
		if utf8.Valid(j.body) {
			resp["body"] = string(j.body)
		} else {
			resp["body_base64"] = base64.StdEncoding.EncodeToString(j.body)
		}
		j.wire["response"] = resp
		j.wire["completed_at"] = now
		delete(j.wire, "next_attempt_at")
	case "dead":
		j.wire["last_error"] = "upstream answered 400"
		j.wire["last_failed_at"] = now
		j.wire["response"] = map[string]any{"status": 400, "body": `{"error":"bad card"}`, "truncated": true}
		delete(j.wire, "next_attempt_at")
	}
}

func (f *fake) get(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	j := f.job(w, r)
	if j == nil {
		return
	}
	// A long poll: one step of the job's script is what happens while it
	// waits; if that is not final, the wait runs out.
	var wait time.Duration
	if v := r.URL.Query().Get("wait"); v != "" && !f.ignoreWait {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > time.Minute {
			writeProblem(w, http.StatusBadRequest, "Invalid request", "wait "+v, []problemField{{Field: "wait", Message: "must be a duration up to 60s"}})
			return
		}
		wait = d
	}
	j.advance()
	if !isFinal(j.wire["state"].(string)) {
		f.passed += wait
	}
	writeJSON(w, http.StatusOK, j.wire)
}

func (f *fake) cancel(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	j := f.job(w, r)
	if j == nil {
		return
	}
	switch state := j.wire["state"].(string); state {
	case "queued", "scheduled", "retrying":
		j.wire["state"] = "cancelled"
		j.states = nil
		writeJSON(w, http.StatusOK, j.wire)
	default:
		writeProblem(w, http.StatusConflict, "Conflict", fmt.Sprintf("job %s is %s", j.wire["id"], state), nil)
	}
}

// status renders an upstream as GET /v1/upstreams/{name} does, with a
// field no client knows, to check it is ignored.
func (f *fake) status(name string) map[string]any {
	up := f.upstreams[name]
	lanes := map[string]any{}
	total := 0
	byPartition := map[string]int{}
	for _, j := range f.jobs {
		if p, _ := j.wire["partition"].(string); p != "" && j.wire["upstream"] == name && !isFinal(j.wire["state"].(string)) {
			byPartition[p]++
		}
	}
	top := []map[string]any{}
	for _, p := range slices.Sorted(maps.Keys(byPartition)) {
		top = append(top, map[string]any{"partition": p, "backlog": byPartition[p]})
	}
	// Most first; sorted by name before, so ties keep name order.
	slices.SortStableFunc(top, func(a, b map[string]any) int { return b["backlog"].(int) - a["backlog"].(int) })
	for _, l := range up.lanes {
		n := 0
		for _, j := range f.jobs {
			if j.wire["upstream"] == name && j.wire["lane"] == l && !isFinal(j.wire["state"].(string)) {
				n++
			}
		}
		total += n
		lanes[l] = map[string]any{"pending": n, "scheduled": 0, "retry": 0, "active": 0, "dead": 1, "succeeded": 40}
	}
	st := map[string]any{
		"name": name,
		"limits": []map[string]any{
			{"rate": 100, "per": "1s", "burst": 1, "description": "100 req/s", "sustained_per_second": 99.5,
				"adaptive": true, "effective_rate": 37.5, "source": "adaptive"},
			{"rate": 800000, "per": "1m0s", "cost": "tokens", "burst": 1, "description": "800000 tokens/min", "sustained_per_second": 13333.3,
				"adaptive": false, "effective_rate": 600000, "source": "stated"},
		},
		"stated_limits": []map[string]any{
			{"rate": 10000, "per": "1s", "cost": "tokens", "burst": 0, "description": "10000 tokens/s", "sustained_per_second": 9800,
				"adaptive": false, "effective_rate": 10000, "source": "stated"},
		},
		"concurrency":                    20,
		"drain_rate":                     map[string]any{"last_10s": 98.2, "last_60s": 97.9},
		"backlog":                        map[string]any{"total": total, "lanes": lanes},
		"in_flight":                      3,
		"retrying":                       2,
		"dead":                           len(up.lanes),
		"succeeded":                      40 * len(up.lanes),
		"paused_until":                   nil,
		"time_to_drain_seconds":          nil,
		"time_to_drain_at_limit_seconds": 0.5,
		"partitions":                     map[string]any{"with_backlog": len(byPartition), "top": top},
	}
	if total > 0 {
		st["time_to_drain_seconds"] = float64(total) / 98.2
	}
	if !up.pausedTo.IsZero() {
		st["paused_until"] = up.pausedTo.Format(time.RFC3339Nano)
		st["pause_reason"] = up.reason
	}
	if up.limits != nil {
		var shown []map[string]any
		for _, l := range up.limits {
			shown = append(shown, map[string]any{"rate": l["rate"], "per": l["per"], "burst": 0, "description": "set",
				"sustained_per_second": l["rate"], "adaptive": false, "effective_rate": l["rate"], "source": "operator"})
		}
		st["override"] = map[string]any{"since": "2026-12-02T01:00:00Z", "configured_limits": st["limits"]}
		st["limits"] = shown
	}
	return st
}

// readLimits reads a PUT .../limits body the way the server checks it, as
// far as the client's tests need: a list, each with a rate of at least 1.
func readLimits(w http.ResponseWriter, r *http.Request) ([]map[string]any, bool) {
	var req struct {
		Limits []map[string]any `json:"limits"`
	}
	if !readJSON(w, r, &req) {
		return nil, false
	}
	for i, l := range req.Limits {
		if rate, _ := l["rate"].(float64); rate < 1 {
			writeProblem(w, http.StatusBadRequest, "Invalid limits", "a rate below 1; nothing was changed",
				[]problemField{{fmt.Sprintf("limits[%d]", i), "rate must be at least 1"}})
			return nil, false
		}
	}
	if len(req.Limits) == 0 {
		writeProblem(w, http.StatusBadRequest, "Invalid limits", "no limits", []problemField{{"limits", "at least one limit is required"}})
		return nil, false
	}
	return req.Limits, true
}

func (f *fake) putLimits(w http.ResponseWriter, r *http.Request) {
	ls, ok := readLimits(w, r)
	if !ok {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	up := f.adminUpstream(w, r)
	if up == nil {
		return
	}
	up.limits = ls
	writeJSON(w, http.StatusOK, f.status(r.PathValue("name")))
}

func (f *fake) resetLimits(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	up := f.adminUpstream(w, r)
	if up == nil {
		return
	}
	up.limits = nil
	writeJSON(w, http.StatusOK, f.status(r.PathValue("name")))
}

func (f *fake) partitionLimits(up *fakeUpstream, name, partition string) map[string]any {
	out := map[string]any{"upstream": name, "partition": partition, "limits": []any{}}
	if ls, ok := up.partitions[partition]; ok {
		var shown []map[string]any
		for _, l := range ls {
			shown = append(shown, map[string]any{"rate": l["rate"], "per": l["per"], "burst": 0, "description": "set",
				"sustained_per_second": l["rate"], "adaptive": false, "effective_rate": l["rate"], "source": "operator"})
		}
		out["limits"], out["source"] = shown, "operator"
	}
	return out
}

func (f *fake) putPartitionLimits(w http.ResponseWriter, r *http.Request) {
	ls, ok := readLimits(w, r)
	if !ok {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	up := f.adminUpstream(w, r)
	if up == nil {
		return
	}
	if up.partitions == nil {
		up.partitions = map[string][]map[string]any{}
	}
	up.partitions[r.PathValue("partition")] = ls
	writeJSON(w, http.StatusOK, f.partitionLimits(up, r.PathValue("name"), r.PathValue("partition")))
}

func (f *fake) resetPartitionLimits(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	up := f.adminUpstream(w, r)
	if up == nil {
		return
	}
	delete(up.partitions, r.PathValue("partition"))
	writeJSON(w, http.StatusOK, f.partitionLimits(up, r.PathValue("name"), r.PathValue("partition")))
}

func (f *fake) listUpstreams(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	names := make([]string, 0, len(f.upstreams))
	for n := range f.upstreams {
		names = append(names, n)
	}
	sort.Strings(names)
	out := []map[string]any{}
	for _, n := range names {
		out = append(out, f.status(n))
	}
	writeJSON(w, http.StatusOK, map[string]any{"upstreams": out})
}

func (f *fake) getUpstream(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.upstreams[r.PathValue("name")]; !ok {
		writeProblem(w, http.StatusNotFound, "Not found", fmt.Sprintf("unknown upstream %q", r.PathValue("name")), nil)
		return
	}
	writeJSON(w, http.StatusOK, f.status(r.PathValue("name")))
}

// adminUpstream checks the key and the name for pause and resume.
func (f *fake) adminUpstream(w http.ResponseWriter, r *http.Request) *fakeUpstream {
	if !f.key(r).admin {
		writeProblem(w, http.StatusForbidden, "Forbidden", "pause and resume need an admin key", nil)
		return nil
	}
	up, ok := f.upstreams[r.PathValue("name")]
	if !ok {
		writeProblem(w, http.StatusNotFound, "Not found", fmt.Sprintf("unknown upstream %q", r.PathValue("name")), nil)
		return nil
	}
	return up
}

func (f *fake) pause(w http.ResponseWriter, r *http.Request) {
	var req struct {
		For string `json:"for"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	up := f.adminUpstream(w, r)
	if up == nil {
		return
	}
	d := 100 * 365 * 24 * time.Hour // until resumed
	if req.For != "" {
		var err error
		if d, err = time.ParseDuration(req.For); err != nil || d <= 0 {
			writeProblem(w, http.StatusBadRequest, "Invalid request", "for must be a positive duration", []problemField{{"for", "must be a positive duration like 30s"}})
			return
		}
	}
	up.pausedTo, up.reason = time.Now().Add(d).UTC(), "paused by operator"
	writeJSON(w, http.StatusOK, f.status(r.PathValue("name")))
}

func (f *fake) resume(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	up := f.adminUpstream(w, r)
	if up == nil {
		return
	}
	up.pausedTo, up.reason = time.Time{}, ""
	writeJSON(w, http.StatusOK, f.status(r.PathValue("name")))
}

func (f *fake) setMaxPending(upstream string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.upstreams[upstream].maxPending = n
}

// jobCount is how many jobs the fake holds.
func (f *fake) jobCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.jobs)
}

// seqOf is the number at the end of a fake job's ID ("stripe.default.j7").
func seqOf(id string) int {
	n, _ := strconv.Atoi(id[strings.LastIndex(id, ".j")+2:])
	return n
}

// list answers GET /v1/jobs: the tenant's jobs of an upstream, newest
// first; its cursor is the number of the last job of the page.
func (f *fake) list(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	q := r.URL.Query()
	name := q.Get("upstream") // "" for every upstream
	if _, ok := f.upstreams[name]; !ok && name != "" {
		writeProblem(w, http.StatusNotFound, "Unknown upstream", fmt.Sprintf("no upstream %q", name), nil)
		return
	}
	limit := 50
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 200 {
			writeProblem(w, http.StatusBadRequest, "Invalid request", "limit must be 1 to 200", []problemField{{"limit", "must be 1 to 200"}})
			return
		}
		limit = n
	}
	after := 1 << 30
	if c := q.Get("cursor"); c != "" {
		n, err := strconv.Atoi(c)
		if err != nil {
			writeProblem(w, http.StatusBadRequest, "Invalid request", "bad cursor", []problemField{{"cursor", "bad"}})
			return
		}
		after = n
	}
	tenant := f.key(r).tenant
	var found []*fakeJob
	for id, j := range f.jobs {
		if j.tenant != tenant || name != "" && j.wire["upstream"] != name || seqOf(id) >= after ||
			q.Get("state") != "" && j.wire["state"] != q.Get("state") ||
			q.Get("lane") != "" && j.wire["lane"] != q.Get("lane") ||
			q.Get("partition") != "" && j.wire["partition"] != q.Get("partition") {
			continue
		}
		found = append(found, j)
	}
	sort.Slice(found, func(a, b int) bool { return seqOf(found[a].wire["id"].(string)) > seqOf(found[b].wire["id"].(string)) })
	page := map[string]any{"jobs": []any{}, "next_cursor": ""}
	if len(found) > limit {
		found = found[:limit]
		page["next_cursor"] = strconv.Itoa(seqOf(found[limit-1].wire["id"].(string)))
	}
	jobs := []any{}
	for _, j := range found {
		jobs = append(jobs, j.wire)
	}
	page["jobs"] = jobs
	writeJSON(w, http.StatusOK, page)
}

// revive queues a dead or cancelled job again with fresh attempts.
func revive(j *fakeJob) bool {
	switch j.wire["state"] {
	case "dead", "cancelled":
	default:
		return false
	}
	if e, ok := j.wire["last_error"]; ok {
		j.wire["previous_error"] = e
	}
	delete(j.wire, "last_error")
	delete(j.wire, "last_failed_at")
	retries, _ := j.wire["retries"].(int)
	j.wire["retries"] = retries + 1
	j.wire["retried_at"] = time.Now().UTC().Format(time.RFC3339Nano)
	j.wire["attempts"] = 0
	j.wire["state"] = "queued"
	j.states = nil
	return true
}

func (f *fake) retry(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	j := f.job(w, r)
	if j == nil {
		return
	}
	if !revive(j) {
		writeProblem(w, http.StatusConflict, "Job cannot be retried", fmt.Sprintf("job %s is %s", j.wire["id"], j.wire["state"]), nil)
		return
	}
	writeJSON(w, http.StatusOK, j.wire)
}

func (f *fake) retryDead(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.adminUpstream(w, r) == nil {
		return
	}
	name := r.PathValue("name")
	n := 0
	for _, j := range f.jobs {
		if j.wire["upstream"] == name && j.wire["state"] == "dead" && revive(j) {
			n++
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"upstream": name, "retried": n, "skipped": 0})
}
