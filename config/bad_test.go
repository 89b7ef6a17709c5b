package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// mail starts an upstream for partition cases, which close it with "}}".
const mail = "upstreams: {mail: {base_url: 'https://relay.example.com', limits: [{rate: 200, per: 1s}], "

// oai starts an upstream counting tokens for settle cases, which close it
// with "}}".
const oai = "upstreams: {oai: {base_url: 'https://api.openai.com', limits: [{rate: 5000, per: 1m}, {rate: 800000, per: 1m, cost: tokens}], "

// oneUpstream makes a config valid apart from the part a case is about.
const oneUpstream = `
upstreams:
  u: {base_url: "https://api.example.com", limits: [{rate: 10, per: 1s}]}
`

func TestBadConfigs(t *testing.T) {
	env := mapEnv(map[string]string{"SET": "value", "EMPTY": ""})
	cases := []struct {
		name string
		yaml string
		want []string // each must appear in the error message
	}{
		// Unknown keys, at every level, with suggestions where one is close.
		{"unknown top-level key", "redsi: {url: redis://h:6379/0}" + oneUpstream,
			[]string{`line 1: redsi: unknown key; did you mean "redis"?`}},
		{"unknown redis key", "redis: {url: redis://h:6379/0, pasword: x}" + oneUpstream,
			[]string{`redis.pasword: unknown key; did you mean "password"?`}},
		{"unknown sentinel key", "redis: {sentinel: {master: m, addrs: [h:26379], nodes: [h:1]}}" + oneUpstream,
			[]string{`redis.sentinel.nodes: unknown key (allowed: addrs, master, password, username)`}},
		{"unknown api key", "api: {listen: ':80', max_body: 10}" + oneUpstream,
			[]string{`api.max_body: unknown key`}},
		{"unknown key in an api key", "api: {keys: [{name: a, key_env: A, secret: s}]}" + oneUpstream,
			[]string{`api.keys[0].secret: unknown key`}},
		{"unknown admission key", "api: {admission: {burst: 5}}" + oneUpstream,
			[]string{`api.admission.burst: unknown key`}},
		{"unknown work key", "work: {metrics: ':9091'}" + oneUpstream,
			[]string{`work.metrics: unknown key`}},
		{"removed key", "work:\n  horizon: 250ms\n  max_hold: 10s\n" + oneUpstream,
			[]string{`line 3: work.max_hold: removed in 0.1.0: workers take no job they cannot send within work.horizon, so none is held; delete the line`}},
		{"unknown upstream key", "upstreams: {stripe: {base_url: 'https://a.b', limts: [{rate: 1, per: 1s}]}}",
			[]string{`upstreams.stripe.limts: unknown key; did you mean "limits"?`, `upstreams.stripe.limits: at least one limit is required`}},
		{"camelCase key", "upstreams: {s: {baseURL: 'https://a.b', limits: [{rate: 1, per: 1s}]}}",
			[]string{`upstreams.s.baseURL: unknown key; did you mean "base_url"?`}},
		{"unknown limit key", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s, window: 1s}]}}",
			[]string{`upstreams.s.limits[0].window: unknown key (allowed: adaptive, burst, cost, per, rate)`}},
		{"unknown retry key", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], retry: {attempts: 3}}}",
			[]string{`upstreams.s.retry.attempts: unknown key`}},
		{"key written twice", "upstreams:\n  s:\n    base_url: 'https://a.b'\n    limits: [{rate: 1, per: 1s}]\n    timeout: 1s\n    timeout: 2s\n",
			[]string{`line 6: upstreams.s.timeout: written twice (also on line 5)`}},

		// Wrong types.
		{"top level is a list", "- a\n- b\n", []string{"want a mapping with redis, api, work, upstreams"}},
		{"section is a string", "api: yes" + oneUpstream, []string{`api: want a mapping`, `got "yes"`}},
		{"rate is text", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: many, per: 1s}]}}",
			[]string{`upstreams.s.limits[0].rate: "many" is not a whole number`}},
		{"rate is fractional", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1.5, per: 1s}]}}",
			[]string{`upstreams.s.limits[0].rate: 1.5 is not a whole number`}},
		{"limits is a mapping", "upstreams: {s: {base_url: 'https://a.b', limits: {rate: 1, per: 1s}}}",
			[]string{`upstreams.s.limits: want a list, got a mapping`}},
		{"cluster is a string", "redis: {cluster: 'h:7000'}" + oneUpstream,
			[]string{`redis.cluster: want a list, got "h:7000"`}},
		{"bool is yes", "upstreams: {s: {handler: yes, limits: [{rate: 1, per: 1s}]}}",
			[]string{`upstreams.s.handler: "yes" is not true or false`}},
		{"bare number duration", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], timeout: 30}}",
			[]string{`upstreams.s.timeout: 30 has no unit (write 30s, 30ms, 1m, …)`}},
		{"bare number per", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 60}]}}",
			[]string{`upstreams.s.limits[0].per: 60 has no unit`}},
		{"days", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], dead_retention: 7d}}",
			[]string{`upstreams.s.dead_retention: "7d": there is no d unit (write days in hours, e.g. 168h for 7d)`}},
		{"duration nonsense", "work: {horizon: soon}" + oneUpstream, []string{`work.horizon: "soon" is not a duration`}},
		{"huge integer", "api: {max_body_bytes: 99999999999999999999}" + oneUpstream, []string{`api.max_body_bytes: 99999999999999999999 is too large`}},
		{"refill is text", "api: {admission: {refill_per_second: fast}}" + oneUpstream, []string{`api.admission.refill_per_second: "fast" is not a number`}},

		// Values out of range.
		{"zero rate", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 0, per: 1s}]}}",
			[]string{`upstreams.s.limits[0]: rate 0: must be at least 1`}},
		{"negative rate", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: -5, per: 1s}]}}",
			[]string{`upstreams.s.limits[0]: rate -5: must be at least 1`}},
		{"per below 1ms", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 500us}]}}",
			[]string{`upstreams.s.limits[0]: per 500µs: must be at least 1ms`}},
		{"burst above rate", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 10, per: 1s, burst: 11}]}}",
			[]string{`upstreams.s.limits[0]: burst 11: must not exceed rate 10`}},
		{"bad cost name", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 10, per: 1s, cost: Tokens}]}}",
			[]string{`upstreams.s.limits[0]: cost "Tokens": must be a lowercase name`}},
		{"rate missing", "upstreams: {s: {base_url: 'https://a.b', limits: [{per: 1s}]}}",
			[]string{`upstreams.s.limits[0].rate: required`}},
		{"per missing", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 5}]}}",
			[]string{`upstreams.s.limits[0].per: required (the window, e.g. 1s or 1m)`}},
		{"no limits", "upstreams: {s: {base_url: 'https://a.b'}}",
			[]string{`upstreams.s.limits: at least one limit is required`}},
		{"no upstreams", "api: {listen: ':8080'}", []string{`upstreams: at least one upstream is required`}},
		{"empty file", "", []string{`upstreams: at least one upstream is required`}},
		{"null upstream", "upstreams: {s: }", []string{`upstreams.s: empty (an upstream needs at least base_url and limits)`}},
		{"unknown on_redis_error", "api: {admission: {on_redis_error: maybe}}" + oneUpstream,
			[]string{`api.admission.on_redis_error: "maybe" is not a policy (want allow, deny or local)`}},
		{"zero capacity", "api: {admission: {capacity: 0}}" + oneUpstream,
			[]string{`api.admission.capacity: 0: must be at least 1 (leave it out for the default 100)`}},
		{"negative refill", "api: {admission: {refill_per_second: -1}}" + oneUpstream,
			[]string{`api.admission.refill_per_second: -1: must be positive`}},
		{"zero timeout", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], timeout: 0s}}",
			[]string{`upstreams.s.timeout: 0s: must be positive (leave it out for the default 30s)`}},
		{"negative timeout", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], timeout: -1s}}",
			[]string{`upstreams.s.timeout: -1s: must be positive`}},
		{"negative concurrency", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], concurrency: -1}}",
			[]string{`upstreams.s.concurrency: -1: must be 0 (unlimited) or more`}},
		{"zero max_pending", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], max_pending: 0}}",
			[]string{`upstreams.s.max_pending: 0: must be at least 1`}},
		{"zero max_attempts", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], retry: {max_attempts: 0}}}",
			[]string{`upstreams.s.retry.max_attempts: 0: must be at least 1`}},
		{"min above max backoff", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], retry: {min_backoff: 1m, max_backoff: 10s}}}",
			[]string{`upstreams.s.retry: min_backoff 1m0s is above max_backoff 10s`}},
		{"min above default max backoff", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], retry: {min_backoff: 10m}}}",
			[]string{`upstreams.s.retry: min_backoff 10m0s is above max_backoff 5m0s (the default)`}},
		{"guard above a tenth of per", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}, {rate: 50, per: 100ms}], guard: 20ms}}",
			[]string{`upstreams.s.guard: 20ms: must be at most a tenth of the shortest limit's per (10ms)`}},
		{"negative workers", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], workers: -2}}",
			[]string{`upstreams.s.workers: -2: must be 0 (automatic) or more`}},
		{"zero retention", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], result_retention: 0s}}",
			[]string{`upstreams.s.result_retention: 0s: must be positive`}},
		{"zero result_max_count", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], result_max_count: 0}}",
			[]string{`upstreams.s.result_max_count: 0: must be at least 1 (leave it out for the default 100000)`}},
		{"negative dead_max_count", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], dead_max_count: -5}}",
			[]string{`upstreams.s.dead_max_count: -5: must be at least 1`}},
		{"huge result_max_count", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], result_max_count: 20000000}}",
			[]string{`upstreams.s.result_max_count: 20000000: must be at most 10000000`}},
		{"zero idempotency_window", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], idempotency_window: 0s}}",
			[]string{`upstreams.s.idempotency_window: 0s: must be positive (leave it out for the default 24h0m0s)`}},
		{"negative idempotency_window", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], idempotency_window: -1h}}",
			[]string{`upstreams.s.idempotency_window: -1h0m0s: must be positive`}},
		{"huge idempotency_window", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], idempotency_window: 1000h}}",
			[]string{`upstreams.s.idempotency_window: 1000h0m0s: must be at most 720h0m0s`}},
		{"unbounded dead_max_count", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], dead_max_count: unlimited}}",
			[]string{`upstreams.s.dead_max_count`}},

		// URLs and names.
		{"relative base_url", "upstreams: {s: {base_url: 'api.stripe.com', limits: [{rate: 1, per: 1s}]}}",
			[]string{`upstreams.s.base_url: scheme "": want an absolute http:// or https:// URL`}},
		{"ftp base_url", "upstreams: {s: {base_url: 'ftp://a.b', limits: [{rate: 1, per: 1s}]}}",
			[]string{`upstreams.s.base_url: scheme "ftp"`}},
		{"base_url with query", "upstreams: {s: {base_url: 'https://a.b/v1?key=1', limits: [{rate: 1, per: 1s}]}}",
			[]string{`upstreams.s.base_url: has a query`}},
		{"base_url with fragment", "upstreams: {s: {base_url: 'https://a.b/#x', limits: [{rate: 1, per: 1s}]}}",
			[]string{`upstreams.s.base_url: has a fragment`}},
		{"base_url with credentials", "upstreams: {s: {base_url: 'https://user:pw@a.b', limits: [{rate: 1, per: 1s}]}}",
			[]string{`upstreams.s.base_url: holds credentials`}},
		{"base_url missing", "upstreams: {s: {limits: [{rate: 1, per: 1s}]}}",
			[]string{`upstreams.s.base_url: required`}},
		{"handler with base_url", "upstreams: {s: {handler: true, base_url: 'https://a.b', limits: [{rate: 1, per: 1s}]}}",
			[]string{`upstreams.s.base_url: an upstream with handler: true makes no HTTP calls`}},
		{"uppercase upstream name", "upstreams: {Stripe: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}]}}",
			[]string{`upstreams.Stripe: not a valid upstream name`, `did you mean "stripe"?`}},
		{"upstream name with braces", "upstreams: {'a{b}': {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}]}}",
			[]string{`upstreams["a{b}"]: not a valid upstream name`}},
		{"upstream name too long", "upstreams: {" + strings.Repeat("a", 64) + ": {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}]}}",
			[]string{`not a valid upstream name`}},
		{"bad redis url", "redis: {url: 'http://h:6379'}" + oneUpstream, []string{`redis.url: scheme "http": want redis, rediss or unix`}},
		{"redis url bad db", "redis: {url: 'redis://h:6379/x'}" + oneUpstream, []string{`redis.url: invalid database number`}},
		{"url and cluster", "redis: {url: 'redis://h:6379/0', cluster: ['h:7000']}" + oneUpstream,
			[]string{`redis: url and cluster are both set (use one of url, cluster or sentinel)`}},
		{"cluster and sentinel", "redis: {cluster: ['h:7000'], sentinel: {master: m, addrs: ['h:26379']}}" + oneUpstream,
			[]string{`redis: cluster and sentinel are both set`}},
		{"bad cluster address", "redis: {cluster: ['h:7000', 'nohost']}" + oneUpstream, []string{`redis.cluster[1]: "nohost" is not host:port`}},
		{"sentinel without master", "redis: {sentinel: {addrs: ['h:26379']}}" + oneUpstream, []string{`redis.sentinel.master: required`}},
		{"db with cluster", "redis: {cluster: ['h:7000'], db: 2}" + oneUpstream, []string{`redis.db: Redis Cluster has only database 0`}},
		{"tls with url", "redis: {url: 'redis://h:6379/0', tls: true}" + oneUpstream, []string{`redis.tls: applies to cluster and sentinel`}},
		{"password twice", "redis: {url: 'redis://:pw@h:6379/0', password: other}" + oneUpstream, []string{`redis.password: the url has a password already`}},
		{"prefix with braces", "redis: {prefix: '{shaper}'}" + oneUpstream, []string{`redis.prefix: "{shaper}": letters, digits`}},
		{"bad listen", "api: {listen: 'localhost'}" + oneUpstream, []string{`api.listen: "localhost" is not an address to listen on`}},
		{"bad metrics listen", "work: {metrics_listen: ':99999'}" + oneUpstream, []string{`work.metrics_listen: ":99999" is not an address`}},

		// API keys.
		{"duplicate key names", "api: {keys: [{name: a, key_env: A}, {name: a, key_env: B}]}" + oneUpstream,
			[]string{`api.keys[1].name: "a" is also the name of api.keys[0] (names must be unique)`}},
		{"duplicate key_env", "api: {keys: [{name: a, key_env: A}, {name: b, key_env: A}]}" + oneUpstream,
			[]string{`api.keys[1].key_env: A is also the key_env of api.keys[0]`}},
		{"key without key_env", "api: {keys: [{name: a}]}" + oneUpstream, []string{`api.keys[0].key_env: required`}},
		{"key_env not a name", "api: {keys: [{name: a, key_env: 'MY-KEY'}]}" + oneUpstream,
			[]string{`api.keys[0].key_env: "MY-KEY" is not an environment variable name`}},
		{"key without name", "api: {keys: [{key_env: A}]}" + oneUpstream, []string{`api.keys[0].name: required`}},

		// Headers and lanes.
		{"header name with space", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], headers: {'X Key': v}}}",
			[]string{`upstreams.s.headers["X Key"]: not a header name`}},
		{"managed header", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], headers: {Content-Length: '5'}}}",
			[]string{`upstreams.s.headers.Content-Length: managed by the HTTP client`}},
		{"header differing in case", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], headers: {x-a: '1', X-A: '2'}}}",
			[]string{`the same header as`}},
		{"header is the idempotency header", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], headers: {idempotency-key: x}}}",
			[]string{`upstreams.s.headers.idempotency-key: is the idempotency_header`}},
		{"bad sensitive header pattern", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], sensitive_headers: ['X-*-Token', 'X Token']}}",
			[]string{`upstreams.s.sensitive_headers[1]: header pattern "X Token": only letters`}},
		{"empty sensitive header pattern", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], sensitive_headers: ['']}}",
			[]string{`upstreams.s.sensitive_headers[0]: empty header pattern`}},
		{"sensitive headers on a handler", "upstreams: {s: {handler: true, limits: [{rate: 1, per: 1s}], sensitive_headers: ['X-Key']}}",
			[]string{`upstreams.s.sensitive_headers: an upstream with handler: true takes no job headers`}},
		{"sensitive headers not a list", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], sensitive_headers: X-Key}}",
			[]string{`upstreams.s.sensitive_headers`}},
		{"bad store_response_headers pattern", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], store_response_headers: ['Content-Type', 'X Id']}}",
			[]string{`upstreams.s.store_response_headers[1]: header pattern "X Id": only letters`}},
		{"empty store_response_headers pattern", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], store_response_headers: ['']}}",
			[]string{`upstreams.s.store_response_headers[0]: empty header pattern`}},
		{"store_response_headers on a handler", "upstreams: {s: {handler: true, limits: [{rate: 1, per: 1s}], store_response_headers: ['X-Id']}}",
			[]string{`upstreams.s.store_response_headers: an upstream with handler: true stores its handler's response as the handler returns it`}},
		{"store_response_headers not a list", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], store_response_headers: X-Id}}",
			[]string{`upstreams.s.store_response_headers`}},
		{"unknown store_response", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], store_response: body}}",
			[]string{`upstreams.s.store_response: "body": want full (status, headers and body), headers (no body) or status`}},
		{"empty store_response", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], store_response: ''}}",
			[]string{`upstreams.s.store_response: empty: want full, headers or status`}},
		{"bad idempotency header", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], idempotency_header: 'Idem Key'}}",
			[]string{`upstreams.s.idempotency_header: "Idem Key" is not a header name`}},
		{"lanes without default", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], lanes: {high: 2}}}",
			[]string{`upstreams.s.lanes: must include "default"`}},
		{"lane weight zero", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], lanes: {default: 0}}}",
			[]string{`upstreams.s.lanes.default: weight 0: must be 1 to 1000`}},
		{"bad lane name", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], lanes: {default: 1, Fast: 2}}}",
			[]string{`upstreams.s.lanes.Fast: not a valid lane name`}},
		{"empty lanes", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], lanes: {}}}",
			[]string{`upstreams.s.lanes: no lanes`}},

		// Partitions and fairness.
		{"unknown partition limit key", mail + "partition_limits: [{rate: 1, per: 1m, window: 1m}]}}",
			[]string{`upstreams.mail.partition_limits[0].window: unknown key (allowed: adaptive, burst, cost, per, rate)`}},
		{"partition_limits is a mapping", mail + "partition_limits: {rate: 1, per: 1m}}}",
			[]string{`upstreams.mail.partition_limits: want a list, got a mapping`}},
		{"zero partition rate", mail + "partition_limits: [{rate: 0, per: 1m}]}}",
			[]string{`upstreams.mail.partition_limits[0]: rate 0: must be at least 1`}},
		{"negative partition rate", mail + "partition_limits: [{rate: 100, per: 1m}, {rate: -1, per: 1h}]}}",
			[]string{`upstreams.mail.partition_limits[1]: rate -1: must be at least 1`}},
		{"partition rate missing", mail + "partition_limits: [{per: 1m}]}}",
			[]string{`upstreams.mail.partition_limits[0].rate: required`}},
		{"partition per missing", mail + "partition_limits: [{rate: 5}]}}",
			[]string{`upstreams.mail.partition_limits[0].per: required`}},
		{"partition per without unit", mail + "partition_limits: [{rate: 5, per: 60}]}}",
			[]string{`upstreams.mail.partition_limits[0].per: 60 has no unit`}},
		{"partition burst above rate", mail + "partition_limits: [{rate: 5, per: 1m, burst: 6}]}}",
			[]string{`upstreams.mail.partition_limits[0]: burst 6: must not exceed rate 5`}},
		{"partition cost not counted by limits", mail + "partition_limits: [{rate: 5000, per: 1h, cost: recipients}]}}",
			[]string{`upstreams.mail.partition_limits[0].cost: "recipients" is counted by none of the upstream's limits, and a job may only carry costs they count (they count: requests only; add a limit with cost: recipients to limits)`}},
		{"partition cost not among the counted", "upstreams: {mail: {base_url: 'https://relay.example.com', limits: [{rate: 200, per: 1s}, {rate: 1e6, per: 1h, cost: bytes}], partition_limits: [{rate: 5, per: 1h, cost: recipients}]}}",
			[]string{`upstreams.mail.partition_limits[0].cost: "recipients" is counted by none of the upstream's limits, and a job may only carry costs they count (they count: bytes;`}},
		{"bad partition cost name", mail + "partition_limits: [{rate: 5, per: 1m, cost: Recipients}]}}",
			[]string{`upstreams.mail.partition_limits[0]: cost "Recipients": must be a lowercase name`}},
		{"empty partition_limits", mail + "partition_limits: []}}",
			[]string{`upstreams.mail.partition_limits: an empty list (leave partition_limits out`}},
		{"guard above a tenth of a partition per", mail + "partition_limits: [{rate: 1, per: 100ms}], guard: 20ms}}",
			[]string{`upstreams.mail.guard: 20ms: must be at most a tenth of the shortest limit's per (10ms)`}},
		{"override is a list", mail + "partition_overrides: [{rate: 1, per: 1m}]}}",
			[]string{`upstreams.mail.partition_overrides: want a mapping, got a list`}},
		{"override is one limit, not a list", mail + "partition_overrides: {gmail.com: {rate: 1000, per: 1m}}}}",
			[]string{`upstreams.mail.partition_overrides["gmail.com"]: want a list, got a mapping`}},
		{"override with a zero rate", mail + "partition_overrides: {gmail.com: [{rate: 0, per: 1m}]}}}",
			[]string{`upstreams.mail.partition_overrides["gmail.com"][0]: rate 0: must be at least 1`}},
		{"override with an unknown key", mail + "partition_overrides: {gmail.com: [{rate: 5, per: 1m, per_domain: true}]}}}",
			[]string{`upstreams.mail.partition_overrides["gmail.com"][0].per_domain: unknown key`}},
		{"override per missing", mail + "partition_overrides: {gmail.com: [{rate: 5}]}}}",
			[]string{`upstreams.mail.partition_overrides["gmail.com"][0].per: required`}},
		{"override cost not counted", mail + "partition_overrides: {gmail.com: [{rate: 5, per: 1m, cost: tokens}]}}}",
			[]string{`upstreams.mail.partition_overrides["gmail.com"][0].cost: "tokens" is counted by none of the upstream's limits`}},
		{"override with no limits", mail + "partition_overrides: {gmail.com: []}}}",
			[]string{`upstreams.mail.partition_overrides["gmail.com"]: no limits (an override replaces partition_limits`}},
		{"override that is null", mail + "partition_overrides: {gmail.com: }}}",
			[]string{`upstreams.mail.partition_overrides["gmail.com"]: no limits`}},
		{"override key too long", mail + "partition_overrides: {" + strings.Repeat("d", 201) + ": [{rate: 5, per: 1m}]}}}",
			[]string{`: not a valid partition: is 201 bytes: must be at most 200`}},
		{"override key empty", mail + "partition_overrides: {'': [{rate: 5, per: 1m}]}}}",
			[]string{`upstreams.mail.partition_overrides[""]: not a valid partition: must not be empty`}},
		{"override key with a control character", mail + "partition_overrides: {\"a\\tb\": [{rate: 5, per: 1m}]}}}",
			[]string{`upstreams.mail.partition_overrides["a\tb"]: not a valid partition: holds a control character (U+0009 at byte 1)`}},
		{"empty partition_overrides", mail + "partition_overrides: {}}}",
			[]string{`upstreams.mail.partition_overrides: an empty mapping`}},
		{"unknown fairness key", mail + "fairness: {by: tenant, weight: {a: 2}}}}",
			[]string{`upstreams.mail.fairness.weight: unknown key; did you mean "weights"?`}},
		{"fairness is a string", mail + "fairness: tenant}}",
			[]string{`upstreams.mail.fairness: want a mapping with by, weights, got "tenant"`}},
		{"fairness by tenants", mail + "fairness: {by: tenants}}}",
			[]string{`upstreams.mail.fairness.by: "tenants" is not one of tenant, partition, none`}},
		{"fairness by empty", mail + "fairness: {by: ''}}}",
			[]string{`upstreams.mail.fairness.by: empty: want tenant, partition or none (or leave it out for tenant)`}},
		{"weights with by none", mail + "fairness: {by: none, weights: {a: 2}}}}",
			[]string{`upstreams.mail.fairness.weights: by: none shares nothing by weight`}},
		{"weight zero", mail + "fairness: {weights: {billing: 0}}}}",
			[]string{`upstreams.mail.fairness.weights.billing: weight 0: must be 1 to 1000`}},
		{"weight negative", mail + "fairness: {by: partition, weights: {gmail.com: -1}}}}",
			[]string{`upstreams.mail.fairness.weights["gmail.com"]: weight -1: must be 1 to 1000`}},
		{"weight too large", mail + "fairness: {weights: {billing: 1001}}}}",
			[]string{`upstreams.mail.fairness.weights.billing: weight 1001: must be 1 to 1000`}},
		{"weight is text", mail + "fairness: {weights: {billing: high}}}}",
			[]string{`upstreams.mail.fairness.weights.billing: "high" is not a whole number`}},
		{"weight names no tenant of the keys", "api: {keys: [{name: billing, key_env: A}, {name: r, tenant: reports, key_env: B}]}\n" + mail + "fairness: {weights: {biling: 3}}}}",
			[]string{`upstreams.mail.fairness.weights.biling: no API key has tenant "biling" (tenants: billing, reports; by: tenant weighs the tenants of api.keys)`}},
		{"weight names a key, not its tenant", "api: {keys: [{name: r, tenant: reports, key_env: B}]}\n" + mail + "fairness: {by: tenant, weights: {r: 3}}}}",
			[]string{`upstreams.mail.fairness.weights.r: no API key has tenant "r"`}},
		{"weight not a tenant name", mail + "fairness: {weights: {'a b': 3}}}}",
			[]string{`upstreams.mail.fairness.weights["a b"]: not a tenant name`}},
		{"partition weight too long", mail + "fairness: {by: partition, weights: {" + strings.Repeat("p", 201) + ": 2}}}}",
			[]string{`: not a valid partition: is 201 bytes: must be at most 200`}},

		// Adaptive limits and settlement.
		{"adaptive on a cost limit", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}, {rate: 1000, per: 1m, cost: tokens, adaptive: true}]}}",
			[]string{`upstreams.s.limits[1].adaptive: only request limits may be adaptive, and this one counts tokens (remove adaptive, or cost)`}},
		{"adaptive on a partition limit", mail + "partition_limits: [{rate: 100, per: 1m, adaptive: true}]}}",
			[]string{`upstreams.mail.partition_limits[0].adaptive: only the upstream's own limits may be adaptive, not partition limits`}},
		{"adaptive on an override", mail + "partition_overrides: {gmail.com: [{rate: 1000, per: 1m, adaptive: true}]}}}",
			[]string{`upstreams.mail.partition_overrides["gmail.com"][0].adaptive: only the upstream's own limits may be adaptive`}},
		{"adaptive is yes", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s, adaptive: yes}]}}",
			[]string{`upstreams.s.limits[0].adaptive: "yes" is not true or false`}},
		// The proxy.
		{"unknown proxy key", oai + "proxy: {max_wiat: 5s}}}",
			[]string{`upstreams.oai.proxy.max_wiat: unknown key; did you mean "max_wait"?`}},
		{"proxy max_wait 0", oai + "proxy: {max_wait: 0s}}}",
			[]string{`upstreams.oai.proxy.max_wait: 0s: must be positive (leave it out for the default 30s)`}},
		{"proxy max_wait negative", oai + "proxy: {max_wait: -1s}}}",
			[]string{`upstreams.oai.proxy.max_wait: -1s: must be positive`}},
		{"proxy max_wait too long", oai + "proxy: {max_wait: 2h}}}",
			[]string{`upstreams.oai.proxy.max_wait: 2h0m0s: must be at most 1h`}},
		{"proxy listen not an address", oai + "proxy: {listen: here}}}",
			[]string{`upstreams.oai.proxy.listen: "here" is not an address to listen on`}},
		{"proxy enabled not a bool", oai + "proxy: {enabled: sure}}}",
			[]string{`upstreams.oai.proxy.enabled: "sure" is not true or false`}},
		{"proxy cost no limit counts", oai + "proxy: {cost: {tokns: {json: /max_tokens}}}}}",
			[]string{`upstreams.oai.proxy.cost.tokns: no limit of the upstream counts "tokns"`}},
		{"proxy cost bad pointer", oai + "proxy: {cost: {tokens: {json: max_tokens}}}}}",
			[]string{`upstreams.oai.proxy.cost.tokens:`}},
		{"proxy on a handler upstream", "upstreams: {h: {handler: true, limits: [{rate: 1, per: 1s}], proxy: {listen: ':9000'}}}",
			[]string{`upstreams.h.proxy: an upstream served by a Go handler makes no HTTP calls to proxy`}},
		{"settle is a list", oai + "settle: [tokens]}}",
			[]string{`upstreams.oai.settle: want a mapping, got a list`}},
		{"settle is empty", oai + "settle: {}}}",
			[]string{`upstreams.oai.settle: an empty mapping (leave settle out`}},
		{"settle a cost no limit counts", oai + "settle: {tokns: {json: /usage/total_tokens}}}}",
			[]string{`upstreams.oai.settle.tokns: no limit counts "tokns", so there is nothing to settle (the limits count: tokens)`}},
		{"settle requests", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], settle: {requests: {header: X-N}}}}",
			[]string{`upstreams.s.settle.requests: no limit counts "requests", so there is nothing to settle (the limits count: requests only, one per job, which needs no settling)`}},
		{"settle with neither json nor header", oai + "settle: {tokens: {}}}}",
			[]string{`upstreams.oai.settle.tokens: set json (a JSON pointer into the body, e.g. /usage/total_tokens) or header (a response header name)`}},
		{"settle that is null", oai + "settle: {tokens: }}}",
			[]string{`upstreams.oai.settle.tokens: set json`}},
		{"settle with both", oai + "settle: {tokens: {json: /usage/total_tokens, header: X-Tokens}}}}",
			[]string{`upstreams.oai.settle.tokens: set json or header, not both`}},
		{"settle json without a slash", oai + "settle: {tokens: {json: usage.total_tokens}}}}",
			[]string{`upstreams.oai.settle.tokens: json "usage.total_tokens": a JSON pointer starts with / (e.g. "/usage.total_tokens")`}},
		{"settle json empty", oai + "settle: {tokens: {json: ''}}}}",
			[]string{`upstreams.oai.settle.tokens.json: empty: want a JSON pointer into the answer's body, starting with / (e.g. /usage/total_tokens)`}},
		{"settle json bad escape", oai + "settle: {tokens: {json: /usage/a~2b}}}}",
			[]string{`upstreams.oai.settle.tokens: json "/usage/a~2b": ~ must be followed by 0 (for ~) or 1 (for /)`}},
		{"settle header empty", oai + "settle: {tokens: {header: ''}}}}",
			[]string{`upstreams.oai.settle.tokens.header: empty: want the name of a response header`}},
		{"settle header not a name", oai + "settle: {tokens: {header: 'X Tokens'}}}}",
			[]string{`upstreams.oai.settle.tokens: header "X Tokens": not a header name`}},
		{"settle unknown key", oai + "settle: {tokens: {pointer: /usage/total_tokens}}}}",
			[]string{`upstreams.oai.settle.tokens.pointer: unknown key (allowed: header, json)`}},
		{"settle json is a list", oai + "settle: {tokens: {json: [usage, total_tokens]}}}}",
			[]string{`upstreams.oai.settle.tokens.json: want a string, got a list`}},

		// Environment.
		{"unset variable", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], headers: {Authorization: 'Bearer ${STRIPE_KEY}'}}}",
			[]string{`upstreams.s.headers.Authorization: environment variable STRIPE_KEY is not set (set it, or write ${STRIPE_KEY:-default})`}},
		{"dollar without braces", "redis: {password: '$SET'}" + oneUpstream,
			[]string{`redis.password: $SET: write ${SET} to use the variable, or $$ for a literal $`}},
		{"unclosed variable", "redis: {password: '${SET'}" + oneUpstream, []string{`redis.password: "${SET" has no closing }`}},
		{"variable expands to a bad value", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: '${SET}', per: 1s}]}}",
			[]string{`upstreams.s.limits[0].rate: "value" is not a whole number (from ${SET})`}},
		{"header value with a line break from env", "upstreams: {s: {base_url: 'https://a.b', limits: [{rate: 1, per: 1s}], headers: {X: \"a\\r\\nHost: evil\"}}}",
			[]string{`upstreams.s.headers.X: value holds a line break`}},

		// YAML itself.
		{"syntax error", "upstreams:\n  s: [\n", []string{`line 2: did not find expected node content`}},
		{"tab indentation", "upstreams:\n\ts: {}\n", []string{`line 2: found character that cannot start any token (YAML indents with spaces, not tabs)`}},
		{"two documents", oneUpstream + "---\n" + oneUpstream, []string{`a second YAML document`}},
		{"alias bomb", aliasBomb(), []string{`too many values once aliases are expanded`}},
		{"merge of a scalar", "upstreams: {s: {<<: 5, base_url: 'https://a.b', limits: [{rate: 1, per: 1s}]}}",
			[]string{`upstreams.s: << merges a mapping or a list of mappings, got "5"`}},
	}
	seen := map[string]bool{}
	for _, tc := range cases {
		if seen[tc.name] {
			t.Fatalf("two cases named %q", tc.name)
		}
		seen[tc.name] = true
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.yaml), env)
			if err == nil {
				t.Fatalf("got a config, want an error containing %q\n%s", tc.want, c.Summary())
			}
			var cerr *Error
			if !errors.As(err, &cerr) {
				t.Fatalf("got %T (%v), want *Error", err, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("got error:\n%v\nwant it to contain %q", err, w)
				}
			}
		})
	}
}

