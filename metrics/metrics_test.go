package metrics

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestLint exposes every metric with a sample of each label set and holds
// the lot to promlint.
func TestLint(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.AdmissionDecisions.WithLabelValues("allowed").Inc()
	m.AdmissionFailOpen.Inc()
	m.JobsEnqueued.WithLabelValues("stripe", "default").Inc()
	m.JobsRejected.WithLabelValues("stripe", "invalid").Inc()
	m.Dispatches.WithLabelValues("stripe", "succeeded").Inc()
	m.UpstreamResponses.WithLabelValues("stripe", "2xx").Inc()
	m.PacingWait.WithLabelValues("stripe").Observe(0.01)
	m.LateSlots.WithLabelValues("stripe").Inc()
	m.InFlight.WithLabelValues("stripe").Set(1)
	m.UpstreamPaused.WithLabelValues("stripe").Set(0)
	m.UpstreamBlocks.WithLabelValues("stripe", "429").Inc()
	m.RedisErrors.WithLabelValues("pacing").Inc()
	m.RequestDuration.WithLabelValues("stripe").Observe(0.2)
	err := RegisterBacklog(reg, func(ctx context.Context) (map[string]map[string]int64, error) {
		return map[string]map[string]int64{"stripe": {"default": 12}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	mfs, _ := reg.Gather()
	if len(mfs) != 14 {
		t.Fatalf("gathered %d metric families, want all 14", len(mfs))
	}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "shaper_") {
			t.Errorf("%s lacks the shaper_ namespace", mf.GetName())
		}
	}
	if got := testutil.ToFloat64(m.AdmissionFailOpen); got != 1 {
		t.Fatalf("fail-open counter %v, want 1", got)
	}
}

func TestOrDiscard(t *testing.T) {
	if OrDiscard(nil) == nil {
		t.Fatal("OrDiscard(nil) returned nil")
	}
	m := New(prometheus.NewRegistry())
	if OrDiscard(m) != m {
		t.Fatal("OrDiscard replaced a given Metrics")
	}
}
