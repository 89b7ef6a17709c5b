package metrics

import (
	"context"
	"errors"
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
	m.UpstreamLimitRate.WithLabelValues("stripe", "requests/1s", "stated").Set(40)
	m.APIRequests.WithLabelValues("POST /v1/jobs", "202").Inc()
	m.APIRequestDuration.WithLabelValues("POST /v1/jobs").Observe(0.002)
	err := RegisterBacklog(reg, m, func(ctx context.Context) (map[string]map[string]int64, error) {
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
	if len(mfs) != 18 {
		t.Fatalf("gathered %d metric families, want all 18", len(mfs))
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

// TestBacklogReadFailure: a failed backlog read exports no backlog, leaves
// the rest of the scrape intact, and counts as a Redis error.
func TestBacklogReadFailure(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	fail := true
	err := RegisterBacklog(reg, m, func(ctx context.Context) (map[string]map[string]int64, error) {
		if fail {
			return nil, errors.New("redis: i/o timeout")
		}
		return map[string]map[string]int64{"stripe": {"default": 3}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	errs := m.RedisErrors.WithLabelValues("status")
	for i, want := range []struct {
		fail    bool
		backlog int // series of shaper_backlog_jobs
		errors  float64
	}{
		{fail: true, backlog: 0, errors: 1},
		{fail: true, backlog: 0, errors: 2},
		{fail: false, backlog: 1, errors: 2},
	} {
		fail = want.fail
		if got := testutil.CollectAndCount(reg, "shaper_backlog_jobs"); got != want.backlog {
			t.Errorf("scrape %d: got %d backlog series, want %d", i, got, want.backlog)
		}
		if got := testutil.ToFloat64(errs); got != want.errors {
			t.Errorf("scrape %d: got %v status Redis errors, want %v", i, got, want.errors)
		}
	}
	fail = true
	if _, err := reg.Gather(); err != nil {
		t.Fatalf("a failed backlog read failed the scrape: got %v, want the other metrics", err)
	}
}
