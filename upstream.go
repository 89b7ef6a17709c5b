package shaper

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/shaperhq/shaper/leaky"
)

// Upstream is one third-party API that shaper calls, as every part of
// shaper sees it: the config file produces it, the queue stores its jobs by
// it, the dispatcher paces and sends by it, the API checks jobs against it
// and status reports on it. This type is the only description of an
// upstream; its defaults are stated once, here (see WithDefaults).
type Upstream struct {
	// Name is part of queue names, Redis hash tags and metric labels:
	// lowercase letters, digits, _ and -, at most 63.
	Name string
	// BaseURL is where job paths are sent; empty for an upstream served by
	// a Go handler, whose jobs name a task instead.
	BaseURL string
	// Limits must all allow each send; each is a leaky bucket. At least one.
	Limits []leaky.Limit
	// Guard is the pacing guard (leaky.BucketConfig.Guard) of the
	// upstream's and its partitions' buckets; 0 is leaky.DefaultGuardFor
	// all of them (EveryLimit).
	Guard time.Duration
	// Concurrency caps requests in flight across all replicas; 0 is none.
	Concurrency int
	// Timeout bounds one attempt. Default DefaultTimeout.
	Timeout time.Duration
	// MaxPending bounds jobs waiting or in flight (not finished ones);
	// enqueues beyond it are refused. Default DefaultMaxPending.
	MaxPending int64
	// Retry bounds how failed attempts (not rate-limited ones) are retried.
	Retry Retry
	// Headers are added to every request by the workers (credentials);
	// jobs may not set them.
	Headers map[string]string
	// IdempotencyHeader carries the job's idempotency key on every attempt.
	// Default DefaultIdempotencyHeader, unless NoIdempotencyHeader.
	IdempotencyHeader string
	// NoIdempotencyHeader sends no idempotency key, for upstreams that
	// reject unknown headers (a config file says idempotency_header: "").
	NoIdempotencyHeader bool
	// Lanes weigh the upstream's queues against each other by name; they
	// include DefaultLane. Default {DefaultLane: 1}.
	Lanes map[string]int
	// Workers is how many jobs one replica works on at once. Default
	// DefaultWorkers(Concurrency, Limits).
	Workers int
	// MaxResponseBytes caps the stored response body. Default
	// DefaultMaxResponseBytes.
	MaxResponseBytes int64
	// ResultRetention keeps succeeded jobs and their responses; it also
	// bounds how long an idempotency key is remembered after success.
	// Default DefaultResultRetention.
	ResultRetention time.Duration
	// DeadRetention keeps dead and cancelled jobs. Default
	// DefaultDeadRetention.
	DeadRetention time.Duration
	// ResultMaxCount bounds how many succeeded jobs are kept beside
	// ResultRetention: past it the oldest go first, so a busy upstream's
	// results cannot outgrow Redis within their retention. Default
	// DefaultResultMaxCount.
	ResultMaxCount int
	// DeadMaxCount is ResultMaxCount for dead and cancelled jobs. Default
	// DefaultDeadMaxCount.
	DeadMaxCount int
	// IdempotencyWindow is how long an idempotency key is remembered
	// after its job is no longer kept (past ResultMaxCount or its
	// retention): a repeat within it answers the job's id and final
	// state instead of sending again. Default DefaultIdempotencyWindow.
	IdempotencyWindow time.Duration
	// PushbackDefault is how long a 429 that does not say when to retry
	// blocks the upstream. Default DefaultPushback.
	PushbackDefault time.Duration
	// SensitiveHeaders are patterns of request header names (see
	// MatchHeader) that, like Authorization, Cookie and
	// Proxy-Authorization always, are secrets: kept out of the stored job
	// and gone from Redis once it finishes (see SensitiveHeader).
	SensitiveHeaders []string
	// StoreResponse is what of an answer is kept with the job: StoreFull
	// (the default), StoreHeaders or StoreStatus. Of an HTTP answer only
	// allowed headers are kept (StoreResponseHeaders; never Set-Cookie).
	StoreResponse string
	// StoreResponseHeaders are patterns of response header names (see
	// MatchHeader) kept with an HTTP answer, replacing the default list
	// (content type, rate-limit and request-id headers). Empty means the
	// default. Set-Cookie is never kept, whatever they say.
	StoreResponseHeaders []string
	// PartitionLimits are leaky buckets that each partition (a job's
	// Partition: a recipient domain, customer or credential id) gets on
	// its own, in addition to Limits on the whole upstream. Empty means
	// partitions are not limited, except those in PartitionOverrides.
	PartitionLimits []leaky.Limit
	// PartitionOverrides gives the named partitions their own limits
	// instead of PartitionLimits (gmail.com gets more than other domains).
	PartitionOverrides map[string][]leaky.Limit
	// Fairness says how the upstream's send slots are shared among jobs
	// waiting for them. Default {By: FairByTenant}, every weight 1.
	Fairness Fairness
	// Settle says, per cost ("tokens"), where the upstream's answer gives
	// the amount a job really used. The job's cost is reserved as an
	// estimate and settled to that amount once the answer arrives. Each key
	// is a cost some limit or partition limit counts.
	Settle map[string]Settle
	// Proxy is how calls reach the upstream through shaper's proxy.
	Proxy Proxy
}

