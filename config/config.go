// Package config reads shaper's YAML config: which Redis to use, how the
// enqueue API admits producers, how workers run, and each upstream's limits.
// Parsing is strict — an unknown key, a wrong type or an impossible value is
// an error naming the field and what is allowed, and every problem in a file
// is reported at once. ${ENV} references in values are expanded after the
// YAML is parsed, so a variable's value is always data, never structure.
// A parsed Config has every default filled in.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"slices"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
)

// DefaultLane is the lane of jobs that name none, and the only lane of an
// upstream whose config lists no lanes.
const DefaultLane = shaper.DefaultLane

// Config is a whole shaper config file. Every zero field of a parsed Config
// has been replaced by the default its documentation gives.
type Config struct {
	Redis Redis `yaml:"redis"`
	API   API   `yaml:"api"`
	// Work configures `shaper work` replicas.
	Work Work `yaml:"work"`
	// Upstreams are the third-party APIs shaper calls, by name. The name is
	// part of queue names and Redis hash tags, so it is restricted to
	// lowercase letters, digits, _ and - (at most 63). At least one.
	Upstreams map[string]*Upstream `yaml:"upstreams"`
	// Schedules are jobs enqueued on a cron, declared here rather than
	// through the API (POST /v1/schedules); see Schedule.
	Schedules []Schedule `yaml:"schedules"`
	// Callbacks configures the signed callbacks to a job's callback_url.
	Callbacks Callbacks `yaml:"callbacks"`

	// file and lines locate fields for problems found after parsing
	// (ResolveKeys).
	file  string
	lines map[string]int
}

// Redis says which Redis holds shaper's queues and limiter state: one of a
// single server (URL), a Redis Cluster (Cluster) or a Sentinel-managed
// primary (Sentinel). With none of them it is redis://127.0.0.1:6379/0.
type Redis struct {
	// URL is redis://[user:password@]host:port/db, rediss:// for TLS, or
	// unix:///path/to/socket. go-redis URL options (?dial_timeout=3s&…) work.
	URL string `yaml:"url"`
	// Cluster is a seed list of host:port addresses of Redis Cluster nodes;
	// one is enough, the client discovers the rest.
	Cluster []string `yaml:"cluster"`
	// Sentinel finds the primary through Redis Sentinel.
	Sentinel Sentinel `yaml:"sentinel"`
	// Username and Password authenticate to the data nodes of a cluster or
	// sentinel setup, or fill in a URL that has no credentials (a password
	// with @ or / in it is awkward to escape inside a URL).
	Username string `yaml:"username"`
	Password string `yaml:"password"`
	// TLS connects to cluster or sentinel-managed nodes over TLS; a URL says
	// so with rediss:// instead.
	TLS bool `yaml:"tls"`
	// DB is the database of a sentinel-managed primary; a URL names it in
	// its path and a cluster has only database 0.
	DB int `yaml:"db"`
	// Prefix starts every Redis key shaper itself owns (limiter state,
	// cancel marks, sensitive headers, drain counters). The jobs themselves
	// are kept in asynq's keys, which do not take it
	// (asynq:{shaper.UPSTREAM}:… for each upstream, and asynq:queues): two
	// deployments sharing one Redis must not give an upstream the same
	// name, whatever their prefixes. Default "shaper".
	Prefix string `yaml:"prefix"`
}

// Sentinel names a primary monitored by Redis Sentinel.
type Sentinel struct {
	// Master is the name the sentinels know the primary by.
	Master string `yaml:"master"`
	// Addrs are host:port addresses of sentinels.
	Addrs []string `yaml:"addrs"`
	// Username and Password authenticate to the sentinels themselves; the
	// data nodes use redis.username and redis.password.
	Username string `yaml:"username"`
	Password string `yaml:"password"`
}

// API configures `shaper serve`.
type API struct {
	// Listen is the HTTP address. Default ":8080".
	Listen string `yaml:"listen"`
	// MaxBodyBytes caps a request body; larger ones get 413. Default 1048576.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// Keys are the producers allowed to enqueue. Their secrets come from
	// the environment (each key's key_env), never from the file.
	Keys      []Key     `yaml:"keys"`
	Admission Admission `yaml:"admission"`
	// ShutdownTimeout is how long a stopping server waits for requests in
	// progress. Default 30s.
	ShutdownTimeout Duration `yaml:"shutdown_timeout"`
}

