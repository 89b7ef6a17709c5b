// Package fakeupstream is a fake rate-limited third-party API for shaper's
// demos, tests and benchmarks: an http.Handler that plays the upstream
// (Stripe, OpenAI, one that speaks the IETF RateLimit draft, a plain API or
// one that hides its limit), enforces a limit per API key the way such an
// upstream does, answers in that upstream's style, and records the arrival
// of every request so a test can check afterwards whether the client kept
// to the limit: how many requests it sent in any window, how evenly spaced
// they were, whether an idempotency key was ever repeated.
//
// The Style decides what the answers say about the limits: StylePlain a
// Retry-After on 429; StyleStripe Stripe's reason header and error;
// StyleOpenAI x-ratelimit-* on every answer and usage.total_tokens in
// successes; StyleIETF the draft-10 RateLimit-Policy and RateLimit fields
// on every answer; StyleBare nothing at all. A request that sends
// UsageHeader (X-Fake-Usage: N) is charged N by the cost limit instead of
// its declared cost, as an upstream that bills real use would.
//
// It is one process with its state in memory, which is exactly what an
// upstream looks like from the outside. `shaper dev` serves it in-process as
// the upstream named demo; examples/thirdparty/cmd/thirdparty runs it on its
// own.
//
// Most callers build a Server with New, serve it (httptest.NewServer or an
// http.Server), send traffic, then read Report. Paths under /_thirdparty/
// are the server's own: GET /_thirdparty/report and POST /_thirdparty/reset.
package fakeupstream

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ControlPrefix starts the paths the server answers itself; requests under
// it are neither limited nor recorded.
const ControlPrefix = "/_thirdparty/"

// StatusClientClosed is recorded for an admitted request whose client went
// away during the simulated latency (nginx's convention; never sent).
const StatusClientClosed = 499

// minSweep is how many keys the limiters may hold before idle ones are
// swept; the threshold then doubles with what is left, so sweeping costs
// O(1) per request amortised.
const minSweep = 4096

// Server is the fake upstream. It serves any method and path. Build it with
// New; it is safe for concurrent use and starts no goroutines.
type Server struct {
	cfg   Config
	start time.Time
	// sleep waits out simulated latency; tests replace it to hold requests
	// in flight without depending on timing.
	sleep func(ctx context.Context, d time.Duration) error

	mu       sync.Mutex
	request  limiter // per API key; nil without a request limit
	endpoint limiter // per API key and endpoint; nil without one
	cost     limiter // per API key; nil without a cost limit
	sweepAt  int
	fails    *rand.Rand
	jitter   *rand.Rand
	inFlight map[string]int // admitted and not yet answered, per API key
	flying   int            // sum of inFlight
	ids      uint64         // request ids handed out, never reset

	// What Reset clears.
	gen         uint64 // incremented by Reset, so stale answers are not counted
	since       time.Time
	records     []Record // ring of the last MaxRecords arrivals, by Seq
	arrivals    uint64   // arrivals since reset: the next Seq
	byStatus    map[int]int64
	rejectedBy  map[string]int64 // 429s by rejectionName
	maxInFlight int
}

// Record is one request's arrival as the upstream saw it.
type Record struct {
	// Seq numbers arrivals from 0 since the last reset, in the order they
	// took the server's lock.
	Seq uint64
	// At is the arrival time, read first thing in the handler, as the time
	// since the server started (monotonic).
	At             time.Duration
	Method, Path   string
	Key            string // API key; "" when none was sent
	IdempotencyKey string
	// Cost is what the request declared it might use of the cost limit's
	// unit: the estimate a client reserves before it knows.
	Cost int64
	// Usage is what the request really used: the UsageHeader's value when
	// sent, else Cost. The cost limit charges Usage, not Cost.
	Usage int64
	// Admitted reports that the limits let the request through.
	Admitted bool
	// Status is the answer's status code: 0 while in flight,
	// StatusClientClosed when the client left first.
	Status int
}

// New checks cfg and builds a server. Errors name the field at fault.
func New(cfg Config) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("fakeupstream config: %w", err)
	}
	s := &Server{cfg: cfg, start: cfg.Now(), sleep: sleepCtx, inFlight: map[string]int{}}
	s.clear()
	return s, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// clear resets everything Reset resets. Callers hold mu (or own s).
