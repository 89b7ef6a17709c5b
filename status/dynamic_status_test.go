package status

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// TestStatusShowsDynamicLimits: a limit the upstream states and an
// adaptive limit cut by pushback, set through the bucket as the
// dispatcher sets them, show in the status every reader sees.
func TestStatusShowsDynamicLimits(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	q, err := queue.New(rdb, queue.Config{Upstreams: []shaper.Upstream{
		{Name: "vendor", Limits: []leaky.Limit{{Rate: 100, Per: time.Second, Adaptive: true}}},
		{Name: "api", Limits: []leaky.Limit{leaky.PerSecond(100), {Rate: 600, Per: time.Second, Cost: "tokens"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	r, err := NewReader(rdb, q, "")
	if err != nil {
		t.Fatal(err)
	}
	api, _ := r.Bucket("api")
	if _, err := api.Learn(ctx, []leaky.Limit{{Rate: 40, Per: time.Second}}); err != nil {
		t.Fatal(err)
	}
	u, err := r.Upstream(ctx, "api")
	if err != nil {
		t.Fatal(err)
	}
	if l := u.Limits[0]; l.EffectiveRate != 40 || l.Source != SourceStated {
		t.Errorf("api requests: got %v from %q, want 40 from stated", l.EffectiveRate, l.Source)
	}
	if l := u.Limits[1]; l.EffectiveRate != 600 || l.Source != SourceConfigured {
		t.Errorf("api tokens: got %v from %q, want 600 configured", l.EffectiveRate, l.Source)
	}
	if len(u.StatedLimits) != 1 || u.StatedLimits[0].Description != "40 requests per 1s" {
		t.Errorf("api stated: got %+v", u.StatedLimits)
	}
	b, _ := json.Marshal(u)
	if !strings.Contains(string(b), `"effective_rate":40,"source":"stated"`) {
		t.Errorf("JSON: %s", b)
	}

	vendor, _ := r.Bucket("vendor")
	if n, err := vendor.Feedback(ctx, true); err != nil || n != 1 {
		t.Fatalf("feedback: %d, %v", n, err)
	}
	u, err = r.Upstream(ctx, "vendor")
	if err != nil {
		t.Fatal(err)
	}
	if l := u.Limits[0]; l.Source != SourceAdaptive || !l.Adaptive || l.EffectiveRate < 80 || l.EffectiveRate > 90 {
		t.Errorf("vendor: got %v from %q, want about 85 from adaptive", l.EffectiveRate, l.Source)
	}
	t.Logf("vendor after one cut: %+v", u.Limits[0])
}