// Fairness is how an upstream's send slots are shared when it is the
// bottleneck: among tenants, among partitions, or first come first served.
type Fairness struct {
	// By is FairByTenant (the default), FairByPartition or FairByNone.
	By string
	// Weights give a tenant's (or, by partition, a partition's) share
	// relative to the others; absent names weigh 1. A weight of 3 gets
	// three slots for every one of a name of weight 1 while both wait.
	Weights map[string]int
}

// What Fairness.By shares send slots among.
const (
	// FairByTenant shares slots among the tenants of the API keys that
	// enqueued the waiting jobs.
	FairByTenant = "tenant"
	// FairByPartition shares slots among the waiting jobs' partitions.
	FairByPartition = "partition"
	// FairByNone sends in queue order, lanes weighed as configured.
	FairByNone = "none"
)

// MaxPartitionBytes is the longest a job's partition may be, in bytes.
const MaxPartitionBytes = 200

// CheckPartition says what is wrong with a partition value, if anything:
// it must be 1 to MaxPartitionBytes bytes of valid UTF-8 with no control
// characters. Partitions are compared byte for byte ("Example.org" and
// "example.org" are two partitions). The empty string is refused here;
// a job without a partition simply has none.
func CheckPartition(p string) error {
	switch {
	case p == "":
		return errors.New("must not be empty")
	case len(p) > MaxPartitionBytes:
		return fmt.Errorf("is %d bytes: must be at most %d", len(p), MaxPartitionBytes)
	case !utf8.ValidString(p):
		return errors.New("is not valid UTF-8")
	}
	if i := strings.IndexFunc(p, unicode.IsControl); i >= 0 {
		r, _ := utf8.DecodeRuneInString(p[i:])
		return fmt.Errorf("holds a control character (%U at byte %d)", r, i)
	}
	return nil
}

// PartitionLimitsFor is the limits a job of the partition is held to on
// top of Limits: its override when there is one, else PartitionLimits.
// It is nil for a job without a partition, and when the upstream limits
// neither partitions in general nor this one.
func (u Upstream) PartitionLimitsFor(partition string) []leaky.Limit {
	if partition == "" {
		return nil
	}
	if l, ok := u.PartitionOverrides[partition]; ok && len(l) > 0 {
		return l
	}
	if len(u.PartitionLimits) == 0 {
		return nil
	}
	return u.PartitionLimits
}

