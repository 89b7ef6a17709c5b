// Package server is shaper's enqueue API (`shaper serve`): producers POST
// jobs, each API key passes a token-bucket admission check shared by every
// replica through Redis, jobs are validated against the upstream's config
// and enqueued, and producers read them back. It also serves upstream
// status, fleet-wide pause and resume for admin keys, /metrics, /healthz,
// /readyz, and the status page at /ui/ (package internal/ui). Errors are RFC 9457 problem+json that name the field at fault.
package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/api"
	"github.com/shaperhq/shaper/httplimit"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/internal/script"
	"github.com/shaperhq/shaper/internal/ui"
	"github.com/shaperhq/shaper/internal/wire"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/metrics"
	"github.com/shaperhq/shaper/queue"
	"github.com/shaperhq/shaper/schedule"
	"github.com/shaperhq/shaper/status"
	"github.com/shaperhq/shaper/tokenbucket"
)

// Key is one producer's credentials.
type Key struct {
	Name   string
	Tenant string
	Admin  bool
	Secret string
}

// Config configures a Server; zero values are documented defaults.
type Config struct {
	Keys []Key
	// Admission is the token bucket every key's enqueues pass through.
	Admission tokenbucket.Limit
	// OnRedisError is admission's failure policy (default allow).
	OnRedisError shaper.OnRedisError
	// MaxBodyBytes caps request bodies; default 1 MiB.
	MaxBodyBytes int64
	// MaxBatch caps jobs per batch request; default 1000. A batch is
	// admitted whole, one token per job, so the admission capacity caps it
	// too: with the default capacity of 100, a batch holds up to 100 jobs.
	MaxBatch int
	// StoreTimeout bounds all the Redis calls one enqueue request makes,
	// together (admission, the backlog check, the write, a Retry-After
	// estimate), from when its body has been read, so a producer hears back
	// in about that long however Redis fails, dead or hung; default 300ms.
	// Healthy calls take milliseconds; the rest of the 500ms a producer may
	// wait is margin for a loaded host.
	StoreTimeout time.Duration
	Prefix       string
	Logger       *slog.Logger
	Metrics      *metrics.Metrics
	// Registry is served at /metrics; nil serves no metrics.
	Registry *prometheus.Registry
	// Now is the clock for job timestamps; nil is time.Now.
	Now func() time.Time
	// CallbackHosts is callbacks.allowed_hosts: the hosts a job's
	// callback_url may name (none: every callback_url is refused).
	CallbackHosts []string
	// ProxyTransport sends proxied calls; nil is a transport per upstream
	// whose response header timeout is the upstream's timeout.
	ProxyTransport http.RoundTripper
	// PacerNow replaces Redis's clock for the proxy's pacing, as
	// leaky.Config.Now does: for tests only.
	PacerNow func() time.Time
	// Horizon is work.horizon, how far ahead workers book their jobs'
	// slots; a proxied call books as far ahead, no further. Default
	// shaper.DefaultHorizon.
	Horizon time.Duration
}

// Server is the HTTP API. Build it with New; Handler serves it.
type Server struct {
	cfg       Config
	rdb       redis.UniversalClient
	q         *queue.Queue
	st        *status.Reader
	admission *shaper.Fallible
	policy    httplimit.Policy
	log       *slog.Logger
	m         *metrics.Metrics
	keys      []keyEntry
	ups       map[string]upstreamEntry
	mux       *http.ServeMux
	store     *breaker
	// callAdmission is admission's Redis limiter, which a proxied call
	// pays in its booking's script call; nil when they cannot share one
	// (a Cluster keeps a key's bucket in a slot of its own), and a call
	// pays admission on its own first.
	callAdmission atomic.Pointer[tokenbucket.Limiter]
	// maxBatch is the most jobs a batch may hold: MaxBatch, or the
	// admission capacity if that is smaller.
	maxBatch int
	// openapi is the API's OpenAPI document as served, converted once.
	openapi []byte
	// patterns are the routes registered on mux, in order, so that a test
	// can hold them to the OpenAPI document both ways.
	patterns []string
	// schedules keeps the tenants' schedules (schedules.go).
	schedules *schedule.Store
	// handler serves mux, and the proxy's paths before the mux cleans them.
	handler http.Handler
	// The proxy (proxy.go): its upstreams, their pacer and the drain
	// counts of its sends.
	proxies map[string]*proxyEntry
	pacer   *leaky.Pacer
	drain   *jobstore.Recorder
}

