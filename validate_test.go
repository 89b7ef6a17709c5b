package shaper

import (
	"errors"
	"testing"
	"time"

	"github.com/shaperhq/shaper/leaky"
)

// Validate is the one check of an upstream built in Go: zero fields are
// defaults, and each problem names its field as a config file does.
func TestUpstreamValidate(t *testing.T) {
	ok := func(edit func(*Upstream)) Upstream {
		u := Upstream{Name: "api", BaseURL: "https://api.example.com", Limits: []leaky.Limit{leaky.PerSecond(100)}}
		edit(&u)
		return u
	}
	for _, tc := range []struct {
		name  string
		u     Upstream
		field string // "" with msg "": valid
		msg   string
	}{
		{"zero fields are defaults", ok(func(*Upstream) {}), "", ""},
		{"a Go handler's upstream has no base URL", ok(func(u *Upstream) { u.BaseURL = "" }), "", ""},
		{"name", ok(func(u *Upstream) { u.Name = "API" }), "", `not a valid upstream name (lowercase letters, digits, _ and -, starting with a letter or digit, at most 63: it becomes part of queue names and Redis keys); did you mean "api"?`},
		{"base URL", ok(func(u *Upstream) { u.BaseURL = "ftp://x" }), "base_url", `scheme "ftp": want an absolute http:// or https:// URL`},
		{"no limits", ok(func(u *Upstream) { u.Limits = nil }), "limits", "at least one limit is required (e.g. [{rate: 100, per: 1s}])"},
		{"adaptive cost limit", ok(func(u *Upstream) {
			u.Limits = []leaky.Limit{{Rate: 10, Per: time.Second, Cost: "tokens", Adaptive: true}}
		}),
			"limits[0].adaptive", "only request limits may be adaptive, and this one counts tokens (remove adaptive, or cost)"},
		{"guard too long", ok(func(u *Upstream) { u.Guard = time.Second }), "guard", "1s: must be at most a tenth of the shortest limit's per (100ms)"},
		{"backoffs crossed", ok(func(u *Upstream) { u.Retry.MinBackoff = time.Hour }), "retry", "min_backoff 1h0m0s is above max_backoff 5m0s (the default)"},
		{"lane without the default", ok(func(u *Upstream) { u.Lanes = map[string]int{"bulk": 1} }), "lanes", `must include "default", the lane of jobs that name none`},
		{"lane weight", ok(func(u *Upstream) { u.Lanes = map[string]int{"default": 1, "bulk": 0} }), "lanes.bulk", "weight 0: must be 1 to 1000"},
		{"store_response", ok(func(u *Upstream) { u.StoreResponse = "body" }), "store_response", `"body": want full (status, headers and body), headers (no body) or status`},
		{"managed header", ok(func(u *Upstream) { u.Headers = map[string]string{"Host": "x"} }), "headers.Host", "managed by the HTTP client (remove it)"},
		{"partition override without limits", ok(func(u *Upstream) { u.PartitionOverrides = map[string][]leaky.Limit{"gmail.com": nil} }),
			"partition_overrides.gmail.com", "no limits (an override replaces partition_limits for this partition; list at least one, e.g. [{rate: 1000, per: 1m}])"},
		{"negative retention", ok(func(u *Upstream) { u.DeadRetention = -time.Second }), "dead_retention", "-1s: must be positive"},
	} {
		err := tc.u.Validate()
		if tc.msg == "" {
			if err != nil {
				t.Errorf("%s: got %v, want valid", tc.name, err)
			}
			continue
		}
		var ps *Problems
		if !errors.As(err, &ps) || len(ps.List) != 1 {
			t.Errorf("%s: got %v, want one problem", tc.name, err)
			continue
		}
		if p := ps.List[0]; p.Field() != tc.field || p.Msg != tc.msg {
			t.Errorf("%s: got %q: %q, want %q: %q", tc.name, p.Field(), p.Msg, tc.field, tc.msg)
		}
	}
	if got, want := ok(func(u *Upstream) { u.Timeout, u.Workers = -time.Second, -1 }).Validate().Error(),
		"upstream api: timeout: -1s: must be positive; workers: -1: must be 0 (automatic) or more"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