// EveryLimit lists the upstream's limits, then its partition limits, then
// every override's (by partition, sorted): what one guard must suit.
func (u Upstream) EveryLimit() []leaky.Limit {
	out := slices.Clone(u.Limits)
	out = append(out, u.PartitionLimits...)
	for _, p := range slices.Sorted(maps.Keys(u.PartitionOverrides)) {
		out = append(out, u.PartitionOverrides[p]...)
	}
	return out
}

// HasPartitionLimits reports whether any partition is limited on its own.
func (u Upstream) HasPartitionLimits() bool {
	return len(u.PartitionLimits) > 0 || len(u.PartitionOverrides) > 0
}

// Weight is the fairness weight of a tenant or partition (whichever
// Fairness.By shares among): its configured weight, else 1.
func (u Upstream) Weight(key string) int {
	if w := u.Fairness.Weights[key]; w > 0 {
		return w
	}
	return 1
}

// What of an upstream's answer is kept with the job (Upstream.StoreResponse).
const (
	// StoreFull keeps the status, the allowed headers and the body.
	StoreFull = "full"
	// StoreHeaders keeps the status and the allowed headers.
	StoreHeaders = "headers"
	// StoreStatus keeps the status only.
	StoreStatus = "status"
)

// Retry bounds how a job that failed (not one that was rate limited) is
// tried again: exponential backoff with full jitter between the bounds.
type Retry struct {
	// MaxAttempts counts the first attempt too. Default DefaultMaxAttempts.
	MaxAttempts int
	// MinBackoff is the first retry's delay ceiling. Default
	// DefaultMinBackoff.
	MinBackoff time.Duration
	// MaxBackoff caps the delay. Default DefaultMaxBackoff.
	MaxBackoff time.Duration
}

// The defaults of an upstream, and of the processes that serve upstreams.
const (
	DefaultLane              = "default"
	DefaultTimeout           = 30 * time.Second
	DefaultMaxPending        = 100_000
	DefaultMaxAttempts       = 8
	DefaultMinBackoff        = time.Second
	DefaultMaxBackoff        = 5 * time.Minute
	DefaultIdempotencyHeader = "Idempotency-Key"
	DefaultMaxResponseBytes  = 1 << 20
	DefaultResultRetention   = 24 * time.Hour
	DefaultDeadRetention     = 7 * 24 * time.Hour
	DefaultPushback          = time.Second

	// DefaultResultMaxCount and DefaultDeadMaxCount bound the finished
	// jobs kept per upstream: at about 1.2 KB each with a small response,
	// 100,000 is some 120 MB at most, whatever the rate.
	DefaultResultMaxCount = 100_000
	DefaultDeadMaxCount   = 100_000

	// DefaultIdempotencyWindow: a day, as Stripe keeps its keys.
	DefaultIdempotencyWindow = 24 * time.Hour

	// DefaultHorizon is the longest pacing wait a worker books ahead: a
	// job is taken only once its send slot is this close, so a slow or
	// blocked upstream holds no worker, and fair share is decided late.
	DefaultHorizon = 250 * time.Millisecond
	// DefaultPollInterval is the longest a worker leaves an idle upstream
	// unlooked-at: enqueues wake it at once over pub/sub, and whatever it
	// knows comes due (a scheduled job, a parked partition) wakes it on
	// time, so this only bounds the delay after a wake-up that was lost.
	DefaultPollInterval = 2 * time.Minute
	// DefaultShutdownTimeout bounds a graceful stop of a worker or the API.
	DefaultShutdownTimeout = 30 * time.Second
)