// Key is one producer's API key as configured.
type Key struct {
	// Name identifies the key in logs and metrics. Required, unique.
	Name string `yaml:"name"`
	// Tenant scopes which jobs the key can see. Default Name.
	Tenant string `yaml:"tenant"`
	// KeyEnv is the environment variable holding the secret. Required,
	// unique.
	KeyEnv string `yaml:"key_env"`
	// Admin keys may also pause and resume upstreams.
	Admin bool `yaml:"admin"`
	// CallbackSecretEnv, when set, is the environment variable holding the
	// secret (whsec_…) that signs the callbacks of this key's jobs, in
	// place of callbacks.secret_env.
	CallbackSecretEnv string `yaml:"callback_secret_env"`
}

// Admission is the token bucket each API key's enqueues pass through.
type Admission struct {
	// Capacity is the burst a key may send at once. Default 100.
	Capacity int64 `yaml:"capacity"`
	// RefillPerSecond is the sustained enqueue rate per key; fractions are
	// allowed. Default 10.
	RefillPerSecond float64 `yaml:"refill_per_second"`
	// OnRedisError is what admission does when Redis cannot answer: allow
	// (the default: admit, fail open), deny, or local (each replica limits
	// on its own).
	OnRedisError shaper.OnRedisError `yaml:"on_redis_error"`
}

// Work configures `shaper work` replicas.
type Work struct {
	// MetricsListen is the address of the worker's /metrics listener.
	// Default ":9091"; an explicit "" in the file turns it off.
	MetricsListen string `yaml:"metrics_listen"`
	// ShutdownTimeout is how long a stopping worker lets jobs in flight
	// finish before handing them back to the queue. Default 30s.
	ShutdownTimeout Duration `yaml:"shutdown_timeout"`
	// Horizon is the longest pacing wait a worker books ahead: a job is
	// taken only once its send slot is this close; until then it waits in
	// Redis and holds no worker. Default 250ms.
	Horizon Duration `yaml:"horizon"`
	// PollInterval is the longest an idle upstream goes unlooked-at (each
	// replica looks at each idle upstream this often, with ±10% jitter:
	// about 13 Redis commands). Enqueues, resumes and blocks wake workers
	// at once over pub/sub, a broken subscription wakes every upstream when
	// it comes back, and a retry written by one replica wakes the others,
	// so this only bounds the delay after a wake-up lost some other way.
	// Default 2m.
	PollInterval Duration `yaml:"poll_interval"`
}

