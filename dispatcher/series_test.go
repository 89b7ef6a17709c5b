package dispatcher

import (
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/metrics"
)

// TestDocumentedSeriesExistFromStart: right after New, before any job, a
// worker exports every documented per-upstream series of each configured
// upstream at 0, so that rate() and alerts over them see data from the first
// scrape rather than only after the first 429.
func TestDocumentedSeriesExistFromStart(t *testing.T) {
	rdb := srv.Client(t)
	reg := prometheus.NewRegistry()
	_, err := New(rdb, Config{Logger: quietLogger(), Metrics: metrics.New(reg), Upstreams: []shaper.Upstream{
		{Name: "alpha", BaseURL: "http://127.0.0.1:1", Limits: []leaky.Limit{leaky.PerSecond(5)}},
		{Name: "beta", BaseURL: "http://127.0.0.1:1", Limits: []leaky.Limit{leaky.PerSecond(50)}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	histograms := map[string]bool{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, lp := range m.GetLabel() {
				labels = append(labels, lp.GetName()+`="`+lp.GetValue()+`"`)
			}
			sort.Strings(labels)
			name := mf.GetName() + "{" + strings.Join(labels, ",") + "}"
			got[name] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
			if m.GetHistogram() != nil {
				histograms[name] = true
			}
		}
	}
	for _, up := range []string{"alpha", "beta"} {
		u := `upstream="` + up + `"`
		want := []string{
			"shaper_pacing_late_slots_total{" + u + "}",
			"shaper_dispatch_in_flight{" + u + "}",
			"shaper_upstream_paused{" + u + "}",
		}
		for _, o := range []string{"succeeded", "retry", "dead", "deferred", "expired"} {
			want = append(want, `shaper_dispatches_total{outcome="`+o+`",`+u+"}")
		}
		for _, c := range []string{"2xx", "3xx", "4xx", "429", "5xx", "error"} {
			want = append(want, `shaper_upstream_responses_total{class="`+c+`",`+u+"}")
		}
		for _, r := range []string{"429", "quota_exhausted", "stated_limit"} {
			want = append(want, `shaper_upstream_blocks_total{reason="`+r+`",`+u+"}")
		}
		for _, s := range want {
			v, ok := got[s]
			if !ok {
				t.Errorf("%s: missing after New", s)
			} else if v != 0 {
				t.Errorf("%s: got %v, want 0", s, v)
			}
		}
		for _, h := range []string{"shaper_pacing_wait_seconds{" + u + "}", "shaper_upstream_request_duration_seconds{" + u + "}"} {
			if !histograms[h] {
				t.Errorf("%s: missing after New", h)
			}
		}
	}
}
