package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/keyspace"
	"github.com/shaperhq/shaper/leaky"
)

// Defaults, as the field documentation states them. Those of upstreams and
// of the processes that serve them are owned by package shaper; the API's
// are the config's own.
const (
	defaultRedisURL          = "redis://127.0.0.1:6379/0"
	defaultPrefix            = keyspace.DefaultPrefix
	defaultListen            = ":8080"
	defaultMaxBodyBytes      = 1 << 20
	defaultCapacity          = 100
	defaultRefillPerSecond   = 10
	defaultShutdownTimeout   = Duration(shaper.DefaultShutdownTimeout)
	defaultMetricsListen     = ":9091"
	defaultHorizon           = Duration(shaper.DefaultHorizon)
	defaultPollInterval      = Duration(shaper.DefaultPollInterval)
	defaultGuard             = Duration(leaky.DefaultGuard)
	defaultTimeout           = Duration(shaper.DefaultTimeout)
	defaultMaxPending        = shaper.DefaultMaxPending
	defaultMaxAttempts       = shaper.DefaultMaxAttempts
	defaultMinBackoff        = Duration(shaper.DefaultMinBackoff)
	defaultMaxBackoff        = Duration(shaper.DefaultMaxBackoff)
	defaultIdempotencyHeader = shaper.DefaultIdempotencyHeader
	defaultMaxResponseBytes  = shaper.DefaultMaxResponseBytes
	defaultResultRetention   = Duration(shaper.DefaultResultRetention)
	defaultDeadRetention     = Duration(shaper.DefaultDeadRetention)
	defaultResultMaxCount    = shaper.DefaultResultMaxCount
	defaultDeadMaxCount      = shaper.DefaultDeadMaxCount
	defaultIdemWindow        = Duration(shaper.DefaultIdempotencyWindow)
	defaultPushback          = Duration(shaper.DefaultPushback)
	defaultStoreResponse     = shaper.StoreFull

	maxBytes = 1 << 30
	// maxKept bounds result_max_count and dead_max_count: more finished
	// jobs than this per upstream is tens of GB of Redis.
	maxKept = 10_000_000
	// maxIdemWindow bounds idempotency_window: its records cost the
	// drain rate times the window.
	maxIdemWindow = Duration(30 * 24 * time.Hour)
)

// checker validates a decoded Config into the problems collected while
// decoding it. A field counts as written when decoding recorded its line;
// a Config built in Go has none, so its zero fields are simply defaults.
type checker struct{ ps *problems }

func (k checker) set(path string) bool {
	_, ok := k.ps.lines[path]
	return ok
}

// add reports a problem unless the value could not be decoded at all, in
// which case the decoding problem already says everything.
func (k checker) add(path, format string, args ...any) {
	for p := path; p != ""; p = parent(p) {
		if k.ps.broken[p] {
			return
		}
	}
	k.ps.add(path, format, args...)
}

func check(c *Config, ps *problems) {
	k := checker{ps}
	k.redis(&c.Redis)
	k.api(&c.API)
	k.work(&c.Work)
	if len(c.Upstreams) == 0 {
		k.add("upstreams", "at least one upstream is required (e.g. upstreams: {stripe: {base_url: https://api.stripe.com, limits: [{rate: 100, per: 1s}]}})")
	}
	tenants := keyTenants(c.API.Keys)
	for _, name := range c.UpstreamNames() {
		k.upstream(join("upstreams", name), name, c.Upstreams[name], tenants)
	}
}

// keyTenants is the set of tenants the API keys name, nil when there are
// no keys (a worker's config may leave them out): fairness weights by
// tenant are held to it only when there is something to hold them to.
func keyTenants(keys []Key) map[string]bool {
	if len(keys) == 0 {
		return nil
	}
	out := map[string]bool{}
	for _, key := range keys {
		if key.Tenant != "" {
			out[key.Tenant] = true
		} else if key.Name != "" {
			out[key.Name] = true
		}
	}
	return out
}

// mode is which kind of Redis deployment the config names: "url",
// "cluster", "sentinel", or "" for the default URL.
func (r *Redis) mode() string {
	switch {
	case r.URL != "":
		return "url"
	case len(r.Cluster) > 0:
		return "cluster"
	case r.sentinel():
		return "sentinel"
	}
	return ""
}

func (r *Redis) sentinel() bool {
	s := r.Sentinel
	return s.Master != "" || len(s.Addrs) > 0 || s.Username != "" || s.Password != ""
}

