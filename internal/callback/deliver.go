package callback

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/metrics"
	"github.com/shaperhq/shaper/queue"
)

// Defaults of Config's zero values.
const (
	DefaultTimeout      = 10 * time.Second
	DefaultPollInterval = 30 * time.Second
	DefaultParallel     = 16
	// MaxResponseBytes is the most of a receiver's answer read (then
	// dropped: nothing of it is stored).
	MaxResponseBytes = 64 << 10
)

// Config configures a Deliverer; zero values are the documented defaults.
type Config struct {
	// Queue reads the jobs whose callbacks are delivered.
	Queue *queue.Queue
	// Upstreams name the upstreams whose jobs' callbacks are delivered.
	Upstreams []string
	// Prefix starts shaper's keys (as the queue's).
	Prefix string
	// AllowedHosts is callbacks.allowed_hosts; a URL whose host is no
	// longer in it fails its attempt.
	AllowedHosts []string
	// Secret is the signing secret of the callbacks of jobs enqueued with
	// the named API key (queue.Job.CallbackKey); nil signs nothing and
	// fails the attempt.
	Secret func(key string) []byte
	// Limits pace deliveries per destination host, across replicas; nil
	// paces none.
	Limits []leaky.Limit
	// MaxAttempts, MinBackoff and MaxBackoff are callbacks.retry.
	MaxAttempts            int
	MinBackoff, MaxBackoff time.Duration
	// View is the body of a delivery: the job as GET /v1/jobs/{id} shows
	// it, marshalled as JSON.
	View func(*queue.Info) ([]byte, error)
	// Timeout bounds one attempt, and the wait for its host's pacing slot
	// another as long; default DefaultTimeout. A claim's lease is both
	// and 5s: a delivery whose replica died is tried again after that.
	Timeout time.Duration
	// PollInterval is the longest each upstream's due set goes unlooked-at
	// (see Run); default DefaultPollInterval.
	PollInterval time.Duration
	// Parallel bounds the deliveries in flight; default DefaultParallel.
	Parallel int
	// Resolver resolves callback hosts; nil is net.DefaultResolver.
	Resolver *net.Resolver
	Metrics  *metrics.Metrics
	Logger   *slog.Logger
}

// Deliverer delivers due callbacks until its Run's context ends.
type Deliverer struct {
	cfg    Config
	rdb    redis.UniversalClient
	client *http.Client
	pacer  *leaky.Pacer
	m      *metrics.Metrics
	log    *slog.Logger

	mu      sync.Mutex
	buckets map[string]*leaky.Bucket
}

// New returns a Deliverer on rdb; the caller owns rdb.
func New(rdb redis.UniversalClient, cfg Config) (*Deliverer, error) {
	switch {
	case cfg.Queue == nil:
		return nil, errors.New("callback: no queue")
	case cfg.View == nil:
		return nil, errors.New("callback: no view")
	case cfg.Secret == nil:
		return nil, errors.New("callback: no secrets")
	case cfg.MaxAttempts <= 0:
		return nil, fmt.Errorf("callback: max attempts %d, want at least 1", cfg.MaxAttempts)
	case cfg.MinBackoff <= 0 || cfg.MaxBackoff < cfg.MinBackoff:
		return nil, fmt.Errorf("callback: backoff %v to %v, want 0 < min <= max", cfg.MinBackoff, cfg.MaxBackoff)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = DefaultParallel
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.OrDiscard(nil)
	}
	d := &Deliverer{cfg: cfg, rdb: rdb, pacer: leaky.New(rdb, leaky.Config{Prefix: cfg.Prefix}),
		m: cfg.Metrics, log: cfg.Logger, buckets: map[string]*leaky.Bucket{}}
	d.client = newClient(cfg.AllowedHosts, cfg.Resolver)
	for _, l := range cfg.Limits {
		if err := l.Validate(); err != nil {
			return nil, fmt.Errorf("callback: limit %v: %w", l, err)
		}
	}
	return d, nil
}

