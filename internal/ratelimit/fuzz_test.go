package ratelimit

import (
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
)

// FuzzRead feeds arbitrary values to every header Read looks at and holds
// it to what its callers rely on: no panic, nothing negative, a reset only
// when known, and the same Reading for the same answer. Run it for longer
// with `go test -run '^$' -fuzz FuzzRead -fuzztime 30s ./internal/ratelimit`.
func FuzzRead(f *testing.F) {
	f.Add(`"default";q=100;w=10`, `"default";r=50;t=30`, "100, 100;w=60", "0", "6m0s", "120")
	f.Add(`"burst";q=100;w=60,"daily";q=1000;w=86400`, `"daily";r=0;t=36000`, "10", "-1", "1691591363", "Wed, 09 Aug 2023 14:29:23 GMT")
	f.Add("100;w=60", "limit=100, remaining=25, reset=5", `10, 10;w=1, 1000;w=3600;comment="hour"`, "5", "12ms", "1.5")
	f.Add(`"peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:`, "\"a\";r=1\n\"b\";r=2;t=1", "", "4999.5", "2023-08-09T14:29:23Z", "")
	f.Add(`"x";q=1;w=999999999999999`, `"x";r=-5;t=999999999999999`, "-3;w=-1", "99999999999999999999", "1e308", "-1")
	f.Add("(", ",", ";", "", "1h1h", "Wednesday, 09-Aug-23 14:29:23 GMT")
	f.Fuzz(func(t *testing.T, policy, limit, oldLimit, remaining, reset, retryAfter string) {
		h := http.Header{}
		add := func(key, v string) {
			// A newline splits a value into repeated field lines.
			for _, line := range strings.Split(v, "\n") {
				h.Add(key, line)
			}
		}
		add("RateLimit-Policy", policy)
		add("RateLimit", limit)
		add("RateLimit-Limit", oldLimit)
		add("Retry-After", retryAfter)
		for _, p := range []string{"RateLimit-", "X-RateLimit-", "X-Rate-Limit-"} {
			add(p+"Remaining", remaining)
			add(p+"Reset", reset)
			add(p+"Limit", oldLimit)
		}
		add("X-RateLimit-Used", remaining)
		add("X-RateLimit-Reset-After", retryAfter)
		add("X-RateLimit-Resource", policy)
		for _, unit := range []string{"requests", "tokens"} {
			add("X-Ratelimit-Remaining-"+unit, remaining)
			add("X-Ratelimit-Reset-"+unit, reset)
			add("X-Ratelimit-Limit-"+unit, oldLimit)
			add("Anthropic-Ratelimit-"+unit+"-Remaining", remaining)
			add("Anthropic-Ratelimit-"+unit+"-Reset", reset)
		}

		r := Read(h, now)
		if all := readAll(h, now); !reflect.DeepEqual(r, all) {
			t.Fatalf("the scan for rate-limit names changed the reading:\n%+v\n%+v", r, all)
		}
		if again := Read(h, now); !reflect.DeepEqual(r, again) {
			t.Fatalf("two reads differ:\n%+v\n%+v", r, again)
		}
		if r.RetryAfter < 0 {
			t.Errorf("got retry after %v, want >= 0", r.RetryAfter)
		}
		for _, q := range r.Quotas {
			if q.Remaining < 0 || q.Limit < 0 || q.Reset < 0 || q.Unit == "" {
				t.Errorf("got quota %+v, want no negative field and a unit", q)
			}
			if !q.HasReset && q.Reset != 0 {
				t.Errorf("got quota %+v, want no reset when none is known", q)
			}
			if d := q.NextUnit(); d < 0 || (q.Reset > 0 && d > max(q.Reset, time.Microsecond)) {
				t.Errorf("quota %+v: got next unit %v, want within [0, %v]", q, d, q.Reset)
			}
			_ = q.String()
		}
		for _, p := range r.Policies {
			if p.Quota <= 0 || p.Window < 0 || p.Unit == "" {
				t.Errorf("got policy %+v, want a positive quota, no negative window and a unit", p)
			}
			_ = p.String()
		}
		if q, ok := r.Exhausted(); ok {
			if q.Remaining != 0 {
				t.Errorf("got exhausted quota %+v with something remaining", q)
			}
			for _, c := range r.Quotas {
				if c.Remaining == 0 && c.Reset > q.Reset {
					t.Errorf("got exhausted %+v, but %+v resets later", q, c)
				}
			}
		}
		for _, p := range r.RequestPolicies() {
			if p.Unit != "requests" || p.Quota <= 0 || p.Window <= 0 {
				t.Errorf("got request policy %+v", p)
			}
		}
	})
}