// Upstream is one third-party API and the limits it imposes.
type Upstream struct {
	// Name is the upstream's key under upstreams; filled in by Parse.
	Name string `yaml:"-"`
	// BaseURL is the absolute http(s) URL a job's path is relative to, with
	// no query, fragment or credentials; a trailing / is dropped. Required
	// unless Handler is set.
	BaseURL string `yaml:"base_url"`
	// Handler means jobs are run by a Go function registered for this
	// upstream instead of an HTTP call; BaseURL and Headers must be empty.
	Handler bool `yaml:"handler"`
	// Limits must all allow a job before it is sent; each is a leaky
	// bucket. At least one.
	Limits []Limit `yaml:"limits"`
	// Guard is the slack each limit's spacing leaves for a send to slip
	// (docs/design.md, Pacing). Default 20ms, or a fiftieth of the shortest
	// per among the limits and partition limits if that is smaller. An
	// explicit guard may not exceed a tenth of the shortest per.
	Guard Duration `yaml:"guard"`
	// Concurrency caps jobs in flight across all replicas; 0 is unlimited.
	Concurrency int `yaml:"concurrency"`
	// Timeout bounds one attempt. Default 30s.
	Timeout Duration `yaml:"timeout"`
	// MaxPending bounds the backlog; enqueues beyond it get 503.
	// Default 100000.
	MaxPending int64 `yaml:"max_pending"`
	Retry      Retry `yaml:"retry"`
	// Headers are added to every request by workers only (credentials
	// belong here, through ${ENV}). Names are HTTP tokens; values may not
	// hold line breaks.
	Headers map[string]string `yaml:"headers"`
	// IdempotencyHeader carries the job's idempotency key, the same on
	// every attempt. Default "Idempotency-Key"; an explicit "" in the file
	// sends none.
	IdempotencyHeader string `yaml:"idempotency_header"`
	// noIdempotencyHeader records an explicit "" in the file.
	noIdempotencyHeader bool
	// Lanes are the upstream's queues by name, each with a weight: a lane
	// of weight 3 is picked three times as often as one of weight 1. They
	// split each tenant's share, and must include default, the lane of jobs
	// that name none. Default {default: 1}.
	Lanes map[string]int `yaml:"lanes"`
	// Workers is how many jobs one replica works on at once. Default
	// max(Concurrency, 10, the request rate per second / 40), at most 200.
	Workers int `yaml:"workers"`
	// MaxResponseBytes caps how much of a response body is kept as the
	// job's result. Default 1048576.
	MaxResponseBytes int64 `yaml:"max_response_bytes"`
	// ResultRetention is how long a succeeded job and its result are kept,
	// with its response but not its request's body and headers (nothing
	// reads those again; dead jobs keep them for a retry). Default 24h.
	ResultRetention Duration `yaml:"result_retention"`
	// DeadRetention is how long a job that failed for good is kept.
	// Default 168h.
	DeadRetention Duration `yaml:"dead_retention"`
	// ResultMaxCount is how many succeeded jobs are kept at most, beside
	// ResultRetention; the oldest go first (each finish trims a bounded
	// few, so an excess, say after lowering it, goes over the next
	// finishes). Reading a job that went answers 404 job-expired.
	// Default 100000.
	ResultMaxCount int64 `yaml:"result_max_count"`
	// DeadMaxCount is how many dead and cancelled jobs are kept at most,
	// beside DeadRetention; the oldest go first. Default 100000.
	DeadMaxCount int64 `yaml:"dead_max_count"`
	// IdempotencyWindow is how long, after a finished job is dropped (past
	// either count or its retention), a repeat of its idempotency key still
	// answers its id and final state instead of making a new job; at most
	// 720h. Each such key costs about 85 to 105 B of Redis (at most 120 B)
	// for that long and up to two twenty-fourths of it more: about drain
	// rate × window × 100 B. Changing it keeps the records already made
	// for their own window. Default 24h.
	IdempotencyWindow Duration `yaml:"idempotency_window"`
	// PushbackDefault is the longest pause after 429s that do not say when
	// to retry: the first pauses 25ms, and each one refused right after a
	// pause twice as long, up to this (docs/upstream-answers.md).
	// Default 1s.
	PushbackDefault Duration `yaml:"pushback_default"`
	// SensitiveHeaders are patterns of job request header names that are
	// never stored with the job, as Authorization, Cookie and
	// Proxy-Authorization never are: they wait in a side key until the job
	// finishes. Case-insensitive; "*" stands for any run of characters
	// ("X-*-Token"). Default none beyond those three.
	SensitiveHeaders []string `yaml:"sensitive_headers"`
	// StoreResponse is what of the upstream's answer is kept with the job:
	// "full" (status, allowed headers and body), "headers" (no body) or
	// "status". Default "full".
	StoreResponse string `yaml:"store_response"`
	// StoreResponseHeaders are patterns, as in SensitiveHeaders, of the
	// upstream's response headers kept with a job; given, they replace the
	// default list: the content type, the rate-limit headers (RateLimit*,
	// X-RateLimit-*, Retry-After, Stripe-Rate-Limited-Reason) and the
	// request-id ones (X-Request-Id, Request-Id, Openai-Request-Id,
	// X-Amzn-RequestId, X-Amz-Request-Id). Set-Cookie is never kept,
	// whatever they say (not even by "*"). Not for handler upstreams,
	// whose handler decides what it returns.
	StoreResponseHeaders []string `yaml:"store_response_headers"`
	// PartitionLimits are leaky buckets each partition (a job's
	// partition: a recipient domain, customer or credential id) gets on
	// its own, on top of Limits. Same form as Limits; a cost they count
	// must also be counted by one of Limits, since a job may only carry
	// costs the upstream's limits count. Default none: partitions are not
	// limited, except those in PartitionOverrides.
	PartitionLimits []Limit `yaml:"partition_limits"`
	// PartitionOverrides gives the named partitions their own limits
	// instead of PartitionLimits ({gmail.com: [{rate: 1000, per: 1m}]}).
	// Keys are partition values, 1 to 200 bytes, matched exactly.
	PartitionOverrides map[string][]Limit `yaml:"partition_overrides"`
	// Fairness is how the upstream's send slots are shared while it is the
	// bottleneck. Default by tenant, every weight 1.
	Fairness Fairness `yaml:"fairness"`
	// Settle says, per cost, where the upstream's answer reports what a
	// job really used ({tokens: {json: /usage/total_tokens}}): the job's
	// cost is reserved as an estimate, and the answer's amount replaces it.
	// Each key must be a cost one of the limits or partition limits count.
	// Unused units go back to the limits, an overrun is charged; a missing,
	// negative or non-numeric value leaves the estimate. From an answer of
	// server-sent events (a streamed chat completion) the last event whose
	// data holds the value counts. Default none: the estimate stands.
	Settle map[string]Settle `yaml:"settle"`
	// Proxy is how calls reach the upstream through shaper's proxy (see
	// Proxy). Default: on, waiting up to 30s.
	Proxy *Proxy `yaml:"proxy"`
}