func (k checker) redis(r *Redis) {
	var modes []string
	if r.URL != "" || k.set("redis.url") {
		modes = append(modes, "url")
	}
	if len(r.Cluster) > 0 || k.set("redis.cluster") {
		modes = append(modes, "cluster")
	}
	if r.sentinel() || k.set("redis.sentinel") {
		modes = append(modes, "sentinel")
	}
	if len(modes) > 1 {
		k.add("redis", "%s are both set (use one of url, cluster or sentinel)", strings.Join(modes, " and "))
	}
	mode := ""
	if len(modes) == 1 {
		mode = modes[0]
	}
	switch mode {
	case "url":
		if err := checkRedisURL(r.URL); err != nil {
			k.add("redis.url", "%v", err)
		} else if u, _ := url.Parse(r.URL); u.User != nil {
			if _, has := u.User.Password(); has && r.Password != "" {
				k.add("redis.password", "the url has a password already (give it in one place)")
			}
			if u.User.Username() != "" && r.Username != "" {
				k.add("redis.username", "the url has a username already (give it in one place)")
			}
		}
	case "cluster":
		if len(r.Cluster) == 0 {
			k.add("redis.cluster", "no addresses (list host:port of one or more cluster nodes)")
		}
		for i, a := range r.Cluster {
			k.addr(index("redis.cluster", i), a)
		}
		if r.DB != 0 {
			k.add("redis.db", "Redis Cluster has only database 0")
		}
	case "sentinel":
		if r.Sentinel.Master == "" {
			k.add("redis.sentinel.master", "required (the name the sentinels know the primary by)")
		}
		if len(r.Sentinel.Addrs) == 0 {
			k.add("redis.sentinel.addrs", "at least one sentinel host:port is required")
		}
		for i, a := range r.Sentinel.Addrs {
			k.addr(index("redis.sentinel.addrs", i), a)
		}
	}
	if mode == "url" || mode == "" {
		if r.TLS {
			k.add("redis.tls", "applies to cluster and sentinel (for one server write url: rediss://…)")
		}
		if r.DB != 0 {
			k.add("redis.db", "applies to sentinel (for one server the url's path picks it: redis://host:6379/2)")
		}
	}
	if r.DB < 0 {
		k.add("redis.db", "%d: must not be negative", r.DB)
	}
	if (r.Prefix != "" || k.set("redis.prefix")) && !prefixName.MatchString(r.Prefix) {
		k.add("redis.prefix", "%q: letters, digits and _ . : - only, at most 63, no { } (they would move keys between cluster slots)", r.Prefix)
	}
}

// checkRedisURL says what is wrong with a Redis URL without repeating it,
// since it may hold a password.
func checkRedisURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return errors.New("not a valid URL (want redis://host:6379/0, rediss://… for TLS, or unix:///path)")
	}
	switch u.Scheme {
	case "redis", "rediss":
		if u.Host == "" {
			return errors.New("no host (want redis://host:6379/0)")
		}
	case "unix":
		if u.Path == "" {
			return errors.New("no socket path (want unix:///path/to/redis.sock)")
		}
	default:
		return fmt.Errorf("scheme %q: want redis, rediss or unix", u.Scheme)
	}
	if _, err := redis.ParseURL(s); err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), "redis: "))
	}
	return nil
}

func (k checker) addr(path, a string) {
	host, port, err := net.SplitHostPort(a)
	if err == nil && host != "" && validPort(port, 1) {
		return
	}
	k.add(path, "%q is not host:port (e.g. 10.0.0.5:6379)", a)
}

func validPort(p string, lowest int) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n >= lowest && n <= 65535
}

func (k checker) listen(path, a string) {
	if _, port, err := net.SplitHostPort(a); err == nil && validPort(port, 0) {
		return
	}
	k.add(path, "%q is not an address to listen on (want host:port or :port, e.g. \":8080\")", a)
}

// positive checks a duration whose zero means its default: written as 0
// it is refused rather than quietly replaced.
func (k checker) positive(path string, d, def Duration) {
	switch {
	case d < 0:
		k.add(path, "%v: must be positive", d)
	case d == 0 && k.set(path):
		k.add(path, "0s: must be positive (leave it out for the default %v)", def)
	}
}