// newClient is the HTTP client of deliveries: it follows no redirect, uses
// no proxy from the environment (which would dial in its stead), and
// refuses, at dial time, an internal address allowed does not name.
func newClient(allowed []string, resolver *net.Resolver) *http.Client {
	dialer := &net.Dialer{
		Timeout:  5 * time.Second,
		Resolver: resolver,
		// Control sees the address actually dialled, after resolution:
		// a name that resolves (or is rebound) to an internal address is
		// caught here, whatever the URL said.
		Control: func(network, address string, _ syscall.RawConn) error {
			return checkDial(address, allowed)
		},
	}
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       30 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ResponseHeaderTimeout: DefaultTimeout,
	}
	return &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// errInternalAddress is a dial refused by checkDial.
var errInternalAddress = errors.New("refused: an internal address not named in callbacks.allowed_hosts")

func checkDial(address string, allowed []string) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("dial %s: %w", address, errInternalAddress)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || internal(ip) && !addressAllowed(address, allowed) {
		return fmt.Errorf("dial %s: %w", address, errInternalAddress)
	}
	return nil
}

// Run delivers until ctx ends, then waits for the deliveries in flight
// (each bounded by Timeout) and returns nil.
//
// It looks at a due set when told a delivery became due there (the scripts
// publish on the set's channel), when the earliest retry or lease it holds
// comes due (each claim says when), and at least every PollInterval, which
// covers a wake-up lost while its subscription reconnected: idle, a replica
// sends each upstream's due set one script per PollInterval.
func (d *Deliverer) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wake := make(chan struct{}, 1)
	notify := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	channels := make([]string, len(d.cfg.Upstreams))
	for i, up := range d.cfg.Upstreams {
		channels[i] = jobstore.For(d.cfg.Prefix, up).CallbacksChannel()
	}
	sub := d.rdb.Subscribe(ctx, channels...)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer sub.Close()
		msgs := sub.Channel()
		for {
			select {
			case <-ctx.Done():
				return
			case _, ok := <-msgs:
				if !ok {
					return
				}
				notify()
			}
		}
	}()
	sem := make(chan struct{}, d.cfg.Parallel)
	for {
		next := d.cfg.PollInterval
		for _, up := range d.cfg.Upstreams {
			if ctx.Err() != nil {
				return nil
			}
			free := cap(sem) - len(sem)
			if free == 0 {
				// A finishing delivery wakes the loop.
				next = d.cfg.PollInterval
				break
			}
			claims, due, err := jobstore.For(d.cfg.Prefix, up).ClaimCallbacksNext(ctx, d.rdb, time.Time{}, d.lease(), free, d.cfg.MaxAttempts)
			if err != nil {
				if ctx.Err() == nil {
					d.m.RedisErrors.WithLabelValues("callback").Inc()
					d.log.Warn("claim callbacks", "upstream", up, "err", err)
				}
				next = min(next, time.Second)
				continue
			}
			if due >= 0 {
				next = min(next, due)
			}
			for _, c := range claims {
				sem <- struct{}{}
				wg.Add(1)
				go func() {
					defer func() { <-sem; notify(); wg.Done() }()
					d.deliver(context.WithoutCancel(ctx), up, c)
				}()
			}
		}
		t := time.NewTimer(max(next, time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-wake:
			t.Stop()
		case <-t.C:
		}
	}
}

// lease is how long a claim is the claimer's: longer than an attempt with
// its pacing wait can take (attempt bounds both), with a margin for
// recording the outcome. A claimer killed mid-delivery holds it that long.
func (d *Deliverer) lease() time.Duration { return d.cfg.Timeout + d.paceBound() + 5*time.Second }

// paceBound is the longest an attempt waits for its host's slot.
func (d *Deliverer) paceBound() time.Duration { return d.cfg.Timeout }