// Settle is where an answer gives the amount of a cost a job used;
// exactly one of JSON and Header.
type Settle struct {
	// JSON is an RFC 6901 JSON pointer into the answer's body, starting
	// with / ("/usage/total_tokens"; ~1 stands for / and ~0 for ~ in a
	// key); it walks objects and arrays. A fraction is rounded up.
	JSON string `yaml:"json"`
	// Header is a response header holding the amount as a whole or
	// decimal number ("X-Tokens-Used").
	Header string `yaml:"header"`
}

// Shaper is the source as the rest of shaper takes it.
func (s Settle) Shaper() shaper.Settle { return shaper.Settle{JSON: s.JSON, Header: s.Header} }

// Fairness is how an upstream's send slots are shared among waiting jobs.
type Fairness struct {
	// By is tenant (the default: the tenants of the API keys that enqueued
	// the waiting jobs), partition (the jobs' partitions) or none (queue
	// order, lanes weighed as configured).
	By string `yaml:"by"`
	// Weights give a tenant's (by: tenant) or partition's (by: partition)
	// share relative to the others, 1 to 1000; absent names weigh 1. With
	// by: tenant and api.keys configured, each name must be a tenant of one
	// of the keys. Not allowed with by: none.
	Weights map[string]int `yaml:"weights"`
}

// Limit is one limit as written in the config; see leaky.Limit for the
// meaning of each field.
type Limit struct {
	// Rate is the most units in any window of length Per. Required.
	Rate int64 `yaml:"rate"`
	// Per is the window. Required, at least 1ms.
	Per Duration `yaml:"per"`
	// Cost names the job cost the limit counts ("tokens"); empty counts
	// requests.
	Cost string `yaml:"cost"`
	// Burst is how many units may go at one instant; 0 spaces sends evenly
	// (for a cost limit, 0 means 25% of Rate, which is also the largest
	// cost one job may carry). Since no window may hold more than Rate, a
	// burst is paid for in the steady rate: after one, sends go at Rate -
	// Burst + 1 per Per (a burst equal to Rate leaves 1 per Per).
	Burst int64 `yaml:"burst"`
	// Adaptive makes Rate a ceiling for an upstream whose real limit is
	// unknown: the fleet lowers the rate it paces at on pushback and probes
	// back up. Only on a request limit (no cost) in limits, not on
	// partition limits.
	Adaptive bool `yaml:"adaptive"`
}

// Leaky is the limit as the pacing limiter takes it.
func (l Limit) Leaky() leaky.Limit {
	return leaky.Limit{Rate: l.Rate, Per: time.Duration(l.Per), Cost: l.Cost, Burst: l.Burst, Adaptive: l.Adaptive}
}

// Retry bounds how a job that failed (not one that was rate limited) is
// tried again: exponential backoff with full jitter between the bounds.
type Retry struct {
	// MaxAttempts counts the first attempt too. Default 8.
	MaxAttempts int `yaml:"max_attempts"`
	// MinBackoff is the first retry's delay ceiling. Default 1s.
	MinBackoff Duration `yaml:"min_backoff"`
	// MaxBackoff caps the delay. Default 5m; at least MinBackoff.
	MaxBackoff Duration `yaml:"max_backoff"`
}

// maxFileBytes keeps a mistaken path (a log, a binary) from being read whole.
const maxFileBytes = 4 << 20

