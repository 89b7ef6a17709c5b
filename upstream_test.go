package shaper

import (
	"slices"
	"testing"
	"time"

	"github.com/shaperhq/shaper/leaky"
)

func TestUpstreamWithDefaults(t *testing.T) {
	u := Upstream{Name: "api", Limits: []leaky.Limit{leaky.PerSecond(4000)}}.WithDefaults()
	checks := []struct {
		field     string
		got, want any
	}{
		{"Guard", u.Guard, leaky.DefaultGuardFor(u.Limits)},
		{"Timeout", u.Timeout, DefaultTimeout},
		{"MaxPending", u.MaxPending, int64(DefaultMaxPending)},
		{"Retry.MaxAttempts", u.Retry.MaxAttempts, DefaultMaxAttempts},
		{"Retry.MinBackoff", u.Retry.MinBackoff, DefaultMinBackoff},
		{"Retry.MaxBackoff", u.Retry.MaxBackoff, DefaultMaxBackoff},
		{"Workers", u.Workers, 100}, // 4000/s × 25ms
		{"MaxResponseBytes", u.MaxResponseBytes, int64(DefaultMaxResponseBytes)},
		{"ResultRetention", u.ResultRetention, DefaultResultRetention},
		{"DeadRetention", u.DeadRetention, DefaultDeadRetention},
		{"PushbackDefault", u.PushbackDefault, DefaultPushback},
		{"IdempotencyHeader", u.IdempotencyHeader, DefaultIdempotencyHeader},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.field, c.got, c.want)
		}
	}
	if got := u.LaneNames(); !slices.Equal(got, []string{DefaultLane}) {
		t.Errorf("LaneNames: got %v, want [%s]", got, DefaultLane)
	}

	set := Upstream{Timeout: time.Second, Workers: 3, Retry: Retry{MaxAttempts: 2}, NoIdempotencyHeader: true}.WithDefaults()
	if set.Timeout != time.Second || set.Workers != 3 || set.Retry.MaxAttempts != 2 || set.IdempotencyHeader != "" {
		t.Errorf("WithDefaults replaced set fields: %+v", set)
	}
}

func TestUpstreamNames(t *testing.T) {
	u := Upstream{
		Lanes:             map[string]int{"zeta": 1, DefaultLane: 2, "bulk": 1},
		Limits:            []leaky.Limit{leaky.PerSecond(1), {Rate: 10, Per: time.Second, Cost: "tokens"}, {Rate: 1, Per: time.Second, Cost: "bytes"}},
		Headers:           map[string]string{"Authorization": "Bearer x"},
		IdempotencyHeader: "Idempotency-Key",
	}
	for _, c := range []struct {
		name      string
		got, want []string
	}{
		{"LaneNames", u.LaneNames(), []string{DefaultLane, "bulk", "zeta"}},
		{"CostNames", u.CostNames(), []string{"bytes", "tokens"}},
		{"WorkerHeaders", u.WorkerHeaders(), []string{"Authorization", "Idempotency-Key"}},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
	if !u.HasLane("bulk") || u.HasLane("vip") {
		t.Errorf("HasLane: bulk %v, vip %v; want true, false", u.HasLane("bulk"), u.HasLane("vip"))
	}
}

func TestDefaultWorkers(t *testing.T) {
	for _, c := range []struct {
		concurrency int
		limits      []leaky.Limit
		want        int
	}{
		{0, []leaky.Limit{leaky.PerSecond(10)}, 10},
		{25, []leaky.Limit{leaky.PerSecond(10)}, 25},
		{0, []leaky.Limit{leaky.PerSecond(2000)}, 50},
		{0, []leaky.Limit{leaky.PerSecond(100000)}, 200},
		{0, []leaky.Limit{{Rate: 1e9, Per: time.Second, Cost: "tokens"}}, 10},
	} {
		if got := DefaultWorkers(c.concurrency, c.limits); got != c.want {
			t.Errorf("DefaultWorkers(%d, %v): got %d, want %d", c.concurrency, c.limits, got, c.want)
		}
	}
}
