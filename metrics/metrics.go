// Package metrics defines every Prometheus metric shaper exports, registered
// on a registry the caller injects (never the global one). Components take a
// *Metrics; given nil they record into a private registry nobody scrapes.
package metrics

import (
	"context"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics holds shaper's collectors.
type Metrics struct {
	AdmissionDecisions *prometheus.CounterVec   // result
	AdmissionFailOpen  prometheus.Counter       //
	JobsEnqueued       *prometheus.CounterVec   // upstream, lane
	JobsRejected       *prometheus.CounterVec   // upstream, reason
	Dispatches         *prometheus.CounterVec   // upstream, outcome
	UpstreamResponses  *prometheus.CounterVec   // upstream, class
	PacingWait         *prometheus.HistogramVec // upstream
	LateSlots          *prometheus.CounterVec   // upstream
	InFlight           *prometheus.GaugeVec     // upstream
	UpstreamPaused     *prometheus.GaugeVec     // upstream
	UpstreamBlocks     *prometheus.CounterVec   // upstream, reason
	RedisErrors        *prometheus.CounterVec   // component
	RequestDuration    *prometheus.HistogramVec // upstream
	UpstreamLimitRate  *prometheus.GaugeVec     // upstream, limit, source
	BuildInfo          *prometheus.GaugeVec     // version, revision, goversion
	APIRequests        *prometheus.CounterVec   // route, code
	APIRequestDuration *prometheus.HistogramVec // route
	ScheduleRuns       *prometheus.CounterVec   // result
	CallbackDeliveries *prometheus.CounterVec   // outcome
	ProxyCalls         *prometheus.CounterVec   // upstream, code
	ProxyWait          *prometheus.HistogramVec // upstream
}

// New creates the metrics and registers them on reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		AdmissionDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shaper_admission_decisions_total",
			Help: "Admission decisions on the enqueue API by result (allowed, denied, fail_open, fail_closed, local).",
		}, []string{"result"}),
		AdmissionFailOpen: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shaper_admission_fail_open_total",
			Help: "Requests admitted without a decision because Redis could not answer.",
		}),
		JobsEnqueued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shaper_jobs_enqueued_total",
			Help: "Jobs accepted for dispatch by upstream and lane.",
		}, []string{"upstream", "lane"}),
		JobsRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shaper_jobs_rejected_total",
			Help: "Jobs refused at enqueue by upstream and reason.",
		}, []string{"upstream", "reason"}),
		Dispatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shaper_dispatches_total",
			Help: "Dispatch attempts by upstream and outcome (succeeded, retry, dead, deferred, expired).",
		}, []string{"upstream", "outcome"}),
		UpstreamResponses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shaper_upstream_responses_total",
			Help: "Upstream answers by status class (2xx, 3xx, 4xx, 429, 5xx, error).",
		}, []string{"upstream", "class"}),
		PacingWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "shaper_pacing_wait_seconds",
			Help:    "Time from a job's pickup to its send slot.",
			Buckets: []float64{0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60},
		}, []string{"upstream"}),
		LateSlots: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shaper_pacing_late_slots_total",
			Help: "Send slots skipped because the worker woke too long after them (the pacing guard at work).",
		}, []string{"upstream"}),
		InFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "shaper_dispatch_in_flight",
			Help: "Requests this replica is sending to the upstream right now.",
		}, []string{"upstream"}),
		UpstreamPaused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "shaper_upstream_paused",
			Help: "1 while the upstream is blocked or paused fleet-wide, as this replica last saw it.",
		}, []string{"upstream"}),
		UpstreamBlocks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shaper_upstream_blocks_total",
			Help: "Fleet-wide blocks this replica placed on an upstream by reason (429, quota_exhausted, stated_limit, pause).",
		}, []string{"upstream", "reason"}),
		RedisErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shaper_redis_errors_total",
			Help: "Redis operations that failed, by component (admission, enqueue, pacing, secrets, results, status, jobs).",
		}, []string{"component"}),
		RequestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "shaper_upstream_request_duration_seconds",
			Help:    "Time the upstream took to answer.",
			Buckets: prometheus.DefBuckets,
		}, []string{"upstream"}),
	}
	m.UpstreamLimitRate = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "shaper_upstream_limit_rate",
		Help: "Units per second the fleet paces an upstream's limit at, as this replica last read it: the configured rate, an adaptive limit's current rate, a rate the upstream stated, or one an operator set (source: configured, adaptive, stated, operator).",
	}, []string{"upstream", "limit", "source"})
	reg.MustRegister(m.UpstreamLimitRate)
	m.BuildInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "shaper_build_info",
		Help: "Always 1: the shaper build this process runs, by module version, VCS revision and Go version.",
	}, []string{"version", "revision", "goversion"})
	m.BuildInfo.WithLabelValues(Build()).Set(1)
	m.APIRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shaper_api_requests_total",
		Help: "Requests to the HTTP API by route (the pattern it matched, e.g. \"POST /v1/jobs\"; \"unmatched\" for none) and status code.",
	}, []string{"route", "code"})
	m.APIRequestDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "shaper_api_request_duration_seconds",
		Help:    "Time the HTTP API took to answer, by route.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	}, []string{"route"})
	reg.MustRegister(m.BuildInfo, m.APIRequests, m.APIRequestDuration)
	m.ScheduleRuns = newScheduleRuns()
	reg.MustRegister(m.ScheduleRuns)
	m.CallbackDeliveries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shaper_callback_deliveries_total",
		Help: "Callback delivery attempts by outcome (delivered; retry: failed, tried again later; failed: failed, retries ran out; stale: recorded after its lease had passed to another replica).",
	}, []string{"outcome"})
	reg.MustRegister(m.CallbackDeliveries)
	reg.MustRegister(m.AdmissionDecisions, m.AdmissionFailOpen, m.JobsEnqueued, m.JobsRejected, m.Dispatches,
		m.UpstreamResponses, m.PacingWait, m.LateSlots, m.InFlight, m.UpstreamPaused, m.UpstreamBlocks,
		m.RedisErrors, m.RequestDuration)
	m.newProxy(reg)
	return m
}