// Load reads and parses the config file at path; see Parse. A nil lookupEnv
// means os.LookupEnv. An invalid config is an *Error with File set.
func Load(path string, lookupEnv func(string) (string, bool)) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if len(data) > maxFileBytes {
		return nil, fmt.Errorf("config %s: larger than %d bytes", path, maxFileBytes)
	}
	c, err := Parse(data, lookupEnv)
	if e, ok := errors.AsType[*Error](err); ok {
		e.File = path
	}
	if c != nil {
		c.file = path
	}
	return c, err
}

// Parse reads a config from YAML, expands ${ENV} references in values with
// lookupEnv (nil means os.LookupEnv), validates it and fills in defaults.
// An invalid config is an *Error listing every problem found.
//
// API key secrets are not looked up here — `shaper work` has no use for
// them; the API server calls ResolveKeys.
func Parse(data []byte, lookupEnv func(string) (string, bool)) (*Config, error) {
	if lookupEnv == nil {
		lookupEnv = os.LookupEnv
	}
	ps := newProblems()
	c := &Config{}
	root, err := parseYAML(data)
	if err != nil {
		if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
			line, msg := atoi(m[1]), m[2]
			if lines := bytes.Split(data, []byte("\n")); line >= 1 && line <= len(lines) && bytes.Contains(lines[line-1], []byte("\t")) {
				msg += " (YAML indents with spaces, not tabs)"
			}
			ps.addAt(line, "", "%s", msg)
		} else {
			ps.add("", "%s", trimYAML(err.Error()))
		}
		return nil, ps.err("")
	}
	if root != nil {
		d := &decoder{env: lookupEnv, ps: ps, budget: maxNodes, expanding: map[*yaml.Node]bool{}}
		d.decode(root, "", reflect.ValueOf(c).Elem())
	}
	check(c, ps)
	if err := ps.err(""); err != nil {
		return nil, err
	}
	applyDefaults(c, ps.lines)
	scheduleDefaults(c)
	c.lines = ps.lines
	return c, nil
}

// parseYAML returns the single document's root node, nil for an empty file.
func parseYAML(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, err
	}
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("yaml: line %d: a second YAML document; a config is one document (remove the ---)", next.Line)
	}
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		return doc.Content[0], nil
	}
	return &doc, nil
}

// Validate checks a Config built or changed in Go. Zero fields count as
// their defaults, so a parsed Config always passes.
func (c *Config) Validate() error {
	ps := newProblems()
	check(c, ps)
	return ps.err("")
}

