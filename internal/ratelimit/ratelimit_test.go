package ratelimit

import (
	"net/http"
	"reflect"
	"testing"
	"time"
)

// now is the clock of every test: 30 minutes before the reset of GitHub's
// documented example (1691591363 is 2023-08-09 14:29:23 UTC).
var now = time.Unix(1691591363, 0).Add(-30 * time.Minute)

// header builds a header the way net/http's client delivers one: canonical
// keys, one value per received line.
func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func TestRetryAfter(t *testing.T) {
	// RFC 9110 §10.2.3 and the three date forms of §5.6.7, which
	// net/http's ParseTime accepts.
	tests := []struct {
		name, value string
		want        time.Duration
	}{
		{"delay seconds (RFC 9110 example)", "120", 2 * time.Minute},
		{"zero", "0", 0},
		{"fractional seconds some APIs send", "1.5", 1500 * time.Millisecond},
		{"IMF-fixdate", "Wed, 09 Aug 2023 14:29:23 GMT", 30 * time.Minute},
		{"RFC 850 date", "Wednesday, 09-Aug-23 14:29:23 GMT", 30 * time.Minute},
		{"asctime date", "Wed Aug  9 14:29:23 2023", 30 * time.Minute},
		{"past date is now", "Fri, 31 Dec 1999 23:59:59 GMT", 0},
		{"negative", "-5", 0},
		{"garbage", "soon", 0},
		{"absent", "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := header()
			if tt.value != "" {
				h.Set("Retry-After", tt.value)
			}
			if got := Read(h, now).RetryAfter; got != tt.want {
				t.Errorf("Retry-After %q: got %v, want %v", tt.value, got, tt.want)
			}
		})
	}
}

