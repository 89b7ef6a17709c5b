package server

import (
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shaperhq/shaper/tokenbucket"
)

// TestDocumentedSeriesExistFromStart: right after New, before any request,
// the API exports every documented per-upstream series at 0, so that a
// rate() or an alert over them has data from the first scrape.
func TestDocumentedSeriesExistFromStart(t *testing.T) {
	f := newFixture(t, tokenbucket.Limit{Capacity: 10, Refill: 10, Per: time.Second}, 1000)
	got := gatheredSeries(t, f.reg)
	want := []string{
		`shaper_jobs_enqueued_total{lane="default",upstream="stripe"}`,
		`shaper_jobs_enqueued_total{lane="bulk",upstream="stripe"}`,
		`shaper_jobs_enqueued_total{lane="default",upstream="mail"}`,
		`shaper_jobs_rejected_total{reason="unknown_upstream",upstream="unknown"}`,
		`shaper_upstream_blocks_total{reason="pause",upstream="openai"}`,
	}
	for _, up := range []string{"stripe", "openai", "mail"} {
		for _, r := range []string{"invalid", "rate_limited", "backlog_full", "store_error"} {
			want = append(want, `shaper_jobs_rejected_total{reason="`+r+`",upstream="`+up+`"}`)
		}
	}
	for _, r := range []string{"allowed", "denied", "fail_open", "fail_closed", "local"} {
		want = append(want, `shaper_admission_decisions_total{result="`+r+`"}`)
	}
	for _, s := range want {
		v, ok := got[s]
		if !ok {
			t.Errorf("%s: missing after New", s)
		} else if v != 0 {
			t.Errorf("%s: got %v, want 0", s, v)
		}
	}
	if _, ok := got[`shaper_jobs_enqueued_total{lane="bulk",upstream="mail"}`]; ok {
		t.Error("mail has no lane bulk, yet its series exists")
	}
}

// gatheredSeries is every counter and gauge series in reg, named as
// name{label="value",...} with labels sorted, and its value.
func gatheredSeries(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, lp := range m.GetLabel() {
				labels = append(labels, lp.GetName()+`="`+lp.GetValue()+`"`)
			}
			sort.Strings(labels)
			out[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return out
}