// atLeast checks a count whose zero means its default.
func (k checker) atLeast(path string, n, lowest, highest, def int64) {
	switch {
	case n == 0 && k.set(path):
		k.add(path, "0: must be at least %d (leave it out for the default %d)", lowest, def)
	case n != 0 && n < lowest:
		k.add(path, "%d: must be at least %d", n, lowest)
	case n > highest:
		k.add(path, "%d: must be at most %d", n, highest)
	}
}

func (k checker) api(a *API) {
	if a.Listen != "" || k.set("api.listen") {
		k.listen("api.listen", a.Listen)
	}
	k.atLeast("api.max_body_bytes", a.MaxBodyBytes, 1, maxBytes, defaultMaxBodyBytes)
	names := map[string]int{}
	envs := map[string]int{}
	for i, key := range a.Keys {
		p := index("api.keys", i)
		switch {
		case key.Name == "":
			k.add(p+".name", "required (names the key in logs and metrics)")
		case !keyName.MatchString(key.Name):
			k.add(p+".name", "%q: letters, digits and _ . - only, at most 64", key.Name)
		default:
			if j, dup := names[key.Name]; dup {
				k.add(p+".name", "%q is also the name of api.keys[%d] (names must be unique)", key.Name, j)
			} else {
				names[key.Name] = i
			}
		}
		if (key.Tenant != "" || k.set(p+".tenant")) && !keyName.MatchString(key.Tenant) {
			k.add(p+".tenant", "%q: letters, digits and _ . - only, at most 64 (leave it out to use the name)", key.Tenant)
		}
		switch {
		case key.KeyEnv == "":
			k.add(p+".key_env", "required (the environment variable that holds the key; the key itself never goes in the file)")
		case !envName.MatchString(key.KeyEnv):
			k.add(p+".key_env", "%q is not an environment variable name (letters, digits and _, e.g. SHAPER_KEY_BILLING)", key.KeyEnv)
		default:
			if j, dup := envs[key.KeyEnv]; dup {
				k.add(p+".key_env", "%s is also the key_env of api.keys[%d] (each key needs its own secret)", key.KeyEnv, j)
			} else {
				envs[key.KeyEnv] = i
			}
		}
	}
	ad := a.Admission
	k.atLeast("api.admission.capacity", ad.Capacity, 1, 1e9, defaultCapacity)
	switch r := ad.RefillPerSecond; {
	case r < 0:
		k.add("api.admission.refill_per_second", "%v: must be positive", r)
	case r == 0 && k.set("api.admission.refill_per_second"):
		k.add("api.admission.refill_per_second", "0: must be positive (leave it out for the default %d)", defaultRefillPerSecond)
	case r > 1e9:
		k.add("api.admission.refill_per_second", "%v: must be at most 1e9", r)
	}
	if s := ad.OnRedisError.String(); strings.HasPrefix(s, "OnRedisError(") {
		k.add("api.admission.on_redis_error", "%s is not a policy (want allow, deny or local)", s)
	}
	k.positive("api.shutdown_timeout", a.ShutdownTimeout, defaultShutdownTimeout)
}

func (k checker) work(w *Work) {
	if w.MetricsListen != "" {
		k.listen("work.metrics_listen", w.MetricsListen)
	}
	k.positive("work.shutdown_timeout", w.ShutdownTimeout, defaultShutdownTimeout)
	k.positive("work.horizon", w.Horizon, defaultHorizon)
	k.positive("work.poll_interval", w.PollInterval, defaultPollInterval)
}