// OrDiscard returns m, or metrics on a private registry when m is nil.
func OrDiscard(m *Metrics) *Metrics {
	if m != nil {
		return m
	}
	return New(prometheus.NewRegistry())
}

// Backlog reports each upstream's backlog by lane at scrape time.
type Backlog func(ctx context.Context) (map[string]map[string]int64, error)

// backlogCollector reads backlogs from Redis when scraped, so every replica
// exports the fleet's truth rather than its own guess.
type backlogCollector struct {
	read   Backlog
	desc   *prometheus.Desc
	failed prometheus.Counter
}

// RegisterBacklog exports shaper_backlog_jobs{upstream,lane}, read by fn at
// each scrape with a short timeout. A failed read exports no backlog (the
// rest of the scrape still succeeds) and counts in m's
// shaper_redis_errors_total{component="status"}, so the gap is visible.
func RegisterBacklog(reg prometheus.Registerer, m *Metrics, fn Backlog) error {
	return reg.Register(&backlogCollector{read: fn, failed: OrDiscard(m).RedisErrors.WithLabelValues("status"),
		desc: prometheus.NewDesc("shaper_backlog_jobs", "Jobs waiting or in flight by upstream and lane, all replicas together.",
			[]string{"upstream", "lane"}, nil)})
}

func (c *backlogCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *backlogCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	byUpstream, err := c.read(ctx)
	if err != nil {
		// Not an invalid metric: that would fail the whole scrape, and every
		// other metric with it, over one slow read.
		c.failed.Inc()
		return
	}
	for up, lanes := range byUpstream {
		for lane, n := range lanes {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), up, lane)
		}
	}
}

// Build is this binary's module version, VCS revision (with "-dirty" when
// built from a modified tree) and Go version, as the Go toolchain stamped
// them; "unknown" where it stamped none (go run, tests).
func Build() (version, revision, goversion string) {
	version, revision, goversion = "unknown", "unknown", runtime.Version()
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		version = v
	}
	dirty := false
	for _, kv := range bi.Settings {
		switch kv.Key {
		case "vcs.revision":
			revision = kv.Value
		case "vcs.modified":
			dirty = kv.Value == "true"
		}
	}
	if dirty && revision != "unknown" {
		revision += "-dirty"
	}
	return
}

// UnknownUpstream is the upstream label of jobs refused because they name
// no configured upstream, so that a typo cannot mint a label.
const UnknownUpstream = "unknown"

// The label values below are the documented ones (docs/operations.md,
// Metrics by process), listed next to the metrics so that every
// documented series exists at 0 from the start: a rate() or an
// alert over a series that appears only with its first event sees nothing
// before it, and "no data" reads like "no trouble".

// InitDispatch creates, at 0, every series a worker exports for upstream,
// with each documented label value, so that they exist before their first
// event.
func (m *Metrics) InitDispatch(upstream string) {
	for _, o := range []string{"succeeded", "retry", "dead", "deferred", "expired"} {
		m.Dispatches.WithLabelValues(upstream, o)
	}
	for _, c := range []string{"2xx", "3xx", "4xx", "429", "5xx", "error"} {
		m.UpstreamResponses.WithLabelValues(upstream, c)
	}
	// Workers place these blocks; a pause is placed through the API
	// (InitEnqueue).
	for _, r := range []string{"429", "quota_exhausted", "stated_limit"} {
		m.UpstreamBlocks.WithLabelValues(upstream, r)
	}
	m.PacingWait.WithLabelValues(upstream)
	m.RequestDuration.WithLabelValues(upstream)
	m.LateSlots.WithLabelValues(upstream)
	m.InFlight.WithLabelValues(upstream)
	m.UpstreamPaused.WithLabelValues(upstream)
}

// InitEnqueue creates, at 0, every series the API exports for upstream and
// its lanes: jobs enqueued per lane, jobs refused per documented reason,
// and pauses placed through the API.
func (m *Metrics) InitEnqueue(upstream string, lanes []string) {
	for _, l := range lanes {
		m.JobsEnqueued.WithLabelValues(upstream, l)
	}
	for _, r := range []string{"invalid", "rate_limited", "backlog_full", "store_error"} {
		m.JobsRejected.WithLabelValues(upstream, r)
	}
	m.UpstreamBlocks.WithLabelValues(upstream, "pause")
}

// InitAPI creates, at 0, the API's series that belong to no upstream:
// admission decisions by result, and jobs refused before their upstream
// was known (a batch refused whole, a body that does not parse) or because
// it is not configured.
func (m *Metrics) InitAPI() {
	for _, r := range []string{"allowed", "denied", "fail_open", "fail_closed", "local"} {
		m.AdmissionDecisions.WithLabelValues(r)
	}
	m.InitRedisErrors("admission", "enqueue", "jobs", "pacing", "status")
	for _, r := range []string{"unknown_upstream", "invalid", "rate_limited"} {
		m.JobsRejected.WithLabelValues(UnknownUpstream, r)
	}
}

// InitRedisErrors creates, at 0, the Redis error series of the components
// a process has, so that an alert on their increase sees the first error.
func (m *Metrics) InitRedisErrors(components ...string) {
	for _, c := range components {
		m.RedisErrors.WithLabelValues(c)
	}
}
