// Package dispatcher drains shaper's queues: per upstream, workers take a
// job, reserve its send slot in the upstream's leaky bucket for all of its
// limits at once, wait for the slot, send, and read the answer. However many
// replicas run, the upstream sees no more than its limits, and pushback from
// the upstream (429s, exhausted quotas) pauses every replica.
//
// Jobs come from package queue's store, in asynq's key layout, taken by
// shaper's own scripts (internal/jobstore) with each one's slot booked in the
// same step; every upstream has workers of its own, so a slow upstream
// never starves another's. Waiting for the limiter never spends a job's
// attempts: a job whose slot is further off than the horizon is not taken,
// and one met by a pushback (a 429 with a long Retry-After, a pause) is
// handed back to its queue, scheduled for when the upstream expects it.
package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/internal/keyspace"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/metrics"
	"github.com/shaperhq/shaper/queue"
)

// Config configures a Dispatcher; zero values are the documented defaults.
type Config struct {
	// Upstreams are drained; zero fields are their defaults
	// (shaper.Upstream.WithDefaults).
	Upstreams []shaper.Upstream
	// Horizon is the longest pacing wait a worker books ahead; default
	// shaper.DefaultHorizon.
	Horizon time.Duration
	// PollInterval is the longest an idle upstream goes unlooked-at: an
	// enqueue wakes its workers at once, and what they know comes due
	// wakes them on time, so this only bounds a lost wake-up. Default
	// shaper.DefaultPollInterval.
	PollInterval time.Duration
	// ShutdownTimeout bounds the wait for in-flight requests on shutdown;
	// jobs still running then go back to their queue. Default
	// shaper.DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// Prefix starts shaper's own keys; default keyspace.DefaultPrefix.
	Prefix string
	Logger *slog.Logger
	// Metrics receive the dispatcher's measurements; nil discards them.
	Metrics *metrics.Metrics
	// Transport sends HTTP jobs; nil uses a transport sized per upstream.
	Transport http.RoundTripper
}

// Dispatcher drains every configured upstream. Build it with New, register
// Go handlers with Handle, then Run.
type Dispatcher struct {
	rdb   redis.UniversalClient
	cfg   Config
	log   *slog.Logger
	m     *metrics.Metrics
	drain *jobstore.Recorder
	pacer *leaky.Pacer
	ups   map[string]*upstream
	order []string

	stopping    context.Context // cancelled when shutdown begins
	stopWaiting context.CancelFunc
}

type upstream struct {
	cfg     shaper.Upstream
	base    *url.URL
	bucket  *leaky.Bucket
	client  *http.Client
	handler Handler

	space jobstore.Space
	store jobstore.Keys
	taker *jobstore.Taker
	slots chan struct{} // one per worker; a taken job holds one
	wake  chan struct{} // buffered 1: look for work now
	// handoff passes a taken job to a worker goroutine that is idle
	// after its last job (unbuffered: a send succeeds only when one
	// waits); see worker.
	handoff chan jobstore.Taken
	// starved is set while the fetch loop waits for a free worker or a
	// concurrency lease: a job finishing then pokes it.
	starved atomic.Bool
	// idling is set while the fetch loop sleeps (idle): then no take is
	// under way.
	idling atomic.Bool
	// paced: the last take's slots were spread out by the limits. run
	// and takeRTT are how long a job holds its worker and how long a take
	// takes, lately. See gather.
	paced   atomic.Bool
	run     ewma
	takeRTT ewma
	// gatherAll: the loop waits for every worker to be free, not a
	// quarter of them (see gather).
	gatherAll atomic.Bool
	// finish stores outcomes in one script call; ends is the finisher
	// that calls it.
	finish func(ctx context.Context, items []jobstore.Finished) ([]error, error)
	ends   finisher
	bounds jobstore.Bounds // finished jobs kept, and their tombstones

	mu       sync.Mutex
	inFlight map[string]bool // jobs this replica holds, whose leases it extends
	// sweepAt is when each of asynq's finished-job sets (succeeded,
	// dead) next has a job past its retention; zero: none known.
	sweepAt map[jobstore.Zset]time.Time

	// spacing is how far apart the request limits space sends (see
	// classify); heard is what the upstream last stated.
	spacingUs atomic.Int64
	heard     heard
}