func (k checker) upstream(p, name string, u *Upstream, tenants map[string]bool) {
	if !upstreamName.MatchString(name) {
		hint := ""
		if lower := strings.ToLower(name); upstreamName.MatchString(lower) {
			hint = fmt.Sprintf("; did you mean %q?", lower)
		}
		k.add(p, "not a valid upstream name (lowercase letters, digits, _ and -, starting with a letter or digit, at most 63: it becomes part of queue names and Redis keys)%s", hint)
	}
	if u == nil {
		k.add(p, "empty (an upstream needs at least base_url and limits)")
		return
	}
	switch {
	case u.Handler && u.BaseURL != "":
		k.add(p+".base_url", "an upstream with handler: true makes no HTTP calls (remove base_url, or handler)")
	case u.Handler:
	case u.BaseURL == "":
		k.add(p+".base_url", "required (the absolute https:// URL job paths are relative to), unless handler: true")
	default:
		if err := checkBaseURL(u.BaseURL); err != nil {
			k.add(p+".base_url", "%v", err)
		}
	}
	if u.Handler && len(u.Headers) > 0 {
		k.add(p+".headers", "an upstream with handler: true makes no HTTP calls (remove headers, or handler)")
	}

	lp := p + ".limits"
	if len(u.Limits) == 0 {
		k.add(lp, "at least one limit is required (e.g. [{rate: 100, per: 1s}])")
	}
	shortest, limitsOK := k.limits(lp, u.Limits, nil)
	pShortest, pOK := k.partitions(p, u)
	if pShortest > 0 && (shortest == 0 || pShortest < shortest) {
		shortest = pShortest
	}
	limitsOK = limitsOK && pOK
	switch g := u.Guard; {
	case g < 0:
		k.add(p+".guard", "%v: must not be negative", g)
	case g == 0 && k.set(p+".guard"):
		k.add(p+".guard", "0s: must be positive (leave it out for the default %v)", defaultGuard)
	case g > 0 && limitsOK && shortest > 0 && time.Duration(g) > shortest/10:
		k.add(p+".guard", "%v: must be at most a tenth of the shortest limit's per (%v)", g, shortest/10)
	}

	switch {
	case u.Concurrency < 0:
		k.add(p+".concurrency", "%d: must be 0 (unlimited) or more", u.Concurrency)
	case u.Concurrency > 1_000_000:
		k.add(p+".concurrency", "%d: must be at most 1000000 (0 is unlimited)", u.Concurrency)
	}
	k.positive(p+".timeout", u.Timeout, defaultTimeout)
	k.atLeast(p+".max_pending", u.MaxPending, 1, 1e12, defaultMaxPending)

	rp := p + ".retry"
	k.atLeast(rp+".max_attempts", int64(u.Retry.MaxAttempts), 1, 10_000, defaultMaxAttempts)
	k.positive(rp+".min_backoff", u.Retry.MinBackoff, defaultMinBackoff)
	k.positive(rp+".max_backoff", u.Retry.MaxBackoff, defaultMaxBackoff)
	lo, hi := or(u.Retry.MinBackoff, defaultMinBackoff), or(u.Retry.MaxBackoff, defaultMaxBackoff)
	if lo > 0 && hi > 0 && lo > hi && !k.ps.isBroken(rp) {
		k.add(rp, "min_backoff %v is above max_backoff %v%s", lo, hi, defaultNote(u.Retry.MaxBackoff == 0))
	}

	k.fairness(p, u.Fairness, tenants)
	k.headers(p, u)
	k.settle(p, u)

	switch {
	case u.Lanes == nil && k.set(p+".lanes"), u.Lanes != nil && len(u.Lanes) == 0:
		k.add(p+".lanes", "no lanes (list at least %s: 1, or leave lanes out)", DefaultLane)
	case u.Lanes != nil:
		if _, ok := u.Lanes[DefaultLane]; !ok {
			k.add(p+".lanes", "must include %q, the lane of jobs that name none", DefaultLane)
		}
		for _, lane := range sortedKeys(u.Lanes) {
			lpath := join(p+".lanes", lane)
			if !upstreamName.MatchString(lane) {
				k.add(lpath, "not a valid lane name (lowercase letters, digits, _ and -, at most 63)")
			}
			if w := u.Lanes[lane]; w < 1 || w > 1000 {
				k.add(lpath, "weight %d: must be 1 to 1000", w)
			}
		}
	}

	switch {
	case u.Workers < 0:
		k.add(p+".workers", "%d: must be 0 (automatic) or more", u.Workers)
	case u.Workers > 10_000:
		k.add(p+".workers", "%d: must be at most 10000", u.Workers)
	}
	k.atLeast(p+".max_response_bytes", u.MaxResponseBytes, 1, maxBytes, defaultMaxResponseBytes)
	k.positive(p+".result_retention", u.ResultRetention, defaultResultRetention)
	k.positive(p+".dead_retention", u.DeadRetention, defaultDeadRetention)
	k.atLeast(p+".result_max_count", u.ResultMaxCount, 1, maxKept, defaultResultMaxCount)
	k.atLeast(p+".dead_max_count", u.DeadMaxCount, 1, maxKept, defaultDeadMaxCount)
	k.positive(p+".idempotency_window", u.IdempotencyWindow, defaultIdemWindow)
	if u.IdempotencyWindow > maxIdemWindow {
		k.add(p+".idempotency_window", "%v: must be at most %v", u.IdempotencyWindow, maxIdemWindow)
	}
	k.positive(p+".pushback_default", u.PushbackDefault, defaultPushback)

	if u.Handler && len(u.SensitiveHeaders) > 0 {
		k.add(p+".sensitive_headers", "an upstream with handler: true takes no job headers (remove sensitive_headers, or handler)")
	}
	for i, pat := range u.SensitiveHeaders {
		if err := shaper.ValidHeaderPattern(pat); err != nil {
			k.add(index(p+".sensitive_headers", i), "%v", err)
		}
	}
	if u.Handler && len(u.StoreResponseHeaders) > 0 {
		k.add(p+".store_response_headers", "an upstream with handler: true stores its handler's response as the handler returns it (remove store_response_headers, or handler)")
	}
	for i, pat := range u.StoreResponseHeaders {
		if err := shaper.ValidHeaderPattern(pat); err != nil {
			k.add(index(p+".store_response_headers", i), "%v", err)
		}
	}
	switch u.StoreResponse {
	case "full", "headers", "status":
	case "":
		if k.set(p + ".store_response") {
			k.add(p+".store_response", "empty: want full, headers or status (or leave it out for %s)", defaultStoreResponse)
		}
	default:
		k.add(p+".store_response", "%q: want full (status, headers and body), headers (no body) or status", u.StoreResponse)
	}
}