// storeProbeEvery is how often, while Redis is failing, one enqueue is let
// through to see whether it is back: often enough that recovery is seen
// within a second or so, rarely enough that an outage costs Redis nothing.
const storeProbeEvery = 250 * time.Millisecond

type keyEntry struct {
	Key
	sum [32]byte
}

type upstreamEntry struct {
	shaper.Upstream
	base    *url.URL // nil for a Go handler upstream
	bucket  *leaky.Bucket
	costs   map[string]bool
	headers map[string]bool
}

// New builds the API on rdb (owned by the caller) with q and st reading the
// same Redis.
func New(rdb redis.UniversalClient, q *queue.Queue, st *status.Reader, cfg Config) (*Server, error) {
	if len(cfg.Keys) == 0 {
		return nil, errors.New("server: no API keys")
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 1000
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = 300 * time.Millisecond
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Server{cfg: cfg, rdb: rdb, q: q, st: st, log: log, m: metrics.OrDiscard(cfg.Metrics), ups: map[string]upstreamEntry{},
		store: &breaker{probeEvery: storeProbeEvery, log: log}}
	for _, k := range cfg.Keys {
		if k.Secret == "" {
			return nil, fmt.Errorf("server: key %s has no secret", k.Name)
		}
		if k.Tenant == "" {
			k.Tenant = k.Name
		}
		s.keys = append(s.keys, keyEntry{Key: k, sum: sha256.Sum256([]byte(k.Secret))})
	}
	if err := s.addUpstreams(q, st); err != nil {
		return nil, err
	}
	for _, u := range q.Upstreams() {
		s.m.InitEnqueue(u.Name, u.LaneNames())
	}
	s.m.InitAPI()
	if err := s.newProxies(q.Upstreams()); err != nil {
		return nil, err
	}
	tb, err := tokenbucket.New(rdb, cfg.Admission, tokenbucket.Config{Prefix: cfg.Prefix})
	if err != nil {
		return nil, fmt.Errorf("server: admission: %w", err)
	}
	if script.ShardingOf(rdb) == script.OneNode {
		s.callAdmission.Store(tb)
	}
	s.admission = &shaper.Fallible{
		Limiter: &gatedLimiter{limiter: tb, store: s.store, budget: cfg.StoreTimeout},
		Policy:  cfg.OnRedisError,
		Local:   tokenbucket.NewLocal(cfg.Admission, nil),
		Name:    "admission",
		Logger:  log,
		Observe: func(p shaper.OnRedisError, err error) {
			s.m.RedisErrors.WithLabelValues("admission").Inc()
			switch p {
			case shaper.FailOpen:
				s.m.AdmissionFailOpen.Inc()
				s.m.AdmissionDecisions.WithLabelValues("fail_open").Inc()
			case shaper.FailClosed:
				s.m.AdmissionDecisions.WithLabelValues("fail_closed").Inc()
			default:
				s.m.AdmissionDecisions.WithLabelValues("local").Inc()
			}
		},
	}
	s.maxBatch = int(min(int64(cfg.MaxBatch), cfg.Admission.Capacity))
	s.policy = httplimit.Policy{Name: "enqueue", Quota: cfg.Admission.Capacity, Window: cfg.Admission.Window()}
	page, err := ui.New()
	if err != nil {
		return nil, fmt.Errorf("server: status page: %w", err)
	}
	if s.openapi, err = api.JSON(); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	s.routes(page)
	return s, nil
}

// Handler serves the API.
func (s *Server) Handler() http.Handler { return s.handler }

func (s *Server) routes(page http.Handler) {
	mux := http.NewServeMux()
	handle := func(pattern string, h http.Handler) {
		s.patterns = append(s.patterns, pattern)
		mux.Handle(pattern, s.measured(pattern, h))
	}
	handle("POST /v1/jobs", s.authed(s.handleEnqueue))
	handle("POST /v1/jobs/batch", s.authed(s.handleBatch))
	handle("GET /v1/jobs/{id}", s.authed(s.handleGet))
	handle("GET /v1/jobs", s.authed(s.handleList))
	handle("DELETE /v1/jobs/{id}", s.authed(s.handleCancel))
	handle("POST /v1/jobs/{id}/retry", s.authed(s.handleRetry))
	handle("POST /v1/jobs/{id}/callback/retry", s.authed(s.handleCallbackRetry))
	handle("GET /v1/upstreams", s.authed(s.handleUpstreams))
	handle("GET /v1/upstreams/{name}", s.authed(s.handleUpstream))
	handle("GET /v1/upstreams/{name}/history", s.authed(s.handleHistory))
	handle("POST /v1/upstreams/{name}/pause", s.authed(s.admin(s.handlePause)))
	handle("POST /v1/upstreams/{name}/resume", s.authed(s.admin(s.handleResume)))
	handle("POST /v1/upstreams/{name}/retry-dead", s.authed(s.admin(s.handleRetryDead)))
	// Limits changed live, for every replica (server/limits.go).
	handle("PUT /v1/upstreams/{name}/limits", s.authed(s.admin(s.handlePutLimits)))
	handle("DELETE /v1/upstreams/{name}/limits", s.authed(s.admin(s.handleResetLimits)))
	handle("GET /v1/upstreams/{name}/partitions/{partition}/limits", s.authed(s.admin(s.handleGetPartitionLimits)))
	handle("PUT /v1/upstreams/{name}/partitions/{partition}/limits", s.authed(s.admin(s.handlePutPartitionLimits)))
	handle("DELETE /v1/upstreams/{name}/partitions/{partition}/limits", s.authed(s.admin(s.handleResetPartitionLimits)))
	s.scheduleRoutes(handle)
	handle("GET /v1/openapi.json", http.HandlerFunc(s.handleOpenAPI))
	// The proxy relays any method; these are the ones documented.
	proxied := s.measured(proxyRoute, s.authed(s.handleProxy))
	for _, m := range proxyMethods() {
		s.patterns = append(s.patterns, m+" "+proxyRoute)
		mux.Handle(m+" /proxy/{upstream}/{rest...}", proxied)
	}
	handle("GET /healthz", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok\n")) }))
	handle("GET /readyz", http.HandlerFunc(s.handleReady))
	// The status page is public: its files hold no data, and the page
	// sends its key to the API routes above like any client.
	handle("GET "+ui.Prefix, page)
	if s.cfg.Registry != nil {
		handle("GET /metrics", promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{Registry: s.cfg.Registry}))
	}
	// Anything else, under one label: a raw path must never become one.
	mux.Handle("/", s.measured("unmatched", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, problem{Type: problemNotFound, Title: "Not found", Status: http.StatusNotFound,
			Detail: fmt.Sprintf("no route for %s %s; see docs/http-api.md or GET /v1/openapi.json", r.Method, r.URL.Path)})
	})))
	s.mux = mux
	// A proxied path reaches the proxy as the caller wrote it: the mux
	// would redirect one with "." or ".." segments, which the proxy
	// refuses instead (queue.Target).
	s.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, proxyPrefix) {
			proxied.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// measured counts a route's requests by status code and times them,
// labelled by the route's pattern, never by the request's own path.
func (s *Server) measured(route string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		h.ServeHTTP(rec, r)
		s.m.APIRequests.WithLabelValues(route, strconv.Itoa(rec.code)).Inc()
		s.m.APIRequestDuration.WithLabelValues(route).Observe(time.Since(start).Seconds())
	})
}