func TestRead(t *testing.T) {
	tests := []struct {
		name string
		h    http.Header
		want Reading
	}{
		{
			name: "nothing",
			h:    header("Content-Type", "application/json"),
			want: Reading{},
		},
		{
			// OpenAI's rate-limit guide, "Rate limits in headers" example.
			name: "OpenAI",
			h: header(
				"x-ratelimit-limit-requests", "60",
				"x-ratelimit-limit-tokens", "150000",
				"x-ratelimit-remaining-requests", "59",
				"x-ratelimit-remaining-tokens", "149984",
				"x-ratelimit-reset-requests", "1s",
				"x-ratelimit-reset-tokens", "6m0s",
			),
			want: Reading{Quotas: []Quota{
				{Name: "requests", Unit: "requests", Limit: 60, Remaining: 59, Reset: time.Second, HasReset: true},
				{Name: "tokens", Unit: "tokens", Limit: 150000, Remaining: 149984, Reset: 6 * time.Minute, HasReset: true},
			}},
		},
		{
			// As OpenAI sends them today (reported on the OpenAI community
			// forum), with a third, usage-based token quota.
			name: "OpenAI with millisecond resets and tokens_usage_based",
			h: header(
				"x-ratelimit-limit-requests", "5000",
				"x-ratelimit-limit-tokens", "160000",
				"x-ratelimit-limit-tokens_usage_based", "160000",
				"x-ratelimit-remaining-requests", "4999",
				"x-ratelimit-remaining-tokens", "159976",
				"x-ratelimit-remaining-tokens_usage_based", "159976",
				"x-ratelimit-reset-requests", "12ms",
				"x-ratelimit-reset-tokens", "9ms",
				"x-ratelimit-reset-tokens_usage_based", "9ms",
			),
			want: Reading{Quotas: []Quota{
				{Name: "requests", Unit: "requests", Limit: 5000, Remaining: 4999, Reset: 12 * time.Millisecond, HasReset: true},
				{Name: "tokens", Unit: "tokens", Limit: 160000, Remaining: 159976, Reset: 9 * time.Millisecond, HasReset: true},
				{Name: "tokens_usage_based", Unit: "tokens_usage_based", Limit: 160000, Remaining: 159976, Reset: 9 * time.Millisecond, HasReset: true},
			}},
		},
		{
			name: "OpenAI at the limit, the answer shaper's fake upstream gives",
			h: header(
				"X-Ratelimit-Limit-Requests", "40",
				"X-Ratelimit-Remaining-Requests", "0",
				"X-Ratelimit-Reset-Requests", "0.5s",
				"Retry-After", "1",
			),
			want: Reading{RetryAfter: time.Second, Quotas: []Quota{
				{Name: "requests", Unit: "requests", Limit: 40, Remaining: 0, Reset: 500 * time.Millisecond, HasReset: true},
			}},
		},
		{
			// Azure OpenAI answering -1 for "unknown" (Microsoft Q&A,
			// "Azure OpenAI Responses API x-ratelimit headers values -1, 0"),
			// and a reset in bare seconds as Azure sends it otherwise.
			name: "Azure OpenAI unknown and bare seconds",
			h: header(
				"x-ratelimit-limit-tokens", "-1",
				"x-ratelimit-remaining-tokens", "-1",
				"x-ratelimit-reset-tokens", "0",
				"x-ratelimit-remaining-requests", "9",
				"x-ratelimit-reset-requests", "6",
			),
			want: Reading{Quotas: []Quota{
				{Name: "requests", Unit: "requests", Remaining: 9, Reset: 6 * time.Second, HasReset: true},
			}},
		},
		{
			// GitHub REST API docs, "Rate limits for the REST API":
			// checking the status of your rate limit.
			name: "GitHub",
			h: header(
				"x-ratelimit-limit", "5000",
				"x-ratelimit-remaining", "4999",
				"x-ratelimit-used", "1",
				"x-ratelimit-reset", "1691591363",
				"x-ratelimit-resource", "core",
			),
			want: Reading{Quotas: []Quota{
				{Name: "core", Unit: "requests", Limit: 5000, Remaining: 4999, Reset: 30 * time.Minute, HasReset: true},
			}},
		},
		{
			name: "GitHub secondary limit: used without remaining, reset past",
			h: header(
				"X-RateLimit-Limit", "30",
				"X-RateLimit-Used", "31",
				"X-RateLimit-Reset", "1691580000",
				"X-RateLimit-Resource", "search",
			),
			want: Reading{Quotas: []Quota{
				{Name: "search", Unit: "requests", Limit: 30, Remaining: 0, Reset: 0, HasReset: true},
			}},
		},
		{
			// Many APIs send delta seconds under GitHub's names, e.g.
			// Mailchimp-style gateways and shaper's own httplimit.
			name: "X-RateLimit with delta seconds",
			h:    header("X-RateLimit-Limit", "50", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "12"),
			want: Reading{Quotas: []Quota{
				{Unit: "requests", Limit: 50, Remaining: 0, Reset: 12 * time.Second, HasReset: true},
			}},
		},
		{
			// Discord's developer docs, "Rate Limits": an epoch with
			// milliseconds, and Reset-After in seconds, which wins.
			name: "Discord",
			h: header(
				"X-RateLimit-Limit", "5",
				"X-RateLimit-Remaining", "1",
				"X-RateLimit-Reset", "1470173023.123",
				"X-RateLimit-Reset-After", "1.2",
				"X-RateLimit-Bucket", "abcd1234",
			),
			want: Reading{Quotas: []Quota{
				{Unit: "requests", Limit: 5, Remaining: 1, Reset: 1200 * time.Millisecond, HasReset: true},
			}},
		},
		{
			name: "X-RateLimit-Reset as a Unix time in milliseconds",
			h:    header("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1691591363000"),
			want: Reading{Quotas: []Quota{
				{Unit: "requests", Remaining: 0, Reset: 30 * time.Minute, HasReset: true},
			}},
		},
		{
			// Twitter's v1.1 and v2 API spelling.
			name: "X-Rate-Limit",
			h:    header("x-rate-limit-limit", "900", "x-rate-limit-remaining", "899", "x-rate-limit-reset", "1691591363"),
			want: Reading{Quotas: []Quota{
				{Unit: "requests", Limit: 900, Remaining: 899, Reset: 30 * time.Minute, HasReset: true},
			}},
		},
		{
			// draft-ietf-httpapi-ratelimit-headers-00 to -06: the trio, delta
			// seconds.
			name: "older draft trio",
			h:    header("RateLimit-Limit", "100", "RateLimit-Remaining", "50", "RateLimit-Reset", "50"),
			want: Reading{Quotas: []Quota{
				{Unit: "requests", Limit: 100, Remaining: 50, Reset: 50 * time.Second, HasReset: true},
			}},
		},
		{
			// draft-ietf-httpapi-ratelimit-headers-01, section 3.1 example:
			// the quota followed by its policies.
			name: "older draft limit with policies",
			h:    header("RateLimit-Limit", "100, 100;w=60", "RateLimit-Remaining", "0", "RateLimit-Reset", "30"),
			want: Reading{
				Quotas:   []Quota{{Unit: "requests", Limit: 100, Remaining: 0, Reset: 30 * time.Second, HasReset: true}},
				Policies: []Policy{{Unit: "requests", Quota: 100, Window: time.Minute}},
			},
		},
		{
			// draft -01's example with two windows and a comment parameter.
			name: "older draft limit with two windows and a comment",
			h:    header("RateLimit-Limit", `10, 10;w=1, 1000;w=3600;comment="hour"`, "RateLimit-Remaining", "9", "RateLimit-Reset", "1"),
			want: Reading{
				Quotas: []Quota{{Unit: "requests", Limit: 10, Remaining: 9, Reset: time.Second, HasReset: true}},
				Policies: []Policy{
					{Unit: "requests", Quota: 10, Window: time.Second},
					{Unit: "requests", Quota: 1000, Window: time.Hour},
				},
			},
		},
		{
			// draft -07, as express-rate-limit's standardHeaders "draft-7"
			// sends it.
			name: "draft -07 dictionary",
			h:    header("RateLimit", "limit=100, remaining=25, reset=5", "RateLimit-Policy", "100;w=60"),
			want: Reading{
				Quotas:   []Quota{{Unit: "requests", Limit: 100, Remaining: 25, Reset: 5 * time.Second, HasReset: true}},
				Policies: []Policy{{Unit: "requests", Quota: 100, Window: time.Minute}},
			},
		},
		{
			// draft-ietf-httpapi-ratelimit-headers-10, sections 3 and 4
			// (the field examples).
			name: "draft -10 one policy",
			h:    header("RateLimit-Policy", `"default";q=100;w=10`, "RateLimit", `"default";r=50;t=30`),
			want: Reading{
				Quotas:   []Quota{{Name: "default", Unit: "requests", Limit: 100, Remaining: 50, Reset: 30 * time.Second, HasReset: true}},
				Policies: []Policy{{Name: "default", Unit: "requests", Quota: 100, Window: 10 * time.Second}},
			},
		},
		{
			// draft -10 section 3: two policies in one line; the remaining
			// of one of them, matched by name.
			name: "draft -10 two policies, one line",
			h:    header("RateLimit-Policy", `"burst";q=100;w=60,"daily";q=1000;w=86400`, "RateLimit", `"daily";r=100;t=36000`),
			want: Reading{
				Quotas: []Quota{{Name: "daily", Unit: "requests", Limit: 1000, Remaining: 100, Reset: 10 * time.Hour, HasReset: true}},
				Policies: []Policy{
					{Name: "burst", Unit: "requests", Quota: 100, Window: time.Minute},
					{Name: "daily", Unit: "requests", Quota: 1000, Window: 24 * time.Hour},
				},
			},
		},
		{
			// RFC 9651 section 3.1: a list split over several field lines
			// is one list; net/http keeps them as separate values.
			name: "draft -10 policies and limits over repeated lines",
			h: header(
				"RateLimit-Policy", `"permin";q=50;w=60`,
				"RateLimit-Policy", `"perhr";q=1000;w=3600`,
				"RateLimit", `"perhr";r=999;t=3599`,
				"RateLimit", `"permin";r=0;t=12`,
			),
			want: Reading{
				Quotas: []Quota{
					{Name: "perhr", Unit: "requests", Limit: 1000, Remaining: 999, Reset: 3599 * time.Second, HasReset: true},
					{Name: "permin", Unit: "requests", Limit: 50, Remaining: 0, Reset: 12 * time.Second, HasReset: true},
				},
				Policies: []Policy{
					{Name: "permin", Unit: "requests", Quota: 50, Window: time.Minute},
					{Name: "perhr", Unit: "requests", Quota: 1000, Window: time.Hour},
				},
			},
		},
		{
			// draft -10 section 3.2 and 4.2: a quota unit, partition keys
			// (byte sequences, ignored) and a remaining without a reset.
			name: "draft -10 quota unit and partition key",
			h: header(
				"RateLimit-Policy", `"peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:`,
				"RateLimit", `"peruser";r=300;pk=:dHJpYWwxMjEzMjM=:`,
			),
			want: Reading{
				Quotas:   []Quota{{Name: "peruser", Unit: "content-bytes", Limit: 65535, Remaining: 300, Partitioned: true}},
				Policies: []Policy{{Name: "peruser", Unit: "content-bytes", Quota: 65535, Window: 10 * time.Second, Partitioned: true}},
			},
		},
		{
			// Earlier revisions (-08, -09) and the examples in section 7 use
			// tokens for names; a policy may omit w; unknown parameters
			// (the FAQ's burst, -09's q on RateLimit) are comments.
			name: "draft -10 token names, no window, unknown parameters",
			h: header(
				"RateLimit-Policy", `quota;q=10, "sliding";q=100;w=60;burst=1000`,
				"RateLimit", `quota;r=3;t=1, "sliding";q=12;r=50;t=44, "nopolicy";r=7`,
			),
			want: Reading{
				Quotas: []Quota{
					{Name: "quota", Unit: "requests", Limit: 10, Remaining: 3, Reset: time.Second, HasReset: true},
					{Name: "sliding", Unit: "requests", Limit: 100, Remaining: 50, Reset: 44 * time.Second, HasReset: true},
					{Name: "nopolicy", Unit: "requests", Remaining: 7},
				},
				Policies: []Policy{
					{Name: "quota", Unit: "requests", Quota: 10},
					{Name: "sliding", Unit: "requests", Quota: 100, Window: time.Minute},
				},
			},
		},
		{
			// draft -10 section 7.1.7: "RateLimit: quota;t=1" gives no
			// remaining, so there is no quota to report.
			name: "draft -10 item without r",
			h:    header("RateLimit-Policy", `quota;q=100;w=1`, "RateLimit", `quota;t=1`),
			want: Reading{Policies: []Policy{{Name: "quota", Unit: "requests", Quota: 100, Window: time.Second}}},
		},
		{
			// shaper's own 429 (httplimit), which carries the draft form and
			// GitHub's names for the same allowance: each is reported.
			name: "shaper's own answer",
			h: header(
				"Retry-After", "3",
				"RateLimit-Policy", `"enqueue";q=10;w=10`,
				"RateLimit", `"enqueue";r=0;t=4`,
				"X-RateLimit-Limit", "10",
				"X-RateLimit-Remaining", "0",
				"X-RateLimit-Reset", "4",
			),
			want: Reading{
				RetryAfter: 3 * time.Second,
				Quotas: []Quota{
					{Name: "enqueue", Unit: "requests", Limit: 10, Remaining: 0, Reset: 4 * time.Second, HasReset: true},
					{Unit: "requests", Limit: 10, Remaining: 0, Reset: 4 * time.Second, HasReset: true},
				},
				Policies: []Policy{{Name: "enqueue", Unit: "requests", Quota: 10, Window: 10 * time.Second}},
			},
		},
		{
			// Anthropic's API docs, "Rate limits": response headers with
			// RFC 3339 resets.
			name: "Anthropic",
			h: header(
				"anthropic-ratelimit-requests-limit", "50",
				"anthropic-ratelimit-requests-remaining", "0",
				"anthropic-ratelimit-requests-reset", "2023-08-09T14:29:23Z",
				"anthropic-ratelimit-input-tokens-limit", "40000",
				"anthropic-ratelimit-input-tokens-remaining", "39000",
				"anthropic-ratelimit-input-tokens-reset", "2023-08-09T13:59:24.5Z",
				"retry-after", "1800",
			),
			want: Reading{RetryAfter: 30 * time.Minute, Quotas: []Quota{
				{Name: "input-tokens", Unit: "input-tokens", Limit: 40000, Remaining: 39000, Reset: 1500 * time.Millisecond, HasReset: true},
				{Name: "requests", Unit: "requests", Limit: 50, Remaining: 0, Reset: 30 * time.Minute, HasReset: true},
			}},
		},
		{
			name: "overdrawn remaining with a limit reads as 0",
			h:    header("X-RateLimit-Limit", "100", "X-RateLimit-Remaining", "-20", "X-RateLimit-Reset", "2"),
			want: Reading{Quotas: []Quota{{Unit: "requests", Limit: 100, Remaining: 0, Reset: 2 * time.Second, HasReset: true}}},
		},
		{
			name: "negative remaining without a limit is unknown",
			h:    header("RateLimit-Remaining", "-1", "RateLimit-Reset", "2"),
			want: Reading{},
		},
		{
			// RFC 9651 section 4.2: a field that fails to parse is ignored
			// as a whole; the other forms still count.
			name: "malformed structured fields are ignored, others read",
			h: header(
				"RateLimit-Policy", `"default";q=100;w=10,`,
				"RateLimit", `"default";r=50;t=30, (`,
				"RateLimit-Limit", `100;w=`,
				"X-RateLimit-Remaining", "5",
				"X-RateLimit-Reset", "soon",
				"x-ratelimit-remaining-requests", "lots",
				"x-ratelimit-remaining-tokens", "10",
				"x-ratelimit-reset-tokens", "-1s",
				"Retry-After", "2",
			),
			want: Reading{RetryAfter: 2 * time.Second, Quotas: []Quota{
				{Unit: "requests", Remaining: 5},
				{Name: "tokens", Unit: "tokens", Remaining: 10},
			}},
		},
		{
			// sf-integers reach 15 digits, seconds that overflow a Duration.
			name: "huge reset saturates",
			h:    header("RateLimit", `"default";r=1;t=999999999999999`),
			want: Reading{Quotas: []Quota{{Name: "default", Unit: "requests", Remaining: 1, Reset: time.Duration(1<<63 - 1), HasReset: true}}},
		},
		{
			name: "wrong types in structured fields are skipped item by item",
			h: header(
				"RateLimit-Policy", `"a";q="100";w=10, "b";q=-1, "c";q=5;w=-3, ("x" "y");q=1, ?1;q=2, "d";q=20;w=2.5;qu=requests`,
				"RateLimit", `"c";r="1", "c";r=2;t=-1, 42;r=1, "d";r=1;t=0.25`,
			),
			want: Reading{
				Quotas: []Quota{
					{Name: "c", Unit: "requests", Limit: 5, Remaining: 2},
					{Name: "d", Unit: "requests", Limit: 20, Remaining: 1, Reset: 250 * time.Millisecond, HasReset: true},
				},
				Policies: []Policy{
					{Name: "c", Unit: "requests", Quota: 5},
					{Name: "d", Unit: "requests", Quota: 20, Window: 2500 * time.Millisecond},
				},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Read(tt.h, now)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

// TestOpenAIResets covers the reset spellings OpenAI's headers use, which
// are Go's duration syntax, and a bare number as seconds.
func TestOpenAIResets(t *testing.T) {
	tests := []struct {
		value string
		want  time.Duration
		ok    bool
	}{
		{"6m0s", 6 * time.Minute, true},
		{"12ms", 12 * time.Millisecond, true},
		{"1s", time.Second, true},
		{"0.5s", 500 * time.Millisecond, true},
		{"1m30.5s", 90*time.Second + 500*time.Millisecond, true},
		{"2h1m3s", 2*time.Hour + time.Minute + 3*time.Second, true},
		{"0s", 0, true},
		{"7", 7 * time.Second, true},
		{"0.25", 250 * time.Millisecond, true},
		{"2562047h", 2562047 * time.Hour, true},
		{"2562048h", 0, false}, // beyond a Duration
		{"-1s", 0, false},
		{"1 minute", 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		h := header("X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Reset-Requests", tt.value)
		q := Read(h, now).Quotas
		if len(q) != 1 {
			t.Fatalf("reset %q: got %d quotas, want 1", tt.value, len(q))
		}
		if q[0].Reset != tt.want || q[0].HasReset != tt.ok {
			t.Errorf("reset %q: got %v (known %v), want %v (known %v)", tt.value, q[0].Reset, q[0].HasReset, tt.want, tt.ok)
		}
	}
}

func TestExhausted(t *testing.T) {
	tests := []struct {
		name   string
		quotas []Quota
		want   Quota
		ok     bool
	}{
		{"none", nil, Quota{}, false},
		{"all left", []Quota{{Name: "requests", Remaining: 3, Reset: time.Second, HasReset: true}}, Quota{}, false},
		{
			"the spent one that resets last",
			[]Quota{
				{Name: "requests", Remaining: 0, Reset: time.Second, HasReset: true},
				{Name: "tokens", Remaining: 5, Reset: time.Hour, HasReset: true},
				{Name: "daily", Remaining: 0, Reset: time.Minute, HasReset: true},
				{Name: "other", Remaining: 0},
			},
			Quota{Name: "daily", Remaining: 0, Reset: time.Minute, HasReset: true}, true,
		},
		{
			"a known reset of now beats an unknown one",
			[]Quota{{Name: "a", Remaining: 0}, {Name: "b", Remaining: 0, HasReset: true}},
			Quota{Name: "b", Remaining: 0, HasReset: true}, true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := Reading{Quotas: tt.quotas}.Exhausted()
			if got != tt.want || ok != tt.ok {
				t.Errorf("got %v, %v; want %v, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestNextUnit(t *testing.T) {
	tests := []struct {
		q    Quota
		want time.Duration
	}{
		{Quota{Limit: 40, Reset: time.Second, HasReset: true}, 25 * time.Millisecond},
		{Quota{Limit: 150000, Reset: 6 * time.Minute, HasReset: true}, 2400 * time.Microsecond},
		{Quota{Limit: 1 << 40, Reset: time.Millisecond, HasReset: true}, time.Microsecond}, // at least 1µs
		{Quota{Limit: 10, Reset: 0, HasReset: true}, 0},
		{Quota{Reset: 3 * time.Second, HasReset: true}, 3 * time.Second}, // no limit: the reset itself
		{Quota{}, 0},
	}
	for _, tt := range tests {
		if got := tt.q.NextUnit(); got != tt.want {
			t.Errorf("%v: got %v, want %v", tt.q, got, tt.want)
		}
	}
}

func TestRequestPolicies(t *testing.T) {
	r := Read(header(
		"RateLimit-Policy", `"burst";q=100;w=60, "bytes";q=65535;qu="content-bytes";w=10, "open";q=5, "daily";q=1000;w=86400;qu="requests"`,
		"RateLimit-Limit", "10, 10;w=1",
	), now)
	want := []Policy{
		{Name: "burst", Unit: "requests", Quota: 100, Window: time.Minute},
		{Name: "daily", Unit: "requests", Quota: 1000, Window: 24 * time.Hour},
		{Unit: "requests", Quota: 10, Window: time.Second},
	}
	if got := r.RequestPolicies(); !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if got := (Reading{Policies: []Policy{{Quota: 3, Window: time.Second}}}).RequestPolicies(); len(got) != 1 {
		t.Errorf("got %v, want the policy with no unit counted as requests", got)
	}
}

func TestStrings(t *testing.T) {
	tests := []struct{ got, want string }{
		{Quota{Name: "default", Unit: "requests", Limit: 40, Remaining: 0, Reset: time.Second, HasReset: true}.String(), `"default" 0/40 requests left, resets in 1s`},
		{Quota{Unit: "requests", Remaining: 5}.String(), `"" 5/? requests left, reset unknown`},
		{Policy{Name: "burst", Unit: "requests", Quota: 100, Window: time.Minute}.String(), `"burst" 100 requests per 1m0s`},
		{Policy{Name: "open", Unit: "requests", Quota: 5}.String(), `"open" 5 requests per unknown window`},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}