// limits checks a list of limits as leaky.Limit.Validate does, and
// returns the shortest per among them and whether every one is valid. A
// cost a limit counts must be in costs, unless costs is nil.
func (k checker) limits(lp string, ls []Limit, costs []string) (shortest time.Duration, ok bool) {
	ok = true
	for i, l := range ls {
		ip := index(lp, i)
		if k.ps.isBroken(ip) {
			ok = false
			continue
		}
		switch {
		case l.Rate == 0 && !k.set(ip+".rate"):
			k.add(ip+".rate", "required (the most units in any window of length per)")
		case l.Per == 0 && !k.set(ip+".per"):
			k.add(ip+".per", "required (the window, e.g. 1s or 1m)")
		default:
			if err := l.Leaky().Validate(); err != nil {
				k.add(ip, "%v", err)
				break
			}
			if l.Adaptive && costs != nil {
				k.add(ip+".adaptive", "only the upstream's own limits may be adaptive, not partition limits (remove adaptive here; put an adaptive limit in limits)")
				break
			}
			if l.Adaptive && l.Cost != "" {
				k.add(ip+".adaptive", "only request limits may be adaptive, and this one counts %s (remove adaptive, or cost)", l.Cost)
				break
			}
			if costs != nil && l.Cost != "" && !slices.Contains(costs, l.Cost) {
				counted := "requests only"
				if len(costs) > 0 {
					counted = strings.Join(costs, ", ")
				}
				k.add(ip+".cost", "%q is counted by none of the upstream's limits, and a job may only carry costs they count (they count: %s; add a limit with cost: %s to limits)", l.Cost, counted, l.Cost)
				break
			}
			if shortest == 0 || time.Duration(l.Per) < shortest {
				shortest = time.Duration(l.Per)
			}
			continue
		}
		ok = false
	}
	return shortest, ok
}

// partitions checks partition_limits and partition_overrides, and returns
// the shortest per among them and whether every limit is valid.
func (k checker) partitions(p string, u *Upstream) (shortest time.Duration, ok bool) {
	costs := []string{}
	for _, l := range u.Limits {
		if l.Cost != "" && !slices.Contains(costs, l.Cost) {
			costs = append(costs, l.Cost)
		}
	}
	slices.Sort(costs)
	shorter := func(d time.Duration) {
		if d > 0 && (shortest == 0 || d < shortest) {
			shortest = d
		}
	}

	pl := p + ".partition_limits"
	if u.PartitionLimits != nil && len(u.PartitionLimits) == 0 && k.set(pl) {
		k.add(pl, "an empty list (leave partition_limits out to limit no partition but those in partition_overrides)")
	}
	d, ok := k.limits(pl, u.PartitionLimits, costs)
	shorter(d)

	po := p + ".partition_overrides"
	if u.PartitionOverrides != nil && len(u.PartitionOverrides) == 0 && k.set(po) {
		k.add(po, "an empty mapping (leave partition_overrides out, or name partitions: {gmail.com: [{rate: 1000, per: 1m}]})")
	}
	for _, name := range sortedKeys(u.PartitionOverrides) {
		op := join(po, name)
		if err := shaper.CheckPartition(name); err != nil {
			k.add(op, "not a valid partition: %v", err)
		}
		ls := u.PartitionOverrides[name]
		if len(ls) == 0 && !k.ps.isBroken(op) {
			k.add(op, "no limits (an override replaces partition_limits for this partition; list at least one, e.g. [{rate: 1000, per: 1m}])")
			continue
		}
		d, lok := k.limits(op, ls, costs)
		shorter(d)
		ok = ok && lok
	}
	return shortest, ok
}