func (s *Server) clear() {
	c := s.cfg
	s.request, s.endpoint, s.cost = nil, nil, nil
	if c.Rate > 0 {
		s.request = newLimiter(c.Algorithm, c.requestLimit(), s.start)
	}
	if c.EndpointLimit != nil {
		s.endpoint = newLimiter(c.Algorithm, *c.EndpointLimit, s.start)
	}
	if c.CostLimit != nil {
		s.cost = newLimiter(c.Algorithm, c.CostLimit.limit(), s.start)
	}
	s.sweepAt = minSweep
	// Two streams, so that turning jitter on does not change which requests
	// fail.
	s.fails = rand.New(rand.NewPCG(c.Seed, 0x6661696c))
	s.jitter = rand.New(rand.NewPCG(c.Seed, 0x6a697474))
	s.gen++
	s.since = c.Now()
	s.records = nil
	s.arrivals = 0
	s.byStatus = map[int]int64{}
	s.rejectedBy = map[string]int64{}
	s.maxInFlight = s.flying
}

// Reset forgets every record, count and limiter state, as if the server had
// just started; requests in flight finish but are not counted.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clear()
}

// Started is when the server started: Record.At counts from it.
func (s *Server) Started() time.Time { return s.start }

// Config is the configuration in effect, with defaults filled in.
func (s *Server) Config() Config { return s.cfg }

// Records is a copy of the retained records, oldest first.
func (s *Server) Records() []Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.recordsLocked()
}

func (s *Server) recordsLocked() []Record {
	out := make([]Record, 0, len(s.records))
	if len(s.records) < s.cfg.MaxRecords {
		return append(out, s.records...)
	}
	i := int(s.arrivals % uint64(s.cfg.MaxRecords))
	out = append(out, s.records[i:]...)
	return append(out, s.records[:i]...)
}

// reason is why a request was not admitted.
type reason int

const (
	admitted reason = iota
	badRequest
	overConcurrency
	overRate     // the per-key request limit
	overEndpoint // the per-key-and-endpoint request limit
	overCost     // the cost limit
)

// rejectionName is the Report.RejectedBy key of a refusal.
func (d decision) rejectionName() string {
	switch {
	case d.tooLarge:
		return "too_large"
	case d.reason == overEndpoint:
		return "endpoint"
	case d.reason == overCost:
		return "cost"
	case d.reason == overConcurrency:
		return "concurrency"
	}
	return "requests"
}

// decision is what the server decided for one request, with what the
// answer needs to describe the limits.
type decision struct {
	id       string
	seq, gen uint64
	reason   reason
	err      *requestError // for badRequest
	// Each configured limit's verdict; nil for a limit not set.
	request, endpoint, cost *verdict
	tooLarge                bool
	charge                  int64         // what the cost limit was asked for: Record.Usage
	endpointName            string        // "POST /v1/things", with an endpoint limit
	retryAfter              time.Duration // 0 when retrying is not known to help
	fail                    int           // status to fail with after the latency, or 0
	delay                   time.Duration
}

// ServeHTTP plays the upstream.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	arrived := s.cfg.Now()
	if strings.HasPrefix(r.URL.Path, ControlPrefix) {
		s.serveControl(w, r)
		return
	}
	key := apiKey(r)
	cost, costErr := s.requestCost(r)
	usage, usageErr := s.requestUsage(r, cost)
	if costErr == nil {
		costErr = usageErr
	}
	rec := Record{
		At:             arrived.Sub(s.start),
		Method:         r.Method,
		Path:           r.URL.Path,
		Key:            key,
		IdempotencyKey: r.Header.Get(s.cfg.IdempotencyHeader),
		Cost:           cost,
		Usage:          usage,
	}
	d := s.admit(&rec, costErr)
	if d.reason != admitted {
		status := s.writeRefusal(w, d)
		s.finish(d, key, false, status)
		return
	}
	status := d.fail
	if err := s.sleep(r.Context(), d.delay); err != nil {
		s.finish(d, key, true, StatusClientClosed)
		return
	}
	if status == 0 {
		status = s.writeOK(w, d, &rec)
	} else {
		s.writeFailure(w, d, status)
	}
	s.finish(d, key, true, status)
}