// New validates the config and prepares a Dispatcher on rdb (which the
// caller owns and closes after Run returns). Like queue.New, it refuses a
// binary built with an asynq whose Redis layout the store does not know.
func New(rdb redis.UniversalClient, cfg Config) (*Dispatcher, error) {
	if err := jobstore.CheckBuild(); err != nil {
		return nil, err
	}
	if len(cfg.Upstreams) == 0 {
		return nil, errors.New("dispatcher: no upstreams")
	}
	cfg.Horizon = orDefault(cfg.Horizon, shaper.DefaultHorizon)
	cfg.PollInterval = orDefault(cfg.PollInterval, shaper.DefaultPollInterval)
	cfg.ShutdownTimeout = orDefault(cfg.ShutdownTimeout, shaper.DefaultShutdownTimeout)
	cfg.Prefix = keyspace.Prefix(cfg.Prefix)
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	stopping, stop := context.WithCancel(context.Background())
	d := &Dispatcher{
		rdb: rdb, cfg: cfg, log: log, m: metrics.OrDiscard(cfg.Metrics),
		drain: jobstore.NewRecorder(rdb, cfg.Prefix), ups: map[string]*upstream{},
		stopping: stopping, stopWaiting: stop,
	}
	pacer := leaky.New(rdb, leaky.Config{Prefix: cfg.Prefix})
	d.pacer = pacer
	for _, uc := range cfg.Upstreams {
		if _, dup := d.ups[uc.Name]; dup {
			return nil, fmt.Errorf("dispatcher: upstream %s configured twice", uc.Name)
		}
		// The one check of an upstream; what follows relies on it.
		if err := uc.Validate(); err != nil {
			return nil, fmt.Errorf("dispatcher: %w", err)
		}
		u, err := d.newUpstream(pacer, uc)
		if err != nil {
			return nil, fmt.Errorf("dispatcher: upstream %s: %w", uc.Name, err)
		}
		d.ups[uc.Name] = u
		d.order = append(d.order, uc.Name)
		d.m.InitDispatch(uc.Name)
	}
	d.m.InitRedisErrors("pacing", "secrets", "results")
	return d, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

func (d *Dispatcher) newUpstream(pacer *leaky.Pacer, uc shaper.Upstream) (*upstream, error) {
	uc = uc.WithDefaults()
	// A lease lives through the wait for its slot and the request.
	bucket, err := jobstore.Bucket(pacer, uc, uc.Timeout+d.cfg.Horizon+10*time.Second, d.cfg.Horizon)
	if err != nil {
		return nil, err
	}
	u := &upstream{cfg: uc, bucket: bucket, space: jobstore.For(d.cfg.Prefix, uc.Name), bounds: jobstore.For(d.cfg.Prefix, uc.Name).FinishBounds(uc, queue.IdempotentIDPattern),
		store: jobstore.AsynqKeys(jobstore.QueueName(uc.Name)), slots: make(chan struct{}, uc.Workers),
		wake: make(chan struct{}, 1), handoff: make(chan jobstore.Taken), ends: newFinisher(), inFlight: map[string]bool{}, sweepAt: map[jobstore.Zset]time.Time{}}
	u.setSpacing(configuredLimits(u))
	d.setLimitGauges(u, configuredLimits(u))
	u.taker, err = jobstore.NewTaker(d.rdb, u.space, jobstore.TakerConfig{Upstream: uc, Bucket: bucket,
		Lookahead: d.cfg.Horizon, Lease: taskLease, ConcurrencyLease: uc.Timeout + d.cfg.Horizon + 10*time.Second})
	if err != nil {
		return nil, err
	}
	opts := []jobstore.FinishOption{
		jobstore.WakeOnRetry(u.space.SleepKey(), jobstore.WakeChannel(d.cfg.Prefix), uc.Name),
		jobstore.KeepAtMost(u.bounds), jobstore.AnnounceFinal(jobstore.FinalChannel(d.cfg.Prefix)),
		jobstore.Callbacks(u.space.CallbacksDueKey()),
	}
	u.finish = func(ctx context.Context, items []jobstore.Finished) ([]error, error) {
		return jobstore.Finish(ctx, d.rdb, u.store, u.space.CountsKey(), u.space.BacklogKey(), items, opts...)
	}
	if uc.BaseURL != "" {
		// Validate has checked it.
		base, err := url.Parse(uc.BaseURL)
		if err != nil {
			return nil, err
		}
		u.base = base
		transport := d.cfg.Transport
		if transport == nil {
			transport = &http.Transport{
				Proxy:               http.ProxyFromEnvironment,
				DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
				MaxIdleConns:        uc.Workers * 2,
				MaxIdleConnsPerHost: uc.Workers * 2,
				IdleConnTimeout:     90 * time.Second,
				TLSHandshakeTimeout: 10 * time.Second,
				ForceAttemptHTTP2:   true,
			}
		}
		u.client = &http.Client{
			Transport: transport,
			// A redirect is the upstream telling us something is off; the
			// job records it instead of following it blindly.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	return u, nil
}

// Handle registers the Go handler for an upstream configured without a base
// URL. Call it before Run.
func (d *Dispatcher) Handle(upstream string, h Handler) error {
	u, ok := d.ups[upstream]
	if !ok {
		return fmt.Errorf("dispatcher: no upstream %s to handle", upstream)
	}
	if u.base != nil {
		return fmt.Errorf("dispatcher: upstream %s sends HTTP to %s; it takes no handler", upstream, u.base)
	}
	u.handler = h
	return nil
}

// backoff is the delay before attempt n+1 after n failed ones: exponential
// from min, capped at max, with full jitter above min.
func backoff(n int, min, max time.Duration) time.Duration {
	ceiling := min
	for i := 1; i < n && ceiling < max; i++ {
		ceiling *= 2
	}
	if ceiling > max {
		ceiling = max
	}
	if ceiling <= min {
		return min
	}
	return min + rand.N(ceiling-min+1)
}