// UpstreamNames lists the configured upstreams in order.
func (c *Config) UpstreamNames() []string {
	names := make([]string, 0, len(c.Upstreams))
	for n := range c.Upstreams {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Limits returns the named upstream's limits as the pacing limiter takes
// them, nil for an unknown upstream.
func (c *Config) Limits(name string) []leaky.Limit {
	u, ok := c.Upstreams[name]
	if !ok || u == nil {
		return nil
	}
	return u.leakyLimits()
}

func (u *Upstream) leakyLimits() []leaky.Limit { return toLeaky(u.Limits) }

func toLeaky(ls []Limit) []leaky.Limit {
	if ls == nil {
		return nil
	}
	out := make([]leaky.Limit, len(ls))
	for i, l := range ls {
		out[i] = l.Leaky()
	}
	return out
}

func (u *Upstream) leakyOverrides() map[string][]leaky.Limit {
	if u.PartitionOverrides == nil {
		return nil
	}
	out := make(map[string][]leaky.Limit, len(u.PartitionOverrides))
	for p, ls := range u.PartitionOverrides {
		out[p] = toLeaky(ls)
	}
	return out
}

// AllUpstreams returns every configured upstream as the rest of shaper
// takes it, sorted by name.
func (c *Config) AllUpstreams() []shaper.Upstream {
	out := make([]shaper.Upstream, 0, len(c.Upstreams))
	for _, name := range c.UpstreamNames() {
		out = append(out, c.Upstreams[name].Shaper())
	}
	return out
}

// fillDefaults writes into u's unset fields the defaults that
// shaper.Upstream.WithDefaults, their one owner, gives them, so that a
// parsed config shows (and `shaper config validate` prints) what will run.
func (u *Upstream) fillDefaults() {
	d := u.Shaper().WithDefaults()
	setDefault(&u.Guard, Duration(d.Guard))
	setDefault(&u.Timeout, Duration(d.Timeout))
	setDefault(&u.MaxPending, d.MaxPending)
	setDefault(&u.Retry.MaxAttempts, d.Retry.MaxAttempts)
	setDefault(&u.Retry.MinBackoff, Duration(d.Retry.MinBackoff))
	setDefault(&u.Retry.MaxBackoff, Duration(d.Retry.MaxBackoff))
	setDefault(&u.IdempotencyHeader, d.IdempotencyHeader)
	if len(u.Lanes) == 0 {
		u.Lanes = d.Lanes
	}
	setDefault(&u.Workers, d.Workers)
	setDefault(&u.MaxResponseBytes, d.MaxResponseBytes)
	setDefault(&u.ResultRetention, Duration(d.ResultRetention))
	setDefault(&u.DeadRetention, Duration(d.DeadRetention))
	setDefault(&u.ResultMaxCount, int64(d.ResultMaxCount))
	setDefault(&u.DeadMaxCount, int64(d.DeadMaxCount))
	setDefault(&u.IdempotencyWindow, Duration(d.IdempotencyWindow))
	setDefault(&u.PushbackDefault, Duration(d.PushbackDefault))
	setDefault(&u.StoreResponse, d.StoreResponse)
	setDefault(&u.Fairness.By, d.Fairness.By)
}

// Shaper is the upstream as the rest of shaper takes it. In a parsed
// Config every default is already filled in.
func (u *Upstream) Shaper() shaper.Upstream {
	return shaper.Upstream{
		Name:                 u.Name,
		BaseURL:              u.BaseURL,
		Limits:               u.leakyLimits(),
		Guard:                time.Duration(u.Guard),
		Concurrency:          u.Concurrency,
		Timeout:              time.Duration(u.Timeout),
		MaxPending:           u.MaxPending,
		Retry:                shaper.Retry{MaxAttempts: u.Retry.MaxAttempts, MinBackoff: time.Duration(u.Retry.MinBackoff), MaxBackoff: time.Duration(u.Retry.MaxBackoff)},
		Headers:              u.Headers,
		IdempotencyHeader:    u.IdempotencyHeader,
		NoIdempotencyHeader:  u.noIdempotencyHeader,
		Lanes:                u.Lanes,
		Workers:              u.Workers,
		MaxResponseBytes:     u.MaxResponseBytes,
		ResultRetention:      time.Duration(u.ResultRetention),
		DeadRetention:        time.Duration(u.DeadRetention),
		ResultMaxCount:       int(u.ResultMaxCount),
		DeadMaxCount:         int(u.DeadMaxCount),
		IdempotencyWindow:    time.Duration(u.IdempotencyWindow),
		PushbackDefault:      time.Duration(u.PushbackDefault),
		SensitiveHeaders:     u.SensitiveHeaders,
		StoreResponse:        u.StoreResponse,
		StoreResponseHeaders: u.StoreResponseHeaders,
		PartitionLimits:      toLeaky(u.PartitionLimits),
		PartitionOverrides:   u.leakyOverrides(),
		Fairness:             shaper.Fairness{By: u.Fairness.By, Weights: u.Fairness.Weights},
		Settle:               u.shaperSettle(),
		Proxy:                u.shaperProxy(),
	}
}

func (u *Upstream) shaperSettle() map[string]shaper.Settle {
	if u.Settle == nil {
		return nil
	}
	out := make(map[string]shaper.Settle, len(u.Settle))
	for cost, s := range u.Settle {
		out[cost] = s.Shaper()
	}
	return out
}

// Compiled patterns are the package's only variables.
var (
	// plainKey is a mapping key that reads unambiguously in a dotted path.
	plainKey = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
	// keyName is an API key's name (a tenant is shaper.ValidTenant): it appears in logs, metrics
	// and job records.
	keyName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)
	// prefixName may not hold { or }, which would change Redis Cluster
	// hash slots of every key.
	prefixName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$`)
	envName    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	bareVar    = regexp.MustCompile(`^\$[A-Za-z_][A-Za-z0-9_]*`)
	bareNumber = regexp.MustCompile(`^[+-]?[0-9]+(\.[0-9]*)?$`)
	yamlLine   = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)
)