// statusRecorder remembers the status code a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	code        int
	wroteHeader bool
}

func (r *statusRecorder) WriteHeader(code int) {
	if !r.wroteHeader {
		r.code, r.wroteHeader = code, true
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	r.wroteHeader = true
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

type ctxKey struct{}

// caller is the authenticated key of a request.
func caller(r *http.Request) *keyEntry { return r.Context().Value(ctxKey{}).(*keyEntry) }

// authed requires a known API key (Authorization: Bearer, or X-API-Key),
// compared in constant time against every configured key.
func (s *Server) authed(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		given, err := wire.APIKey(r)
		if err != nil {
			s.unauthorized(w, err.Error())
			return
		}
		if given == "" {
			s.unauthorized(w, "an API key is required: send Authorization: Bearer KEY")
			return
		}
		sum := sha256.Sum256([]byte(given))
		var match *keyEntry
		for i := range s.keys {
			// Every key is compared, so timing says nothing about which matched.
			if subtle.ConstantTimeCompare(sum[:], s.keys[i].sum[:]) == 1 {
				match = &s.keys[i]
			}
		}
		if match == nil {
			s.unauthorized(w, "the API key is not known")
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, match)))
	}
}

func (s *Server) unauthorized(w http.ResponseWriter, detail string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="shaper"`)
	writeProblem(w, problem{Type: problemUnauthorized, Title: "Unauthorized", Status: http.StatusUnauthorized, Detail: detail})
}

// admin requires an admin key.
func (s *Server) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !caller(r).Admin {
			writeProblem(w, problem{Type: problemForbidden, Title: "Forbidden", Status: http.StatusForbidden,
				Detail: fmt.Sprintf("key %s is not an admin key; pausing, resuming, retrying every dead job of an upstream and changing its limits need one", caller(r).Name)})
			return
		}
		h(w, r)
	}
}

// admit charges n tokens to the caller's bucket. It writes the rate-limit
// headers, and the 429 when refused; it reports whether to go on.
func (s *Server) admit(w http.ResponseWriter, r *http.Request, n int64) bool {
	k := caller(r)
	res, err := s.admission.Allow(r.Context(), k.Name, n)
	if err != nil {
		if errors.Is(err, shaper.ErrInvalid) {
			writeProblem(w, problem{Type: problemInvalid, Title: "Invalid request", Status: http.StatusBadRequest,
				Detail: fmt.Sprintf("%d jobs in one request exceed the admission capacity of %d", n, s.cfg.Admission.Capacity)})
			return false
		}
		s.internalError(w, r, "admission", err)
		return false
	}
	httplimit.WriteHeaders(w.Header(), s.policy, res)
	if !res.Allowed {
		s.m.AdmissionDecisions.WithLabelValues("denied").Inc()
		httplimit.WriteTooManyRequests(w, s.policy, res)
		return false
	}
	s.m.AdmissionDecisions.WithLabelValues("allowed").Inc()
	return true
}

func (s *Server) internalError(w http.ResponseWriter, r *http.Request, component string, err error) {
	if r.Context().Err() != nil {
		return
	}
	s.m.RedisErrors.WithLabelValues(component).Inc()
	s.log.Error("request failed", "path", r.URL.Path, "component", component, "err", err)
	writeProblem(w, storeUnavailable("shaper could not reach Redis; retry shortly"))
}

// backlogRetryAfter estimates when an upstream at max_pending will have
// room: the time to drain a tenth of its backlog at the rate it drained at
// lately (or, idle, its configured rate), so producers neither stampede nor
// wait for the whole backlog.
func (s *Server) backlogRetryAfter(ctx context.Context, upstream string, full *queue.BacklogFullError) int64 {
	// Within the store budget: a slow status read must not hold the 503.
	ctx, cancel := context.WithDeadline(ctx, storeDeadline(ctx, s.cfg.StoreTimeout))
	defer cancel()
	st, err := s.st.Upstream(ctx, upstream)
	if err != nil {
		return 1
	}
	rate := st.DrainRate.Last10s
	if rate <= 0 && st.AtLimitSeconds > 0 {
		rate = float64(st.Backlog.Total) / st.AtLimitSeconds
	}
	if rate <= 0 {
		return 1
	}
	secs := math.Ceil(float64(full.Pending) / 10 / rate)
	return int64(max(1, min(secs, 3600)))
}

// handleOpenAPI serves the API's OpenAPI document, without a key: it says
// nothing a producer's README would not.
func (s *Server) handleOpenAPI(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Write(s.openapi)
}

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		writeProblem(w, problem{Type: problemUnavailable, Title: "Not ready", Status: http.StatusServiceUnavailable,
			Detail: "redis does not answer: " + err.Error()})
		return
	}
	w.Write([]byte("ok\n"))
}