// admit records the arrival and decides, all under the lock so that
// checking and taking every limit is one step.
func (s *Server) admit(rec *Record, costErr *requestError) decision {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ids++
	d := decision{id: "req_" + strconv.FormatUint(s.ids, 10), seq: s.arrivals, gen: s.gen, charge: rec.Usage}
	rec.Seq = s.arrivals
	at, key := rec.At, rec.Key

	var req, ep, cost verdict
	var endpointKey string
	if s.request != nil {
		req = s.request.check(key, at, 1)
		d.request = &req
	}
	if s.endpoint != nil {
		// Stripe counts an endpoint per operation; without route templates
		// the closest is the method and exact path.
		d.endpointName = rec.Method + " " + rec.Path
		endpointKey = key + "\x00" + d.endpointName
		ep = s.endpoint.check(endpointKey, at, 1)
		d.endpoint = &ep
	}
	if s.cost != nil {
		// The charge is the real use when the request reports it: OpenAI
		// bills what a completion used, and charging it at once keeps the
		// fake's books simple (a real upstream settles after answering).
		cost = s.cost.check(key, at, d.charge)
		d.cost = &cost
	}
	switch {
	case costErr != nil:
		d.reason, d.err = badRequest, costErr
	case s.cfg.Concurrency > 0 && s.inFlight[key] >= s.cfg.Concurrency:
		// Nobody knows when a slot frees; a second is what clients are
		// usually told.
		d.reason, d.retryAfter = overConcurrency, time.Second
	default:
		d.reason = s.refusal(&d, req, ep, cost)
	}
	if d.reason == admitted {
		if s.request != nil {
			req = s.request.take(key, at, 1)
		}
		if s.endpoint != nil {
			ep = s.endpoint.take(endpointKey, at, 1)
		}
		if s.cost != nil {
			cost = s.cost.take(key, at, d.charge)
		}
		s.inFlight[key]++
		s.flying++
		s.maxInFlight = max(s.maxInFlight, s.flying)
		if u := s.fails.Float64(); u < s.cfg.FailRate/2 {
			d.fail = http.StatusInternalServerError
		} else if u < s.cfg.FailRate {
			d.fail = http.StatusServiceUnavailable
		}
		d.delay = s.cfg.Latency
		if s.cfg.Jitter > 0 {
			d.delay += time.Duration(s.jitter.Int64N(int64(s.cfg.Jitter) + 1))
		}
		rec.Admitted = true
		s.maybeSweep(at)
	}
	s.appendRecord(*rec)
	return d
}

// refusal picks which exhausted limit to report: the one that takes longest
// to allow the request, since waiting for any shorter one would not help.
func (s *Server) refusal(d *decision, req, ep, cost verdict) reason {
	r := admitted
	consider := func(v verdict, why reason) {
		switch {
		case s.limiterFor(why) == nil || v.ok:
		case v.tooLarge:
			r, d.tooLarge, d.retryAfter = why, true, 0
		case !d.tooLarge && v.retryAfter >= d.retryAfter:
			r, d.retryAfter = why, v.retryAfter
		}
	}
	consider(req, overRate)
	consider(ep, overEndpoint)
	consider(cost, overCost)
	return r
}

func (s *Server) limiterFor(r reason) limiter {
	switch r {
	case overRate:
		return s.request
	case overEndpoint:
		return s.endpoint
	case overCost:
		return s.cost
	}
	return nil
}

func (s *Server) maybeSweep(at time.Duration) {
	n := 0
	for _, l := range []limiter{s.request, s.endpoint, s.cost} {
		if l != nil {
			n += l.size()
		}
	}
	if n <= s.sweepAt {
		return
	}
	n = 0
	for _, l := range []limiter{s.request, s.endpoint, s.cost} {
		if l != nil {
			l.sweep(at)
			n += l.size()
		}
	}
	s.sweepAt = max(minSweep, 2*n)
}

func (s *Server) appendRecord(rec Record) {
	if n := len(s.records); n < s.cfg.MaxRecords {
		if n == cap(s.records) {
			// Grow by hand: append's own growth could overshoot MaxRecords
			// by up to half again, and the bound is the point.
			grown := make([]Record, n, min(s.cfg.MaxRecords, max(64, 2*n)))
			copy(grown, s.records)
			s.records = grown
		}
		s.records = append(s.records, rec)
	} else {
		s.records[rec.Seq%uint64(s.cfg.MaxRecords)] = rec
	}
	s.arrivals++
}