// deliver makes one attempt of claim c and records how it went.
func (d *Deliverer) deliver(ctx context.Context, upstream string, c jobstore.CallbackClaim) {
	err := d.attempt(ctx, c)
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	space := jobstore.For(d.cfg.Prefix, upstream)
	out, rerr := space.CallbackDone(ctx, d.rdb, time.Time{}, c, err == nil, msg, d.backoff(c.Attempt), d.cfg.MaxAttempts)
	if rerr != nil {
		// The claim stays leased and is due again when its lease ends.
		d.m.RedisErrors.WithLabelValues("callback").Inc()
		d.log.Warn("record callback", "job", c.ID, "err", rerr)
		return
	}
	d.m.CallbackDeliveries.WithLabelValues(out.String()).Inc()
	switch out {
	case jobstore.CallbackGaveUp:
		d.log.Warn("callback failed; its retries ran out", "job", c.ID, "attempts", c.Attempt, "err", msg)
	case jobstore.CallbackDueAgain:
		d.log.Info("callback attempt failed", "job", c.ID, "attempt", c.Attempt, "err", msg)
	}
}

// backoff is the wait after a failed attempt: exponential from MinBackoff,
// capped at MaxBackoff, with equal jitter (half fixed, half random), so
// receivers that failed together are not retried together.
func (d *Deliverer) backoff(attempt int) time.Duration {
	b := d.cfg.MinBackoff
	for i := 1; i < attempt && b < d.cfg.MaxBackoff; i++ {
		b *= 2
	}
	b = min(b, d.cfg.MaxBackoff)
	return b/2 + rand.N(b/2+1)
}

// attempt POSTs the job's final view to its callback_url.
func (d *Deliverer) attempt(ctx context.Context, c jobstore.CallbackClaim) error {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout+d.paceBound())
	defer cancel()
	info, err := d.cfg.Queue.Get(ctx, c.ID, "")
	if err != nil {
		return fmt.Errorf("read job: %w", err)
	}
	if err := CheckURL(info.CallbackURL, d.cfg.AllowedHosts); err != nil {
		return fmt.Errorf("callback_url %v", err)
	}
	secret := d.cfg.Secret(info.CallbackKey)
	if len(secret) == 0 {
		return errors.New("no signing secret for this job's API key (callbacks.secret_env)")
	}
	// The body is the job as GET shows it, without the delivery's own
	// bookkeeping, so every attempt sends the same body.
	info.Callback = nil
	body, err := d.cfg.View(info)
	if err != nil {
		return fmt.Errorf("view job: %w", err)
	}
	u, _ := url.Parse(info.CallbackURL)
	if err := d.pace(ctx, strings.ToLower(u.Host)); err != nil {
		return err
	}
	actx, acancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer acancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, info.CallbackURL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	id := WebhookID(c.ID, c.Seq)
	ts := time.Now().Unix()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "shaper-callback")
	req.Header.Set(HeaderID, id)
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
	req.Header.Set(HeaderSignature, Sign(secret, id, ts, body))
	resp, err := d.client.Do(req)
	if err != nil {
		return fmt.Errorf("post: %w", unwrapURLError(err))
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, MaxResponseBytes))
	resp.Body.Close()
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return nil
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		return fmt.Errorf("answered %d (redirects are not followed)", resp.StatusCode)
	}
	return fmt.Errorf("answered %d", resp.StatusCode)
}

// unwrapURLError drops url.Error's repetition of method and URL.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// pace waits for host's next slot under Limits, across replicas.
func (d *Deliverer) pace(ctx context.Context, host string) error {
	if len(d.cfg.Limits) == 0 {
		return nil
	}
	b, err := d.bucket(host)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, d.paceBound())
	defer cancel()
	if _, err := b.Take(pctx, nil); err != nil {
		return fmt.Errorf("paced: no slot for host %s within %v: %w", host, d.paceBound(), err)
	}
	return nil
}

func (d *Deliverer) bucket(host string) (*leaky.Bucket, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if b, ok := d.buckets[host]; ok {
		return b, nil
	}
	b, err := d.pacer.Bucket(BucketName(host), leaky.BucketConfig{Limits: d.cfg.Limits, MaxWait: d.paceBound()})
	if err != nil {
		return nil, err
	}
	d.buckets[host] = b
	return b, nil
}

// BucketName is the leaky bucket that paces callbacks to host (lower
// case, as a URL writes it: host or host:port).
func BucketName(host string) string { return "callback:" + host }