// settle checks where the upstream's answers give the costs jobs used:
// each key a cost some limit counts, each source exactly one valid json
// pointer or header name.
func (k checker) settle(p string, u *Upstream) {
	sp := p + ".settle"
	if u.Settle != nil && len(u.Settle) == 0 && k.set(sp) {
		k.add(sp, "an empty mapping (leave settle out, or name a cost: {tokens: {json: /usage/total_tokens}})")
	}
	if len(u.Settle) == 0 {
		return
	}
	counted := []string{}
	for _, l := range u.Shaper().EveryLimit() {
		if l.Cost != "" && !slices.Contains(counted, l.Cost) {
			counted = append(counted, l.Cost)
		}
	}
	slices.Sort(counted)
	for _, cost := range sortedKeys(u.Settle) {
		cp := join(sp, cost)
		if !slices.Contains(counted, cost) {
			they := "requests only, one per job, which needs no settling"
			if len(counted) > 0 {
				they = strings.Join(counted, ", ")
			}
			k.add(cp, "no limit counts %q, so there is nothing to settle (the limits count: %s)", cost, they)
			continue
		}
		s := u.Settle[cost]
		if s.JSON == "" && k.set(cp+".json") {
			k.add(cp+".json", "empty: want a JSON pointer into the answer's body, starting with / (e.g. /usage/total_tokens)")
			continue
		}
		if s.Header == "" && k.set(cp+".header") {
			k.add(cp+".header", "empty: want the name of a response header (e.g. X-Tokens-Used)")
			continue
		}
		if err := s.Shaper().Validate(); err != nil {
			k.add(cp, "%v", err)
		}
	}
}

// fairness checks how the upstream shares its slots; tenants is nil when
// the config has no API keys to hold tenant weights to.
func (k checker) fairness(p string, f Fairness, tenants map[string]bool) {
	fp := p + ".fairness"
	by := f.By
	switch by {
	case shaper.FairByTenant, shaper.FairByPartition, shaper.FairByNone:
	case "":
		if k.set(fp + ".by") {
			k.add(fp+".by", "empty: want tenant, partition or none (or leave it out for %s)", shaper.FairByTenant)
		}
		by = shaper.FairByTenant
	default:
		k.add(fp+".by", "%q is not one of tenant, partition, none", by)
		by = ""
	}
	wp := fp + ".weights"
	if by == shaper.FairByNone && len(f.Weights) > 0 {
		k.add(wp, "by: none shares nothing by weight (remove weights, or set by: tenant or by: partition)")
		return
	}
	for _, name := range sortedKeys(f.Weights) {
		np := join(wp, name)
		if w := f.Weights[name]; w < 1 || w > 1000 {
			k.add(np, "weight %d: must be 1 to 1000", w)
		}
		switch by {
		case shaper.FairByTenant:
			switch {
			case !keyName.MatchString(name):
				k.add(np, "not a tenant name (letters, digits and _ . - only, at most 64; by: tenant weighs tenants)")
			case tenants != nil && !tenants[name]:
				k.add(np, "no API key has tenant %q (tenants: %s; by: tenant weighs the tenants of api.keys)", name, strings.Join(sortedKeys(tenants), ", "))
			}
		case shaper.FairByPartition:
			if err := shaper.CheckPartition(name); err != nil {
				k.add(np, "not a valid partition: %v", err)
			}
		}
	}
}

// managedHeader reports headers the HTTP client sets itself; a configured
// value would conflict with it or frame the request differently.
func managedHeader(name string) bool {
	switch strings.ToLower(name) {
	case "host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer", "keep-alive", "proxy-connection":
		return true
	}
	return false
}