// finish counts the answer and releases the request's concurrency slot.
func (s *Server) finish(d decision, key string, wasAdmitted bool, status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if wasAdmitted {
		if s.inFlight[key]--; s.inFlight[key] <= 0 {
			delete(s.inFlight, key)
		}
		s.flying--
	}
	if d.gen != s.gen {
		return
	}
	s.byStatus[status]++
	if status == http.StatusTooManyRequests {
		s.rejectedBy[d.rejectionName()]++
	}
	if s.arrivals-d.seq <= uint64(len(s.records)) {
		s.records[d.seq%uint64(s.cfg.MaxRecords)].Status = status
	}
}

// apiKey reads the caller's key from a bearer token, or from Basic auth's
// user name as Stripe's curl examples send it (-u sk_test_...:).
func apiKey(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if scheme, token, ok := strings.Cut(h, " "); ok && strings.EqualFold(scheme, "Bearer") {
		return strings.TrimSpace(token)
	}
	if scheme, enc, ok := strings.Cut(h, " "); ok && strings.EqualFold(scheme, "Basic") {
		if raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc)); err == nil {
			user, _, _ := strings.Cut(string(raw), ":")
			return user
		}
	}
	return ""
}

// requestError is a request the server refuses as malformed.
type requestError struct {
	status int
	msg    string
}

func (e *requestError) Error() string { return e.msg }

// requestCost reads the request's cost for the cost limit: the cost header
// if present, else a JSON body's max_tokens, else 0. Without a cost limit
// every request costs 0.
func (s *Server) requestCost(r *http.Request) (int64, *requestError) {
	cl := s.cfg.CostLimit
	if cl == nil {
		return 0, nil
	}
	if v := r.Header.Get(cl.Header); v != "" {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || n < 0 {
			return 0, &requestError{http.StatusBadRequest, fmt.Sprintf("header %s: %q is not a whole number of %s", cl.Header, v, cl.Name)}
		}
		return n, nil
	}
	if r.Body == nil {
		return 0, nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil {
		return 0, &requestError{http.StatusBadRequest, "reading the body: " + err.Error()}
	}
	if len(body) > MaxBodyBytes {
		return 0, &requestError{http.StatusRequestEntityTooLarge, fmt.Sprintf("body over %d bytes", MaxBodyBytes)}
	}
	var v struct {
		MaxTokens *json.Number `json:"max_tokens"`
	}
	// Bodies that are not JSON objects simply carry no cost: the fake does
	// not judge payloads.
	if json.Unmarshal(body, &v) != nil || v.MaxTokens == nil {
		return 0, nil
	}
	n, err := strconv.ParseInt(v.MaxTokens.String(), 10, 64)
	if err != nil || n < 0 {
		return 0, &requestError{http.StatusBadRequest, fmt.Sprintf("max_tokens %s: must be a whole number, not negative", v.MaxTokens)}
	}
	return n, nil
}

// requestUsage reads what the request really used from the UsageHeader;
// without one it used what it declared.
func (s *Server) requestUsage(r *http.Request, declared int64) (int64, *requestError) {
	v := r.Header.Get(UsageHeader)
	if v == "" {
		return declared, nil
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n < 0 {
		unit := "units"
		if s.cfg.CostLimit != nil {
			unit = s.cfg.CostLimit.Name
		}
		return 0, &requestError{http.StatusBadRequest, fmt.Sprintf("header %s: %q is not a whole number of %s used", UsageHeader, v, unit)}
	}
	return n, nil
}

func (s *Server) serveControl(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case ControlPrefix + "report":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "use GET", http.StatusMethodNotAllowed)
			return
		}
		body, err := json.MarshalIndent(s.Report(), "", "  ")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(append(body, '\n'))
	case ControlPrefix + "reset":
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			http.Error(w, "use POST", http.StatusMethodNotAllowed)
			return
		}
		s.Reset()
		w.WriteHeader(http.StatusNoContent)
	default:
		http.Error(w, "unknown control path; try GET "+ControlPrefix+"report or POST "+ControlPrefix+"reset", http.StatusNotFound)
	}
}
