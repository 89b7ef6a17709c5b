package server

import (
	"fmt"
	"strings"
	"testing"
)

// TestPutLimits: admin keys replace an upstream's limits and a
// partition's, checked as the config is; a refusal changes nothing.
func TestPutLimits(t *testing.T) {
	f := newFixture(t, generous, 1000)
	admin := []string{"Authorization", "Bearer ops-secret"}
	limitsOf := func() string {
		t.Helper()
		_, body := f.do("GET", "/v1/upstreams/openai", "")
		var parts []string
		ls, _ := body["limits"].([]any)
		for _, l := range ls {
			m := l.(map[string]any)
			parts = append(parts, fmt.Sprintf("%v/%v %v %v", m["rate"], m["per"], m["cost"], m["source"]))
		}
		return strings.Join(parts, "; ")
	}
	configured := "5000/1m0s <nil> configured; 800000/1m0s tokens configured"
	if got := limitsOf(); got != configured {
		t.Fatalf("before: got %s, want %s", got, configured)
	}
	for _, tc := range []struct {
		name, body string
		key        []string
		code       int
		field      string // of the first error
	}{
		{"no key", `{"limits":[{"rate":10,"per":"1s"}]}`, []string{"Authorization", ""}, 401, ""},
		{"not admin", `{"limits":[{"rate":10,"per":"1s"}]}`, nil, 403, ""},
		{"no limits", `{}`, admin, 400, "limits"},
		{"empty", `{"limits":[]}`, admin, 400, "limits"},
		{"rate 0", `{"limits":[{"rate":0,"per":"1s"},{"rate":1000,"per":"1m","cost":"tokens"}]}`, admin, 400, "limits[0]"},
		{"bad per", `{"limits":[{"rate":10,"per":"soon"}]}`, admin, 400, "limits[0].per"},
		{"bad cost", `{"limits":[{"rate":10,"per":"1s"},{"rate":1000,"per":"1m","cost":"Tokens"}]}`, admin, 400, "limits[1]"},
		{"burst over rate", `{"limits":[{"rate":10,"per":"1s","burst":11}]}`, admin, 400, "limits[0]"},
		{"unknown field", `{"limits":[{"rate":10,"per":"1s","speed":3}]}`, admin, 400, ""},
		// The partition limits count tokens, which the new limits must too.
		{"drops a counted cost", `{"limits":[{"rate":10,"per":"1s"}]}`, admin, 400, "limits"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := f.do("PUT", "/v1/upstreams/openai/limits", tc.body, tc.key...)
			if resp.StatusCode != tc.code {
				t.Fatalf("got %d %v, want %d", resp.StatusCode, body, tc.code)
			}
			if tc.field != "" {
				errs, _ := body["errors"].([]any)
				if len(errs) == 0 || errs[0].(map[string]any)["field"] != tc.field {
					t.Errorf("got errors %v, want the first to name %s", body["errors"], tc.field)
				}
			}
			if got := limitsOf(); got != configured {
				t.Errorf("after a refused put: got limits %s, want them unchanged: %s", got, configured)
			}
		})
	}
	if resp, _ := f.do("PUT", "/v1/upstreams/nope/limits", `{"limits":[{"rate":10,"per":"1s"}]}`, admin...); resp.StatusCode != 404 {
		t.Errorf("unknown upstream: got %d, want 404", resp.StatusCode)
	}
	resp, body := f.do("PUT", "/v1/upstreams/openai/limits", `{"limits":[{"rate":100,"per":"1s"},{"rate":400000,"per":"1m","cost":"tokens"}]}`, admin...)
	if resp.StatusCode != 200 || body["override"] == nil {
		t.Fatalf("put: got %d %v, want 200 and the override shown", resp.StatusCode, body)
	}
	if got, want := limitsOf(), "100/1s <nil> operator; 400000/1m0s tokens operator"; got != want {
		t.Errorf("after the put: got %s, want %s", got, want)
	}
	if resp, _ := f.do("DELETE", "/v1/upstreams/openai/limits", "", nil...); resp.StatusCode != 403 {
		t.Errorf("delete with a producer key: got %d, want 403", resp.StatusCode)
	}
	resp, body = f.do("DELETE", "/v1/upstreams/openai/limits", "", admin...)
	if resp.StatusCode != 200 || body["override"] != nil {
		t.Fatalf("delete: got %d %v", resp.StatusCode, body)
	}
	if got := limitsOf(); got != configured {
		t.Errorf("after the delete: got %s, want %s", got, configured)
	}

	// One partition.
	path := "/v1/upstreams/openai/partitions/acme/limits"
	if resp, body := f.do("PUT", path, `{"limits":[{"rate":10,"per":"1s","cost":"words"}]}`, admin...); resp.StatusCode != 400 {
		t.Errorf("partition limit on a cost not counted: got %d %v, want 400", resp.StatusCode, body)
	}
	if resp, _ := f.do("PUT", path, `{"limits":[{"rate":10,"per":"1s"}]}`); resp.StatusCode != 403 {
		t.Errorf("partition put with a producer key: got %d, want 403", resp.StatusCode)
	}
	// A partition's name may be a tenant's customer: only admin keys read
	// its limits.
	if resp, _ := f.do("GET", path, ""); resp.StatusCode != 403 {
		t.Errorf("partition get with a producer key: got %d, want 403", resp.StatusCode)
	}
	if resp, body := f.do("GET", path, "", admin...); resp.StatusCode != 200 || body["source"] != "configured" {
		t.Errorf("partition before: got %d %v, want its configured partition_limits", resp.StatusCode, body)
	}
	resp, body = f.do("PUT", path, `{"limits":[{"rate":20000,"per":"1m","cost":"tokens"}]}`, admin...)
	if resp.StatusCode != 200 || body["source"] != "operator" {
		t.Fatalf("partition put: got %d %v", resp.StatusCode, body)
	}
	resp, body = f.do("DELETE", path, "", admin...)
	if resp.StatusCode != 200 || body["source"] != "configured" {
		t.Errorf("partition delete: got %d %v", resp.StatusCode, body)
	}
}
