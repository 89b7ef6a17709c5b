package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

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

	// maxBytes bounds api.max_body_bytes (an upstream's bounds are
	// shaper.Upstream.Validate's).
	maxBytes = 1 << 30
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
	k.schedules(c)
	k.callbacks(&c.Callbacks, c.API.Keys)
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
		if (key.Tenant != "" || k.set(p+".tenant")) && !shaper.ValidTenant(key.Tenant) {
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

// upstream checks an upstream as the file wrote it. The rules of an
// upstream are shaper.Upstream.Validate's: this puts its problems at the
// file's paths and lines, and adds what only a file can get wrong (a field
// written empty or 0 where leaving it out means the default, handler: true
// beside HTTP fields, tenants no API key has).
func (k checker) upstream(p, name string, u *Upstream, tenants map[string]bool) {
	if u == nil {
		k.fromShaper(p, shaper.Upstream{Name: name}.Problems().List, skips{}, func(sp shaper.Problem) bool { return len(sp.Path) == 0 })
		k.add(p, "empty (an upstream needs at least base_url and limits)")
		return
	}
	su := u.Shaper()
	su.Name = name
	su.NoIdempotencyHeader = u.IdempotencyHeader == "" && k.set(p+".idempotency_header")
	// What the file's own checks say better, or what could not be
	// decoded: the upstream's problem there is left out.
	skip := skips{under: map[string]bool{}, at: map[string]bool{}}
	switch {
	case u.Handler && u.BaseURL != "":
		k.add(p+".base_url", "an upstream with handler: true makes no HTTP calls (remove base_url, or handler)")
		skip.under[p+".base_url"] = true
	case u.Handler:
	case u.BaseURL == "":
		k.add(p+".base_url", "required (the absolute https:// URL job paths are relative to), unless handler: true")
	}
	if u.Handler && len(u.Headers) > 0 {
		k.add(p+".headers", "an upstream with handler: true makes no HTTP calls (remove headers, or handler)")
	}
	k.limitsWritten(p+".limits", u.Limits, skip)
	pl := p + ".partition_limits"
	if u.PartitionLimits != nil && len(u.PartitionLimits) == 0 && k.set(pl) {
		k.add(pl, "an empty list (leave partition_limits out to limit no partition but those in partition_overrides)")
	}
	k.limitsWritten(pl, u.PartitionLimits, skip)
	po := p + ".partition_overrides"
	if u.PartitionOverrides != nil && len(u.PartitionOverrides) == 0 && k.set(po) {
		k.add(po, "an empty mapping (leave partition_overrides out, or name partitions: {gmail.com: [{rate: 1000, per: 1m}]})")
	}
	for _, name := range sortedKeys(u.PartitionOverrides) {
		op := join(po, name)
		if k.ps.isBroken(op) {
			skip.at[op] = true
		}
		k.limitsWritten(op, u.PartitionOverrides[name], skip)
	}
	k.writtenZero(p+".guard", u.Guard == 0, "0s: must be positive (leave it out for the default %v)", defaultGuard)
	k.writtenZero(p+".timeout", u.Timeout == 0, "0s: must be positive (leave it out for the default %v)", defaultTimeout)
	k.writtenZero(p+".max_pending", u.MaxPending == 0, "0: must be at least 1 (leave it out for the default %d)", defaultMaxPending)
	rp := p + ".retry"
	k.writtenZero(rp+".max_attempts", u.Retry.MaxAttempts == 0, "0: must be at least 1 (leave it out for the default %d)", defaultMaxAttempts)
	k.writtenZero(rp+".min_backoff", u.Retry.MinBackoff == 0, "0s: must be positive (leave it out for the default %v)", defaultMinBackoff)
	k.writtenZero(rp+".max_backoff", u.Retry.MaxBackoff == 0, "0s: must be positive (leave it out for the default %v)", defaultMaxBackoff)
	if k.ps.isBroken(rp) {
		skip.at[rp] = true
	}
	fp := p + ".fairness"
	if u.Fairness.By == "" && k.set(fp+".by") {
		k.add(fp+".by", "empty: want tenant, partition or none (or leave it out for %s)", shaper.FairByTenant)
	}
	if by := u.Fairness.By; (by == "" || by == shaper.FairByTenant) && tenants != nil {
		for _, name := range sortedKeys(u.Fairness.Weights) {
			if !tenants[name] && shaper.ValidTenant(name) {
				k.add(join(fp+".weights", name), "no API key has tenant %q (tenants: %s; by: tenant weighs the tenants of api.keys)", name, strings.Join(sortedKeys(tenants), ", "))
			}
		}
	}
	k.proxy(p, name, u)
	sp := p + ".settle"
	if u.Settle != nil && len(u.Settle) == 0 && k.set(sp) {
		k.add(sp, "an empty mapping (leave settle out, or name a cost: {tokens: {json: /usage/total_tokens}})")
	}
	for _, cost := range sortedKeys(u.Settle) {
		cp := join(sp, cost)
		if !slices.ContainsFunc(su.EveryLimit(), func(l leaky.Limit) bool { return l.Cost == cost }) {
			continue // the upstream's problem
		}
		switch s := u.Settle[cost]; {
		case s.JSON == "" && k.set(cp+".json"):
			k.add(cp+".json", "empty: want a JSON pointer into the answer's body, starting with / (e.g. /usage/total_tokens)")
			skip.at[cp] = true
		case s.Header == "" && k.set(cp+".header"):
			k.add(cp+".header", "empty: want the name of a response header (e.g. X-Tokens-Used)")
			skip.at[cp] = true
		}
	}
	if u.Lanes == nil && k.set(p+".lanes") || u.Lanes != nil && len(u.Lanes) == 0 {
		k.add(p+".lanes", "no lanes (list at least %s: 1, or leave lanes out)", DefaultLane)
	}
	k.writtenZero(p+".max_response_bytes", u.MaxResponseBytes == 0, "0: must be at least 1 (leave it out for the default %d)", defaultMaxResponseBytes)
	k.writtenZero(p+".result_retention", u.ResultRetention == 0, "0s: must be positive (leave it out for the default %v)", defaultResultRetention)
	k.writtenZero(p+".dead_retention", u.DeadRetention == 0, "0s: must be positive (leave it out for the default %v)", defaultDeadRetention)
	k.writtenZero(p+".result_max_count", u.ResultMaxCount == 0, "0: must be at least 1 (leave it out for the default %d)", defaultResultMaxCount)
	k.writtenZero(p+".dead_max_count", u.DeadMaxCount == 0, "0: must be at least 1 (leave it out for the default %d)", defaultDeadMaxCount)
	k.writtenZero(p+".idempotency_window", u.IdempotencyWindow == 0, "0s: must be positive (leave it out for the default %v)", defaultIdemWindow)
	k.writtenZero(p+".pushback_default", u.PushbackDefault == 0, "0s: must be positive (leave it out for the default %v)", defaultPushback)
	if u.Handler && len(u.SensitiveHeaders) > 0 {
		k.add(p+".sensitive_headers", "an upstream with handler: true takes no job headers (remove sensitive_headers, or handler)")
	}
	if u.Handler && len(u.StoreResponseHeaders) > 0 {
		k.add(p+".store_response_headers", "an upstream with handler: true stores its handler's response as the handler returns it (remove store_response_headers, or handler)")
	}
	if u.StoreResponse == "" && k.set(p+".store_response") {
		k.add(p+".store_response", "empty: want full, headers or status (or leave it out for %s)", defaultStoreResponse)
	}
	k.fromShaper(p, su.Problems().List, skip, nil)
}

// skips are the paths whose upstream problems are left out: at a path
// (at) or at and under it (under).
type skips struct{ at, under map[string]bool }

// fromShaper adds an upstream's problems (those keep picks, nil all) at
// their paths under p.
func (k checker) fromShaper(p string, list []shaper.Problem, skip skips, keep func(shaper.Problem) bool) {
	for _, sp := range list {
		if keep != nil && !keep(sp) {
			continue
		}
		path, left := p, false
		for _, e := range sp.Path {
			switch e := e.(type) {
			case int:
				path = index(path, e)
			case string:
				path = join(path, e)
			}
			left = left || skip.under[path]
		}
		if !left && !skip.at[path] {
			k.add(path, "%s", sp.Msg)
		}
	}
}

// writtenZero reports a field the file wrote as 0 (or empty), whose zero
// would otherwise quietly mean its default.
func (k checker) writtenZero(path string, zero bool, format string, def any) {
	if zero && k.set(path) {
		k.add(path, format, def)
	}
}

// limitsWritten reports the limits the file left a rate or per out of;
// those, and limits that could not be decoded, are left out of the
// upstream's problems.
func (k checker) limitsWritten(lp string, ls []Limit, skip skips) {
	for i, l := range ls {
		ip := index(lp, i)
		switch {
		case k.ps.isBroken(ip):
		case l.Rate == 0 && !k.set(ip+".rate"):
			k.add(ip+".rate", "required (the most units in any window of length per)")
		case l.Per == 0 && !k.set(ip+".per"):
			k.add(ip+".per", "required (the window, e.g. 1s or 1m)")
		default:
			continue
		}
		skip.under[ip] = true
	}
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
	c.Callbacks.fillDefaults()
}

func setDefault[T comparable](field *T, def T) {
	var zero T
	if *field == zero {
		*field = def
	}
}
