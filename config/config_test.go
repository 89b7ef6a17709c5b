package config

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
)

func mapEnv(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

func mustParse(t *testing.T, src string, env map[string]string) *Config {
	t.Helper()
	c, err := Parse([]byte(src), mapEnv(env))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("parsed config fails Validate: %v", err)
	}
	return c
}

// TestProductExample parses the config exactly as PRODUCT.md shows it.
func TestProductExample(t *testing.T) {
	data, err := os.ReadFile("testdata/product.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c := mustParse(t, string(data), map[string]string{"STRIPE_SECRET_KEY": "sk_test_123"})

	if got, want := c.Redis.URL, "redis://127.0.0.1:6379/0"; got != want {
		t.Errorf("redis.url: got %q, want %q", got, want)
	}
	wantKeys := []Key{
		{Name: "billing", Tenant: "billing", KeyEnv: "SHAPER_KEY_BILLING"},
		{Name: "ops", Tenant: "ops", KeyEnv: "SHAPER_KEY_OPS", Admin: true},
	}
	if !reflect.DeepEqual(c.API.Keys, wantKeys) {
		t.Errorf("api.keys: got %+v, want %+v", c.API.Keys, wantKeys)
	}
	if got, want := c.API.Admission, (Admission{Capacity: 100, RefillPerSecond: 10, OnRedisError: shaper.FailOpen}); got != want {
		t.Errorf("api.admission: got %+v, want %+v", got, want)
	}
	s := c.Upstreams["stripe"]
	if got, want := s.Headers["Authorization"], "Bearer sk_test_123"; got != want {
		t.Errorf("stripe Authorization: got %q, want %q", got, want)
	}
	if got, want := s.Retry, (Retry{MaxAttempts: 8, MinBackoff: Duration(time.Second), MaxBackoff: Duration(5 * time.Minute)}); got != want {
		t.Errorf("stripe retry: got %+v, want %+v", got, want)
	}
	if s.Concurrency != 20 || s.MaxPending != 100000 || s.Timeout != Duration(30*time.Second) || s.IdempotencyHeader != "Idempotency-Key" {
		t.Errorf("stripe: got %+v", s)
	}
	wantOpenAI := []leaky.Limit{
		{Rate: 5000, Per: time.Minute},
		{Rate: 800000, Per: time.Minute, Cost: "tokens"},
	}
	if got := c.Limits("openai"); !reflect.DeepEqual(got, wantOpenAI) {
		t.Errorf("openai limits: got %v, want %v", got, wantOpenAI)
	}
	if got := c.Limits("nope"); got != nil {
		t.Errorf("unknown upstream limits: got %v, want nil", got)
	}
	mail := c.Upstreams["mail"].Shaper()
	if got, want := mail.PartitionLimitsFor("example.org"), []leaky.Limit{leaky.PerMinute(100)}; !reflect.DeepEqual(got, want) {
		t.Errorf("mail partition limits for example.org: got %v, want %v", got, want)
	}
	if got, want := mail.PartitionLimitsFor("gmail.com"), []leaky.Limit{leaky.PerMinute(1000)}; !reflect.DeepEqual(got, want) {
		t.Errorf("mail partition limits for gmail.com: got %v, want %v", got, want)
	}
	if mail.Fairness.By != shaper.FairByTenant || mail.Weight("billing") != 3 || mail.Weight("ops") != 1 {
		t.Errorf("mail fairness: got %+v, want by tenant, billing 3, ops 1", mail.Fairness)
	}
	if got, want := c.Upstreams["openai"].Shaper().Settle, map[string]shaper.Settle{"tokens": {JSON: "/usage/total_tokens"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("openai settle: got %+v, want %+v", got, want)
	}
	if got, want := c.Limits("vendor"), []leaky.Limit{{Rate: 100, Per: time.Second, Adaptive: true}}; !reflect.DeepEqual(got, want) {
		t.Errorf("vendor limits: got %v, want %v", got, want)
	}
	if got, want := c.UpstreamNames(), []string{"mail", "openai", "stripe", "vendor"}; !reflect.DeepEqual(got, want) {
		t.Errorf("UpstreamNames: got %v, want %v", got, want)
	}
	if c.Upstreams["openai"].Name != "openai" {
		t.Errorf("upstream Name not filled in: %+v", c.Upstreams["openai"])
	}
}

// TestProductExampleNeedsItsVariable: the example's ${STRIPE_SECRET_KEY}
// must be set.
func TestProductExampleNeedsItsVariable(t *testing.T) {
	_, err := Load("testdata/product.yaml", mapEnv(nil))
	want := "testdata/product.yaml:23: upstreams.stripe.headers.Authorization: environment variable STRIPE_SECRET_KEY is not set"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want it to contain %q", err, want)
	}
}

func TestDefaults(t *testing.T) {
	c := mustParse(t, `
api:
  keys: [{name: billing, key_env: K}]
upstreams:
  s:
    base_url: https://api.example.com/v1/
    limits: [{rate: 100, per: 1s}]
  fast:
    base_url: https://fast.example.com
    limits: [{rate: 10, per: 50ms}]
    concurrency: 500
  many:
    base_url: https://many.example.com
    limits: [{rate: 10, per: 1s}]
    concurrency: 50
`, nil)
	want := Config{
		Redis: Redis{URL: "redis://127.0.0.1:6379/0", Prefix: "shaper"},
		API: API{
			Listen:          ":8080",
			MaxBodyBytes:    1 << 20,
			Keys:            []Key{{Name: "billing", Tenant: "billing", KeyEnv: "K"}},
			Admission:       Admission{Capacity: 100, RefillPerSecond: 10, OnRedisError: shaper.FailOpen},
			ShutdownTimeout: Duration(30 * time.Second),
		},
		Work: Work{MetricsListen: ":9091", ShutdownTimeout: Duration(30 * time.Second), Horizon: Duration(250 * time.Millisecond), PollInterval: Duration(2 * time.Minute)},
	}
	upstream := func(name, base string, conc, workers int, guard time.Duration, l Limit) *Upstream {
		return &Upstream{
			Name: name, BaseURL: base, Limits: []Limit{l}, Guard: Duration(guard),
			Concurrency: conc, Timeout: Duration(30 * time.Second), MaxPending: 100000,
			Retry:             Retry{MaxAttempts: 8, MinBackoff: Duration(time.Second), MaxBackoff: Duration(5 * time.Minute)},
			IdempotencyHeader: "Idempotency-Key",
			Lanes:             map[string]int{"default": 1},
			Workers:           workers, MaxResponseBytes: 1 << 20,
			ResultRetention: Duration(24 * time.Hour), DeadRetention: Duration(168 * time.Hour),
			ResultMaxCount: 100000, DeadMaxCount: 100000, IdempotencyWindow: Duration(24 * time.Hour),
			PushbackDefault: Duration(time.Second), StoreResponse: "full",
			Fairness: Fairness{By: "tenant"},
		}
	}
	want.Upstreams = map[string]*Upstream{
		// The trailing / is dropped; workers follow concurrency within 10..200;
		// the guard shrinks to a fiftieth of a short per.
		"s":    upstream("s", "https://api.example.com/v1", 0, 10, 20*time.Millisecond, Limit{Rate: 100, Per: Duration(time.Second)}),
		"fast": upstream("fast", "https://fast.example.com", 500, 200, time.Millisecond, Limit{Rate: 10, Per: Duration(50 * time.Millisecond)}),
		"many": upstream("many", "https://many.example.com", 50, 50, 20*time.Millisecond, Limit{Rate: 10, Per: Duration(time.Second)}),
	}
	want.Callbacks = Callbacks{Limits: []Limit{{Rate: 50, Per: Duration(time.Second)}},
		Retry: Retry{MaxAttempts: 12, MinBackoff: Duration(5 * time.Second), MaxBackoff: Duration(time.Hour)}}
	c.lines, c.file = nil, ""
	if !reflect.DeepEqual(*c, want) {
		gotJSON, _ := json.MarshalIndent(c, "", "  ")
		wantJSON, _ := json.MarshalIndent(want, "", "  ")
		t.Errorf("got\n%s\nwant\n%s", gotJSON, wantJSON)
	}
}

// TestExplicitEmptyTurnsOff: the two fields whose "" means off keep it,
// while leaving them out gives the default.
func TestExplicitEmptyTurnsOff(t *testing.T) {
	c := mustParse(t, `
work: {metrics_listen: ""}
upstreams:
  s: {base_url: "https://a.b", limits: [{rate: 1, per: 1s}], idempotency_header: ""}
`, nil)
	if c.Work.MetricsListen != "" {
		t.Errorf("metrics_listen: got %q, want it off", c.Work.MetricsListen)
	}
	if h := c.Upstreams["s"].IdempotencyHeader; h != "" {
		t.Errorf("idempotency_header: got %q, want none", h)
	}
	if u := c.Upstreams["s"].Shaper().WithDefaults(); !u.NoIdempotencyHeader || u.IdempotencyHeader != "" || len(u.WorkerHeaders()) != 0 {
		t.Errorf("idempotency_header \"\" as the rest of shaper sees it: got %q (none %v), want none", u.IdempotencyHeader, u.NoIdempotencyHeader)
	}
	if u := mustParse(t, oneUpstream, nil).Upstreams["u"].Shaper().WithDefaults(); u.NoIdempotencyHeader || u.IdempotencyHeader != "Idempotency-Key" {
		t.Errorf("idempotency_header left out: got %q (none %v), want Idempotency-Key", u.IdempotencyHeader, u.NoIdempotencyHeader)
	}
	// Null is the same as leaving the key out.
	c = mustParse(t, "work: {metrics_listen: ~}\n"+oneUpstream, nil)
	if c.Work.MetricsListen != ":9091" {
		t.Errorf("metrics_listen: ~: got %q, want the default", c.Work.MetricsListen)
	}
}

func TestEveryFieldRead(t *testing.T) {
	c := mustParse(t, `
redis:
  sentinel: {master: mymaster, addrs: ["s1:26379", "s2:26379"], username: su, password: sp}
  username: u
  password: p
  tls: true
  db: 3
  prefix: "acme:shaper"
api:
  listen: "127.0.0.1:9000"
  max_body_bytes: 2_000_000
  keys: [{name: a.b, tenant: t1, key_env: A, admin: true}]
  admission: {capacity: 5, refill_per_second: 0.5, on_redis_error: local}
  shutdown_timeout: 5s
work: {metrics_listen: "127.0.0.1:9999", shutdown_timeout: 1m, horizon: 500ms, poll_interval: 50ms}
upstreams:
  mail:
    handler: true
    limits: [{rate: 1e3, per: 1h, cost: recipients, burst: 10}]
    guard: 1ms
    concurrency: 3
    timeout: 1m30s
    max_pending: 7
    retry: {max_attempts: 1, min_backoff: 2s, max_backoff: 2s}
    idempotency_header: X-Idem
    lanes: {default: 2, bulk: 1}
    workers: 4
    max_response_bytes: 10
    result_retention: 1h
    dead_retention: 2h
    result_max_count: 5000
    dead_max_count: 700
    idempotency_window: 2h
    pushback_default: 3s
    store_response: headers
    partition_limits: [{rate: 100, per: 1m}, {rate: 500, per: 1h, cost: recipients}]
    partition_overrides: {gmail.com: [{rate: 1000, per: 1m}], "Mixed Case Ltd": [{rate: 5, per: 1s, burst: 2}]}
    fairness: {by: partition, weights: {gmail.com: 5}}
`, nil)
	wantRedis := Redis{
		Sentinel: Sentinel{Master: "mymaster", Addrs: []string{"s1:26379", "s2:26379"}, Username: "su", Password: "sp"},
		Username: "u", Password: "p", TLS: true, DB: 3, Prefix: "acme:shaper",
	}
	if !reflect.DeepEqual(c.Redis, wantRedis) {
		t.Errorf("redis: got %+v, want %+v", c.Redis, wantRedis)
	}
	wantAPI := API{
		Listen: "127.0.0.1:9000", MaxBodyBytes: 2_000_000,
		Keys:            []Key{{Name: "a.b", Tenant: "t1", KeyEnv: "A", Admin: true}},
		Admission:       Admission{Capacity: 5, RefillPerSecond: 0.5, OnRedisError: shaper.FailLocal},
		ShutdownTimeout: Duration(5 * time.Second),
	}
	if !reflect.DeepEqual(c.API, wantAPI) {
		t.Errorf("api: got %+v, want %+v", c.API, wantAPI)
	}
	if want := (Work{MetricsListen: "127.0.0.1:9999", ShutdownTimeout: Duration(time.Minute), Horizon: Duration(500 * time.Millisecond), PollInterval: Duration(50 * time.Millisecond)}); c.Work != want {
		t.Errorf("work: got %+v, want %+v", c.Work, want)
	}
	want := &Upstream{
		Name: "mail", Handler: true,
		Limits: []Limit{{Rate: 1000, Per: Duration(time.Hour), Cost: "recipients", Burst: 10}},
		Guard:  Duration(time.Millisecond), Concurrency: 3, Timeout: Duration(90 * time.Second), MaxPending: 7,
		Retry:             Retry{MaxAttempts: 1, MinBackoff: Duration(2 * time.Second), MaxBackoff: Duration(2 * time.Second)},
		IdempotencyHeader: "X-Idem", Lanes: map[string]int{"default": 2, "bulk": 1}, Workers: 4,
		MaxResponseBytes: 10, ResultRetention: Duration(time.Hour), DeadRetention: Duration(2 * time.Hour),
		ResultMaxCount: 5000, DeadMaxCount: 700, IdempotencyWindow: Duration(2 * time.Hour),
		PushbackDefault: Duration(3 * time.Second), StoreResponse: "headers",
		PartitionLimits: []Limit{{Rate: 100, Per: Duration(time.Minute)}, {Rate: 500, Per: Duration(time.Hour), Cost: "recipients"}},
		PartitionOverrides: map[string][]Limit{
			"gmail.com":      {{Rate: 1000, Per: Duration(time.Minute)}},
			"Mixed Case Ltd": {{Rate: 5, Per: Duration(time.Second), Burst: 2}},
		},
		Fairness: Fairness{By: "partition", Weights: map[string]int{"gmail.com": 5}},
	}
	if got := c.Upstreams["mail"]; !reflect.DeepEqual(got, want) {
		t.Errorf("upstream: got %+v, want %+v", got, want)
	}
	// The rest of shaper sees the same, as leaky limits.
	u := c.Upstreams["mail"].Shaper()
	wantShaper := shaper.Upstream{
		PartitionLimits: []leaky.Limit{leaky.PerMinute(100), {Rate: 500, Per: time.Hour, Cost: "recipients"}},
		PartitionOverrides: map[string][]leaky.Limit{
			"gmail.com":      {leaky.PerMinute(1000)},
			"Mixed Case Ltd": {{Rate: 5, Per: time.Second, Burst: 2}},
		},
		Fairness: shaper.Fairness{By: shaper.FairByPartition, Weights: map[string]int{"gmail.com": 5}},
	}
	if !reflect.DeepEqual(u.PartitionLimits, wantShaper.PartitionLimits) || !reflect.DeepEqual(u.PartitionOverrides, wantShaper.PartitionOverrides) || !reflect.DeepEqual(u.Fairness, wantShaper.Fairness) {
		t.Errorf("Shaper(): got partition limits %v, overrides %v, fairness %+v; want %v, %v, %+v",
			u.PartitionLimits, u.PartitionOverrides, u.Fairness, wantShaper.PartitionLimits, wantShaper.PartitionOverrides, wantShaper.Fairness)
	}
	if got, want := u.PartitionLimitsFor("gmail.com"), wantShaper.PartitionOverrides["gmail.com"]; !reflect.DeepEqual(got, want) {
		t.Errorf("PartitionLimitsFor(gmail.com): got %v, want %v", got, want)
	}
}

func TestExpand(t *testing.T) {
	env := mapEnv(map[string]string{"A": "alpha", "EMPTY": "", "NESTED": "${A}", "DOLLAR": "$$"})
	cases := []struct{ in, want, err string }{
		{in: "plain", want: "plain"},
		{in: "${A}", want: "alpha"},
		{in: "x-${A}-y", want: "x-alpha-y"},
		{in: "${A}${A}", want: "alphaalpha"},
		{in: "${MISSING:-fallback}", want: "fallback"},
		{in: "${EMPTY:-fallback}", want: "fallback"},
		{in: "${A:-fallback}", want: "alpha"},
		{in: "${MISSING:-}", want: ""},
		{in: "${MISSING:-a:b c}", want: "a:b c"},
		{in: "${EMPTY}", want: ""},
		{in: "$$", want: "$"},
		{in: "pa$$word", want: "pa$word"},
		{in: "$${A}", want: "${A}"},
		{in: "$$$${A}", want: "$${A}"},
		{in: "${NESTED}", want: "${A}"}, // values are not expanded again
		{in: "${DOLLAR}", want: "$$"},
		{in: "${MISSING}", err: "environment variable MISSING is not set (set it, or write ${MISSING:-default})"},
		{in: "$A", err: "$A: write ${A} to use the variable, or $$ for a literal $"},
		{in: "cost $5", err: "a lone $"},
		{in: "end$", err: "a lone $"},
		{in: "${A", err: `"${A" has no closing }`},
		{in: "${}", err: `"" is not a variable name`},
		{in: "${1A}", err: `"1A" is not a variable name`},
		{in: "${A-x}", err: `"A-x" is not a variable name`},
		{in: "${A:?x}", err: `"A:?x" is not a variable name`},
	}
	for _, tc := range cases {
		got, err := expand(tc.in, env)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("expand(%q): got error %v, want %q", tc.in, err, tc.want)
		case tc.err == "" && got != tc.want:
			t.Errorf("expand(%q): got %q, want %q", tc.in, got, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("expand(%q): got (%q, %v), want error containing %q", tc.in, got, err, tc.err)
		}
	}
}

func TestEnvInValuesOfEveryType(t *testing.T) {
	c := mustParse(t, `
api:
  max_body_bytes: ${BODY}
  admission: {refill_per_second: "${REFILL:-2.5}", on_redis_error: "${POLICY}"}
upstreams:
  s:
    base_url: ${BASE}
    handler: ${HANDLER:-false}
    limits: [{rate: "${RATE}", per: "${PER:-1m}"}]
`, map[string]string{"BODY": "4096", "POLICY": "deny", "BASE": "https://api.example.com", "RATE": "600"})
	if c.API.MaxBodyBytes != 4096 || c.API.Admission.RefillPerSecond != 2.5 || c.API.Admission.OnRedisError != shaper.FailClosed {
		t.Errorf("api: got %+v", c.API)
	}
	u := c.Upstreams["s"]
	if u.BaseURL != "https://api.example.com" || u.Handler || !reflect.DeepEqual(u.Limits, []Limit{{Rate: 600, Per: Duration(time.Minute)}}) {
		t.Errorf("upstream: got %+v", u)
	}
}

// TestEnvCannotChangeStructure: a variable's value is data even when it
// looks like YAML — a mapping entry, a new document, a flow collection.
func TestEnvCannotChangeStructure(t *testing.T) {
	evil := "x\nupstreams:\n  evil: {base_url: 'https://evil.example', limits: [{rate: 1000000, per: 1s}]}\n"
	env := map[string]string{
		"REDIS_PASSWORD": evil,
		"TOKEN":          "a: b, c: {d: e}",
		"TENANT":         "t: [1]",
	}
	c, err := Parse([]byte(`
redis: {password: "${REDIS_PASSWORD}"}
api:
  keys: [{name: k, key_env: K, tenant: "${TENANT}"}]
upstreams:
  s:
    base_url: https://a.b
    limits: [{rate: 1, per: 1s}]
    headers: {X-Token: "${TOKEN}"}
`), mapEnv(env))
	// The tenant is refused as a tenant, not read as a list.
	if err == nil || !strings.Contains(err.Error(), `api.keys[0].tenant: "t: [1]": letters, digits`) {
		t.Fatalf("got %v, want the tenant refused as a value", err)
	}
	env["TENANT"] = "t1"
	c = mustParse(t, `
redis: {password: "${REDIS_PASSWORD}"}
upstreams:
  s:
    base_url: https://a.b
    limits: [{rate: 1, per: 1s}]
    headers: {X-Token: "${TOKEN}"}
`, env)
	if c.Redis.Password != evil {
		t.Errorf("password: got %q, want %q", c.Redis.Password, evil)
	}
	if got := c.UpstreamNames(); !reflect.DeepEqual(got, []string{"s"}) {
		t.Errorf("upstreams: got %v, want [s]", got)
	}
	if got := c.Upstreams["s"].Headers; !reflect.DeepEqual(got, map[string]string{"X-Token": "a: b, c: {d: e}"}) {
		t.Errorf("headers: got %v", got)
	}
}

// TestKeysAreNotExpanded: ${...} in a key is not a variable.
func TestKeysAreNotExpanded(t *testing.T) {
	_, err := Parse([]byte("upstreams:\n  ${NAME}: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}]}\n"), mapEnv(map[string]string{"NAME": "s"}))
	if err == nil || !strings.Contains(err.Error(), `upstreams["${NAME}"]: not a valid upstream name`) {
		t.Fatalf("got %v, want the key taken literally", err)
	}
}

func TestAnchorsAndMergeKeys(t *testing.T) {
	c := mustParse(t, `
x-paced: &paced
  limits: [{rate: 10, per: 1s}]
  retry: {max_attempts: 3}
  timeout: 5s
x-slow: &slow
  timeout: 60s
  concurrency: 2
upstreams:
  a:
    <<: *paced
    base_url: https://a.example
  b:
    <<: [*paced, *slow]
    base_url: https://b.example
    retry: {max_attempts: 5}
`, nil)
	a, b := c.Upstreams["a"], c.Upstreams["b"]
	if a.Timeout != Duration(5*time.Second) || a.Retry.MaxAttempts != 3 || len(a.Limits) != 1 {
		t.Errorf("a: got %+v", a)
	}
	// Earlier merged mappings win over later ones; written keys over both.
	if b.Timeout != Duration(5*time.Second) || b.Concurrency != 2 || b.Retry.MaxAttempts != 5 {
		t.Errorf("b: got timeout %v, concurrency %d, attempts %d; want 5s, 2, 5", b.Timeout, b.Concurrency, b.Retry.MaxAttempts)
	}
}

func TestAliasToItsOwnAncestor(t *testing.T) {
	_, err := Parse([]byte("upstreams: &u\n  s: *u\n"), mapEnv(nil))
	if err == nil {
		t.Fatal("got a config, want an error")
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "shaper.yaml")
	if err := os.WriteFile(path, []byte("upstreams:\n  s:\n    base_url: https://a.b\n    limits: [{rate: 1, per: 1s}]\n    timout: 1s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path, mapEnv(nil))
	want := "invalid config: " + path + `:5: upstreams.s.timout: unknown key; did you mean "timeout"?`
	if err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
	var cerr *Error
	if !errors.As(err, &cerr) || cerr.File != path {
		t.Errorf("got %#v, want *Error with File %q", err, path)
	}

	_, err = Load(filepath.Join(dir, "missing.yaml"), nil)
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: got %v, want os.ErrNotExist", err)
	}
}

func TestDeployExample(t *testing.T) {
	const path = "../deploy/shaper.example.yaml"
	env := map[string]string{"STRIPE_SECRET_KEY": "sk_test", "OPENAI_API_KEY": "sk-openai"}
	c, err := Load(path, mapEnv(env))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := c.UpstreamNames(); !reflect.DeepEqual(got, []string{"email", "openai", "stripe"}) {
		t.Errorf("upstreams: got %v", got)
	}
	if h := c.Upstreams["stripe"].Headers["Authorization"]; h != "Bearer sk_test" {
		t.Errorf("stripe Authorization: got %q", h)
	}
	if got, want := c.Upstreams["stripe"].Shaper().StoreResponseHeaders, []string{"Content-Type", "Retry-After", "Request-Id", "Idempotent-Replayed", "Stripe-*"}; !reflect.DeepEqual(got, want) {
		t.Errorf("stripe store_response_headers: got %q, want %q", got, want)
	}

	// Every key is shown, commented out or not.
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range allKeys(reflect.TypeFor[Config]()) {
		if !regexp.MustCompile(`(^|[\s{,#])` + key + `:`).Match(data) {
			t.Errorf("%s does not show the key %q", path, key)
		}
	}
}

func allKeys(t reflect.Type) []string {
	var keys []string
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if tag == "" || tag == "-" {
			continue
		}
		keys = append(keys, tag)
		ft := f.Type
		for ft.Kind() == reflect.Map || ft.Kind() == reflect.Slice || ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct {
			keys = append(keys, allKeys(ft)...)
		}
	}
	return keys
}

func TestResolveKeys(t *testing.T) {
	c := mustParse(t, `
api:
  keys:
    - {name: billing, key_env: K_BILLING}
    - {name: ops, tenant: operations, key_env: K_OPS, admin: true}
`+oneUpstream, nil)
	keys, err := c.ResolveKeys(mapEnv(map[string]string{"K_BILLING": "sk_b", "K_OPS": "sk_o"}))
	if err != nil {
		t.Fatal(err)
	}
	want := []APIKey{
		{Name: "billing", Tenant: "billing", Secret: "sk_b"},
		{Name: "ops", Tenant: "operations", Admin: true, Secret: "sk_o"},
	}
	if !reflect.DeepEqual(keys, want) {
		t.Errorf("got %#v, want %#v", keys, want)
	}
	for _, s := range []string{keys[1].String(), keys[1].GoString()} {
		if strings.Contains(s, "sk_o") {
			t.Errorf("%q shows the secret", s)
		}
	}

	cases := []struct {
		env  map[string]string
		want []string
	}{
		{map[string]string{"K_OPS": "sk_o"}, []string{
			`line 4: api.keys[0].key_env: environment variable K_BILLING is not set (it holds the secret of key "billing")`}},
		{map[string]string{"K_BILLING": "", "K_OPS": "sk_o"}, []string{`api.keys[0].key_env: environment variable K_BILLING is empty`}},
		{map[string]string{"K_BILLING": "sk b", "K_OPS": "sk_o"}, []string{`api.keys[0].key_env: the secret in K_BILLING holds whitespace`}},
		{map[string]string{"K_BILLING": "same", "K_OPS": "same"}, []string{`api.keys[1].key_env: K_OPS holds the same secret as api.keys[0]`}},
		{nil, []string{"invalid config (2 problems)", "K_BILLING is not set", "K_OPS is not set"}},
	}
	for _, tc := range cases {
		_, err := c.ResolveKeys(mapEnv(tc.env))
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("env %v: got %v, want it to contain %q", tc.env, err, w)
			}
		}
		if err != nil && strings.Contains(err.Error(), "same") && tc.env["K_OPS"] == "same" && strings.Count(err.Error(), "same secret") != 1 {
			t.Errorf("got %v", err)
		}
	}

	none := mustParse(t, oneUpstream, nil)
	if _, err := none.ResolveKeys(mapEnv(nil)); err == nil || !strings.Contains(err.Error(), "api.keys: no keys configured") {
		t.Errorf("no keys: got %v, want an error", err)
	}
}