func (k checker) headers(p string, u *Upstream) {
	idem := u.IdempotencyHeader
	if idem != "" {
		if !headerName.MatchString(idem) {
			k.add(p+".idempotency_header", "%q is not a header name (letters, digits and !#$%%&'*+-.^_`|~)", idem)
		} else if managedHeader(idem) {
			k.add(p+".idempotency_header", "%s is managed by the HTTP client", idem)
		}
	} else if !k.set(p + ".idempotency_header") {
		idem = defaultIdempotencyHeader
	}
	seen := map[string]string{}
	for _, name := range sortedKeys(u.Headers) {
		hp := join(p+".headers", name)
		lower := strings.ToLower(name)
		switch {
		case !headerName.MatchString(name):
			k.add(hp, "not a header name (letters, digits and !#$%%&'*+-.^_`|~)")
		case managedHeader(name):
			k.add(hp, "managed by the HTTP client (remove it)")
		case idem != "" && lower == strings.ToLower(idem):
			k.add(hp, "is the idempotency_header, which each job sets (remove it)")
		case seen[lower] != "":
			k.add(hp, "the same header as %q (names are case-insensitive)", seen[lower])
		}
		seen[lower] = name
		// The value is not quoted back: it usually holds a credential.
		if strings.ContainsFunc(u.Headers[name], func(r rune) bool { return (r < 0x20 && r != '\t') || r == 0x7f }) {
			k.add(hp, "value holds a line break or control character (not allowed in a header)")
		}
	}
}

// checkBaseURL wants an absolute http(s) URL that a job's path can be
// appended to; credentials belong in headers, where logs do not print them.
func checkBaseURL(s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return errors.New("not a valid URL (want e.g. https://api.stripe.com)")
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("scheme %q: want an absolute http:// or https:// URL", u.Scheme)
	case u.Opaque != "" || u.Host == "":
		return errors.New("no host (want e.g. https://api.stripe.com)")
	case u.User != nil:
		return errors.New("holds credentials (put them in headers, e.g. Authorization: \"Bearer ${TOKEN}\")")
	case u.RawQuery != "" || u.ForceQuery:
		return errors.New("has a query (a job's path carries its own query)")
	case u.Fragment != "" || strings.Contains(s, "#"):
		return errors.New("has a fragment (#…), which is never sent")
	case u.Port() != "" && !validPort(u.Port(), 1):
		return fmt.Errorf("port %s: want 1 to 65535", u.Port())
	}
	return nil
}

func defaultNote(isDefault bool) string {
	if isDefault {
		return " (the default)"
	}
	return ""
}

func or(d, def Duration) Duration {
	if d == 0 {
		return def
	}
	return d
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// applyDefaults fills in every zero field of a valid config. lines tells
// which fields the file wrote, for the two whose explicit "" means off.
func applyDefaults(c *Config, lines map[string]int) {
	written := func(path string) bool {
		_, ok := lines[path]
		return ok
	}
	r := &c.Redis
	if r.mode() == "" {
		r.URL = defaultRedisURL
	}
	setDefault(&r.Prefix, defaultPrefix)

	a := &c.API
	setDefault(&a.Listen, defaultListen)
	setDefault(&a.MaxBodyBytes, defaultMaxBodyBytes)
	for i := range a.Keys {
		setDefault(&a.Keys[i].Tenant, a.Keys[i].Name)
	}
	setDefault(&a.Admission.Capacity, defaultCapacity)
	setDefault(&a.Admission.RefillPerSecond, defaultRefillPerSecond)
	setDefault(&a.ShutdownTimeout, defaultShutdownTimeout)

	w := &c.Work
	if !written("work.metrics_listen") {
		setDefault(&w.MetricsListen, defaultMetricsListen)
	}
	setDefault(&w.ShutdownTimeout, defaultShutdownTimeout)
	setDefault(&w.Horizon, defaultHorizon)
	setDefault(&w.PollInterval, defaultPollInterval)

	for name, u := range c.Upstreams {
		p := join("upstreams", name)
		u.Name = name
		if u.BaseURL != "" {
			u.BaseURL = strings.TrimRight(u.BaseURL, "/")
		}
		if written(p+".idempotency_header") && u.IdempotencyHeader == "" {
			u.noIdempotencyHeader = true
		}
		u.fillDefaults()
	}
}

func setDefault[T comparable](field *T, def T) {
	var zero T
	if *field == zero {
		*field = def
	}
}
