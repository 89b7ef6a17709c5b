package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shaperhq/shaper/tokenbucket"
)

// TestAPIRequestsAreCountedByRoute: every request is counted under the
// pattern it matched and its status code, and timed; paths that match no
// route share one label, so a thousand random paths add one series.
func TestAPIRequestsAreCountedByRoute(t *testing.T) {
	f := newFixture(t, tokenbucket.Limit{Capacity: 1000, Refill: 1000, Per: time.Second}, 1000)
	f.do("POST", "/v1/jobs", `{"upstream":"stripe","path":"/v1/charges"}`)
	f.do("POST", "/v1/jobs", `{"upstream":"stripe",`)
	f.do("GET", "/v1/jobs/does-not-exist", "")
	f.do("GET", "/healthz", "")
	for i := 0; i < 50; i++ {
		f.do("GET", fmt.Sprintf("/random/%d", i), "")
	}
	for _, tc := range []struct {
		route, code string
		want        float64
	}{
		{"POST /v1/jobs", "202", 1},
		{"POST /v1/jobs", "400", 1},
		{"GET /v1/jobs/{id}", "404", 1},
		{"GET /healthz", "200", 1},
		{"unmatched", "404", 50},
	} {
		if got := sample(t, f.reg, "shaper_api_requests_total", map[string]string{"route": tc.route, "code": tc.code}); got != tc.want {
			t.Errorf("shaper_api_requests_total{route=%q,code=%q}: got %v, want %v", tc.route, tc.code, got, tc.want)
		}
	}
	if n := families(t, f.reg)["shaper_api_request_duration_seconds"]; n != 4 {
		t.Errorf("got %d duration series, want one per route used (4)", n)
	}
	if n := families(t, f.reg)["shaper_build_info"]; n != 1 {
		t.Errorf("got %d shaper_build_info series, want 1", n)
	}
}

// sample is the value of the series of name whose labels include want
// (a counter's count, a histogram's sample count).
func sample(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if got[k] != v {
					continue next
				}
			}
			return m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return 0
}

// families counts the series of each metric family in reg.
func families(t *testing.T, reg *prometheus.Registry) map[string]int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, mf := range mfs {
		out[mf.GetName()] = len(mf.GetMetric())
	}
	return out
}
