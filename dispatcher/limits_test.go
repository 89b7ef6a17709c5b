package dispatcher

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/metrics"
)

// TestFollowShowsOperatorLimits: an operator's change reaches a running
// dispatcher's bucket, and the effective-rate gauge shows it with source
// operator in place of the configured limit's series.
func TestFollowShowsOperatorLimits(t *testing.T) {
	rdb := srv.Client(t)
	reg := prometheus.NewRegistry()
	d, err := New(rdb, Config{Logger: quietLogger(), Metrics: metrics.New(reg), Upstreams: []shaper.Upstream{
		{Name: "livelimits", BaseURL: "http://127.0.0.1:1", Limits: []leaky.Limit{leaky.PerSecond(5)}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.followLimits(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	series := func() map[string]float64 {
		out := map[string]float64{}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "shaper_upstream_limit_rate" {
				continue
			}
			for _, m := range mf.GetMetric() {
				var src, lim string
				for _, lp := range m.GetLabel() {
					switch lp.GetName() {
					case "source":
						src = lp.GetValue()
					case "limit":
						lim = lp.GetValue()
					}
				}
				out[lim+" "+src] = m.GetGauge().GetValue()
			}
		}
		return out
	}
	if got := series(); got["requests/1s configured"] != 5 {
		t.Fatalf("before: got %v, want the configured 5/s", got)
	}
	u := d.ups["livelimits"]
	time.Sleep(100 * time.Millisecond) // Follow subscribes first
	if _, err := u.bucket.PutLimits(ctx, []leaky.Limit{leaky.PerSecond(2)}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(leaky.ApplyWithin)
	for series()["requests/1s operator"] != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("after the put: got %v, want requests/1s operator at 2 within %v", series(), leaky.ApplyWithin)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := series(); len(got) != 1 {
		t.Errorf("after the put: got %v, want the operator's series alone", got)
	}
	if got := u.bucket.Config().Limits; len(got) != 1 || got[0] != leaky.PerSecond(2) {
		t.Errorf("bucket paces at %v, want 2/s", got)
	}
}