func TestDuration(t *testing.T) {
	cases := []struct {
		in   string
		want time.Duration
		err  string
	}{
		{in: "1s", want: time.Second},
		{in: "1m", want: time.Minute},
		{in: "500ms", want: 500 * time.Millisecond},
		{in: "6m0s", want: 6 * time.Minute},
		{in: "1h", want: time.Hour},
		{in: "1h30m", want: 90 * time.Minute},
		{in: "12ms", want: 12 * time.Millisecond},
		{in: "-2s", want: -2 * time.Second},
		{in: "0", err: "0 has no unit"},
		{in: "30", err: "30 has no unit (write 30s, 30ms, 1m, …)"},
		{in: "1.5", err: "1.5 has no unit"},
		{in: "7d", err: "there is no d unit"},
		{in: "", err: `"" is not a duration`},
		{in: "fast", err: `"fast" is not a duration`},
	}
	for _, tc := range cases {
		var d Duration
		err := d.UnmarshalText([]byte(tc.in))
		switch {
		case tc.err == "" && (err != nil || time.Duration(d) != tc.want):
			t.Errorf("%q: got (%v, %v), want %v", tc.in, d, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: got (%v, %v), want error containing %q", tc.in, d, err, tc.err)
		}
	}
	out, err := json.Marshal(struct{ D Duration }{Duration(90 * time.Second)})
	if err != nil || string(out) != `{"D":"1m30s"}` {
		t.Errorf("json: got %s, %v; want {\"D\":\"1m30s\"}", out, err)
	}
}

func TestSummary(t *testing.T) {
	c := mustParse(t, `
redis: {url: "redis://:hunter2@redis.internal:6379/1"}
api:
  keys: [{name: a, key_env: A}, {name: b, key_env: B, admin: true}]
upstreams:
  stripe:
    base_url: https://api.stripe.com
    limits: [{rate: 100, per: 1s}]
    concurrency: 20
    headers: {Authorization: "Bearer ${KEY}"}
  openai:
    base_url: https://api.openai.com
    limits: [{rate: 5000, per: 1m}, {rate: 800000, per: 1m, cost: tokens}]
  mail:
    handler: true
    limits: [{rate: 1, per: 2s}]
  relay:
    base_url: https://relay.example.com
    limits: [{rate: 200, per: 1s}]
    partition_limits: [{rate: 100, per: 1m}]
    partition_overrides: {gmail.com: [{rate: 1000, per: 1m}]}
    fairness: {weights: {b: 3}}
  vip:
    base_url: https://vip.example.com
    limits: [{rate: 10, per: 1s}]
    fairness: {by: none}
  vendor:
    base_url: https://api.vendor.example
    limits: [{rate: 100, per: 1s, adaptive: true}, {rate: 600, per: 1s, cost: tokens}]
    settle: {tokens: {header: X-Tokens-Used}}
`, map[string]string{"KEY": "sk_live_secret"})
	// The memory lines (TestMemoryEstimate checks their figures): one under
	// each upstream, and the total.
	var kept []string
	memory := 0
	for _, line := range strings.SplitAfter(c.Summary(), "\n") {
		if strings.HasPrefix(line, "  Redis memory it can reach") || strings.HasPrefix(line, "Redis memory all upstreams can reach: ") {
			memory++
			continue
		}
		kept = append(kept, line)
	}
	if memory != 7 {
		t.Errorf("got %d memory lines, want one for each of the 6 upstreams and the total", memory)
	}
	got := strings.Join(kept, "")
	want := `redis: redis://:xxxxx@redis.internal:6379/1, keys under shaper
api: listen :8080, 2 keys (1 admin), admission per key: burst 100 then 10/s, on Redis error allow, bodies up to 1048576 bytes
work: metrics on :9091, books pacing waits up to 250ms, shutdown within 30s
upstream mail: Go handler at 1 requests per 2s (drains at 0.99 per 2s); concurrency unlimited, 10 workers per replica, lanes default=1, up to 8 attempts, timeout 30s
upstream openai: https://api.openai.com at 5000 requests per 1m0s (drains at 4998/min); 800000 tokens per 1m0s (burst 200000) (drains at 594059/min); concurrency unlimited, 10 workers per replica, lanes default=1, up to 8 attempts, timeout 30s
upstream relay: https://relay.example.com at 200 requests per 1s (drains at 196.1/s); each partition at 100 requests per 1m0s (drains at 100.0/min); partition "gmail.com" at 1000 requests per 1m0s (drains at 999.7/min); fair share by tenant (b=3, others 1); concurrency unlimited, 10 workers per replica, lanes default=1, up to 8 attempts, timeout 30s
upstream stripe: https://api.stripe.com at 100 requests per 1s (drains at 98.0/s); concurrency 20, 20 workers per replica, lanes default=1, up to 8 attempts, timeout 30s
upstream vendor: https://api.vendor.example at up to 100 requests per 1s, adaptive (drains at up to 98.0/s); 600 tokens per 1s (burst 150) (drains at 442.1/s); tokens settled from header X-Tokens-Used; concurrency unlimited, 10 workers per replica, lanes default=1, up to 8 attempts, timeout 30s
upstream vip: https://vip.example.com at 10 requests per 1s (drains at 9.8/s); no fair share (queue order); concurrency unlimited, 10 workers per replica, lanes default=1, up to 8 attempts, timeout 30s
`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if strings.Contains(got, "hunter2") || strings.Contains(got, "sk_live") {
		t.Error("summary shows a secret")
	}
}

// TestPartitionConfigs: configs of partitions and fairness that are valid,
// and what the rest of shaper sees of them.
func TestPartitionConfigs(t *testing.T) {
	const up = "upstreams: {mail: {base_url: 'https://relay.example.com', limits: [{rate: 200, per: 1s}, {rate: 1e6, per: 1h, cost: recipients}], "
	gmail := []leaky.Limit{leaky.PerMinute(1000)}
	cases := []struct {
		name         string
		yaml         string
		fairness     shaper.Fairness
		limitsFor    map[string][]leaky.Limit // partition → PartitionLimitsFor
		partitionsOn bool                     // HasPartitionLimits
	}{
		{"nothing said", up + "}}",
			shaper.Fairness{By: "tenant"}, map[string][]leaky.Limit{"example.org": nil}, false},
		{"fairness null", up + "fairness: }}",
			shaper.Fairness{By: "tenant"}, nil, false},
		{"overrides without partition_limits limit only those named", up + "partition_overrides: {gmail.com: [{rate: 1000, per: 1m}]}}}",
			shaper.Fairness{By: "tenant"}, map[string][]leaky.Limit{"gmail.com": gmail, "example.org": nil}, true},
		{"a partition limit may count a cost the limits count", up + "partition_limits: [{rate: 100, per: 1m}, {rate: 5000, per: 1h, cost: recipients}]}}",
			shaper.Fairness{By: "tenant"},
			map[string][]leaky.Limit{"example.org": {leaky.PerMinute(100), {Rate: 5000, Per: time.Hour, Cost: "recipients"}}, "": nil}, true},
		{"weights by tenant with no api keys name any tenant", up + "fairness: {weights: {billing: 3, ops: 1000}}}}",
			shaper.Fairness{By: "tenant", Weights: map[string]int{"billing": 3, "ops": 1000}}, nil, false},
		{"weights by tenant name a key's default tenant", "api: {keys: [{name: billing, key_env: A}, {name: r, tenant: reports, key_env: B}]}\n" + up + "fairness: {by: tenant, weights: {billing: 3, reports: 2}}}}",
			shaper.Fairness{By: "tenant", Weights: map[string]int{"billing": 3, "reports": 2}}, nil, false},
		{"weights by partition name partitions, not tenants", "api: {keys: [{name: billing, key_env: A}]}\n" + up + "fairness: {by: partition, weights: {gmail.com: 5, 'Acme Ltd': 1}}}}",
			shaper.Fairness{By: "partition", Weights: map[string]int{"gmail.com": 5, "Acme Ltd": 1}}, nil, false},
		{"by none", up + "fairness: {by: none}}}",
			shaper.Fairness{By: "none"}, nil, false},
		{"by none with empty weights", up + "fairness: {by: none, weights: {}}}}",
			shaper.Fairness{By: "none", Weights: map[string]int{}}, nil, false},
		{"override key at 200 bytes", up + "partition_overrides: {" + strings.Repeat("d", 200) + ": [{rate: 1000, per: 1m}]}}}",
			shaper.Fairness{By: "tenant"}, map[string][]leaky.Limit{strings.Repeat("d", 200): gmail}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u := mustParse(t, tc.yaml, nil).Upstreams["mail"].Shaper()
			if !reflect.DeepEqual(u.Fairness, tc.fairness) {
				t.Errorf("Fairness: got %+v, want %+v", u.Fairness, tc.fairness)
			}
			for p, want := range tc.limitsFor {
				if got := u.PartitionLimitsFor(p); !reflect.DeepEqual(got, want) {
					t.Errorf("PartitionLimitsFor(%q): got %v, want %v", p, got, want)
				}
			}
			if got := u.HasPartitionLimits(); got != tc.partitionsOn {
				t.Errorf("HasPartitionLimits: got %v, want %v", got, tc.partitionsOn)
			}
		})
	}
	// A short partition limit shrinks the default guard as a short limit
	// of the upstream's own would: a fiftieth of its per.
	u := mustParse(t, up+"partition_overrides: {fast.example: [{rate: 5, per: 100ms}]}}}", nil).Upstreams["mail"]
	if want := Duration(2 * time.Millisecond); u.Guard != want {
		t.Errorf("guard with a 100ms partition limit: got %v, want %v", u.Guard, want)
	}
}