// TestAllProblemsReported checks that one run names every mistake, in file
// order, without echoing the mistakes that follow from one another.
func TestAllProblemsReported(t *testing.T) {
	src := `redis:
  url: redis://h:6379/0
  cluster: [h:7000]
api:
  admission: {on_redis_error: sometimes}
upstreams:
  stripe:
    base_url: ftp://api.stripe.com
    limits:
      - {rate: 0, per: 1s}
      - {rate: lots, per: 1s}
    concurency: 20
    timeout: 30
`
	_, err := Parse([]byte(src), mapEnv(nil))
	var cerr *Error
	if !errors.As(err, &cerr) {
		t.Fatalf("got %v, want *Error", err)
	}
	want := []Problem{
		{Path: "redis", Line: 2, Msg: "url and cluster are both set (use one of url, cluster or sentinel)"},
		{Path: "api.admission.on_redis_error", Line: 5, Msg: `"sometimes" is not a policy (want allow, deny or local)`},
		{Path: "upstreams.stripe.base_url", Line: 8, Msg: `scheme "ftp": want an absolute http:// or https:// URL`},
		{Path: "upstreams.stripe.limits[0]", Line: 10, Msg: "rate 0: must be at least 1"},
		{Path: "upstreams.stripe.limits[1].rate", Line: 11, Msg: `"lots" is not a whole number`},
		{Path: "upstreams.stripe.concurency", Line: 12, Msg: `unknown key; did you mean "concurrency"?`},
		{Path: "upstreams.stripe.timeout", Line: 13, Msg: "30 has no unit (write 30s, 30ms, 1m, …)"},
	}
	if len(cerr.Problems) != len(want) {
		t.Fatalf("got %d problems:\n%v\nwant %d", len(cerr.Problems), err, len(want))
	}
	for i, w := range want {
		if got := cerr.Problems[i]; got != w {
			t.Errorf("problem %d: got %+v, want %+v", i, got, w)
		}
	}
	if !strings.HasPrefix(err.Error(), "invalid config (7 problems):\n  line 2: redis: url and cluster") {
		t.Errorf("got message:\n%v", err)
	}
}

// aliasBomb is the billion-laughs document in the one shape this schema
// follows aliases deep: merge keys merging mappings that merge mappings, ten
// lines that would take 10^9 steps to decode naively.
func aliasBomb() string {
	var b strings.Builder
	b.WriteString("x-m0: &m0 {timeout: 1s}\n")
	for i := 1; i < 10; i++ {
		fmt.Fprintf(&b, "x-m%d: &m%d {<<: [", i, i)
		for j := range 10 {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "*m%d", i-1)
		}
		b.WriteString("]}\n")
	}
	b.WriteString("upstreams:\n  s:\n    <<: *m9\n    base_url: https://a.b\n    limits: [{rate: 1, per: 1s}]\n")
	return b.String()
}