// WithDefaults returns u with every zero field that has a default set to
// it.
func (u Upstream) WithDefaults() Upstream {
	if u.NoIdempotencyHeader {
		u.IdempotencyHeader = ""
	} else if u.IdempotencyHeader == "" {
		u.IdempotencyHeader = DefaultIdempotencyHeader
	}
	if u.Guard <= 0 {
		u.Guard = leaky.DefaultGuardFor(u.EveryLimit())
	}
	u.Timeout = orDuration(u.Timeout, DefaultTimeout)
	if u.MaxPending <= 0 {
		u.MaxPending = DefaultMaxPending
	}
	if u.Retry.MaxAttempts <= 0 {
		u.Retry.MaxAttempts = DefaultMaxAttempts
	}
	u.Retry.MinBackoff = orDuration(u.Retry.MinBackoff, DefaultMinBackoff)
	u.Retry.MaxBackoff = orDuration(u.Retry.MaxBackoff, DefaultMaxBackoff)
	if len(u.Lanes) == 0 {
		u.Lanes = map[string]int{DefaultLane: 1}
	}
	if u.Workers <= 0 {
		u.Workers = DefaultWorkers(u.Concurrency, u.Limits)
	}
	if u.MaxResponseBytes <= 0 {
		u.MaxResponseBytes = DefaultMaxResponseBytes
	}
	u.ResultRetention = orDuration(u.ResultRetention, DefaultResultRetention)
	u.DeadRetention = orDuration(u.DeadRetention, DefaultDeadRetention)
	if u.ResultMaxCount <= 0 {
		u.ResultMaxCount = DefaultResultMaxCount
	}
	if u.DeadMaxCount <= 0 {
		u.DeadMaxCount = DefaultDeadMaxCount
	}
	u.IdempotencyWindow = orDuration(u.IdempotencyWindow, DefaultIdempotencyWindow)
	u.PushbackDefault = orDuration(u.PushbackDefault, DefaultPushback)
	if u.StoreResponse == "" {
		u.StoreResponse = StoreFull
	}
	if u.Fairness.By == "" {
		u.Fairness.By = FairByTenant
	}
	if u.BaseURL != "" {
		u.Proxy.MaxWait = orDuration(u.Proxy.MaxWait, DefaultProxyMaxWait)
	}
	return u
}

func orDuration(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// DefaultWorkers is how many jobs a replica works on at once unless told:
// enough to keep a slot booked every 25ms of the fastest request rate (each
// job spends a round trip or two with Redis and one with the upstream), at
// least the concurrency cap and 10, at most 200.
func DefaultWorkers(concurrency int, limits []leaky.Limit) int {
	n := max(concurrency, 10)
	for _, l := range limits {
		if l.Cost == "" {
			perSecond := float64(l.Rate) / l.Per.Seconds()
			n = max(n, int(math.Ceil(perSecond*0.025)))
		}
	}
	return min(n, 200)
}

// LaneNames lists the upstream's lanes with DefaultLane first and the rest
// sorted; an upstream with no lanes has DefaultLane alone.
func (u Upstream) LaneNames() []string {
	rest := make([]string, 0, len(u.Lanes))
	for l := range u.Lanes {
		if l != DefaultLane {
			rest = append(rest, l)
		}
	}
	sort.Strings(rest)
	return append([]string{DefaultLane}, rest...)
}

// HasLane reports whether lane is one of the upstream's lanes.
func (u Upstream) HasLane(lane string) bool {
	return slices.Contains(u.LaneNames(), lane)
}

// CostNames lists, sorted, the job costs the upstream's limits count
// ("tokens"); requests are always counted and are not listed.
func (u Upstream) CostNames() []string {
	var out []string
	for _, l := range u.Limits {
		if l.Cost != "" && !slices.Contains(out, l.Cost) {
			out = append(out, l.Cost)
		}
	}
	sort.Strings(out)
	return out
}

// WorkerHeaders lists the header names the workers set on every request:
// the configured headers and the idempotency header. Jobs may not set them.
func (u Upstream) WorkerHeaders() []string {
	out := make([]string, 0, len(u.Headers)+1)
	for h := range u.Headers {
		out = append(out, h)
	}
	if u.IdempotencyHeader != "" && !u.NoIdempotencyHeader {
		out = append(out, u.IdempotencyHeader)
	}
	sort.Strings(out)
	return out
}