// TestAdaptiveAndSettle: adaptive request limits and settled costs reach
// the rest of shaper as written, and a cost limit's default burst lets an
// ordinary job through.
func TestAdaptiveAndSettle(t *testing.T) {
	c := mustParse(t, `
upstreams:
  llm:
    base_url: https://llm.example.com
    limits:
      - {rate: 100, per: 1s, adaptive: true}
      - {rate: 600, per: 1s, cost: tokens}
      - {rate: 1e6, per: 24h, cost: images}
    partition_limits: [{rate: 300, per: 1s, cost: tokens}]
    settle:
      tokens: {json: /usage/total_tokens}
      images: {header: X-Images-Used}
`, nil)
	u := c.Upstreams["llm"].Shaper()
	wantLimits := []leaky.Limit{
		{Rate: 100, Per: time.Second, Adaptive: true},
		{Rate: 600, Per: time.Second, Cost: "tokens"},
		{Rate: 1e6, Per: 24 * time.Hour, Cost: "images"},
	}
	if !reflect.DeepEqual(u.Limits, wantLimits) {
		t.Errorf("limits: got %+v, want %+v", u.Limits, wantLimits)
	}
	wantSettle := map[string]shaper.Settle{"tokens": {JSON: "/usage/total_tokens"}, "images": {Header: "X-Images-Used"}}
	if !reflect.DeepEqual(u.Settle, wantSettle) {
		t.Errorf("settle: got %+v, want %+v", u.Settle, wantSettle)
	}
	// 25% of the rate: a 50-token job fits 600 tokens/s (1% would have
	// been 6), and the partition's 300/s takes 75.
	if got, want := u.Limits[1].Capacity(), int64(150); got != want {
		t.Errorf("tokens limit capacity: got %d, want %d", got, want)
	}
	if got, want := u.PartitionLimits[0].Capacity(), int64(75); got != want {
		t.Errorf("partition tokens limit capacity: got %d, want %d", got, want)
	}
	if got, want := (leaky.Limit{Rate: 3, Per: time.Second, Cost: "tokens"}).Capacity(), int64(1); got != want {
		t.Errorf("a tiny cost limit's capacity: got %d, want %d", got, want)
	}
	// Go-built configs are held to the same rules.
	c.Upstreams["llm"].Settle["bytes"] = Settle{JSON: "/usage/bytes"}
	c.Upstreams["llm"].PartitionLimits[0].Adaptive = true
	err := c.Validate()
	for _, want := range []string{
		`upstreams.llm.settle.bytes: no limit counts "bytes"`,
		`upstreams.llm.partition_limits[0].adaptive: only the upstream's own limits may be adaptive`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: got %v, want it to contain %q", err, want)
		}
	}
}
