package shaper

import (
	"slices"
	"strings"
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
		{"ResultMaxCount", u.ResultMaxCount, DefaultResultMaxCount},
		{"DeadMaxCount", u.DeadMaxCount, DefaultDeadMaxCount},
		{"IdempotencyWindow", u.IdempotencyWindow, DefaultIdempotencyWindow},
		{"PushbackDefault", u.PushbackDefault, DefaultPushback},
		{"IdempotencyHeader", u.IdempotencyHeader, DefaultIdempotencyHeader},
		{"Fairness.By", u.Fairness.By, FairByTenant},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.field, c.got, c.want)
		}
	}
	if got := u.LaneNames(); !slices.Equal(got, []string{DefaultLane}) {
		t.Errorf("LaneNames: got %v, want [%s]", got, DefaultLane)
	}

	// A partition limit with a short per shrinks the guard of the whole
	// upstream, as a short limit of its own would.
	short := Upstream{Limits: []leaky.Limit{leaky.PerSecond(10)}, PartitionOverrides: map[string][]leaky.Limit{"p": {{Rate: 1, Per: 100 * time.Millisecond}}}}.WithDefaults()
	if want := 2 * time.Millisecond; short.Guard != want {
		t.Errorf("Guard with a 100ms partition limit: got %v, want %v", short.Guard, want)
	}

	set := Upstream{Timeout: time.Second, Workers: 3, Retry: Retry{MaxAttempts: 2}, NoIdempotencyHeader: true, Fairness: Fairness{By: FairByNone}}.WithDefaults()
	if set.Timeout != time.Second || set.Workers != 3 || set.Retry.MaxAttempts != 2 || set.IdempotencyHeader != "" || set.Fairness.By != FairByNone {
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

func TestPartitionLimitsFor(t *testing.T) {
	general := []leaky.Limit{leaky.PerMinute(100)}
	gmail := []leaky.Limit{leaky.PerMinute(1000), {Rate: 5000, Per: time.Minute, Cost: "recipients"}}
	both := Upstream{PartitionLimits: general, PartitionOverrides: map[string][]leaky.Limit{"gmail.com": gmail}}
	onlyOverrides := Upstream{PartitionOverrides: map[string][]leaky.Limit{"gmail.com": gmail}}
	for _, c := range []struct {
		name      string
		u         Upstream
		partition string
		want      []leaky.Limit
	}{
		{"override", both, "gmail.com", gmail},
		{"general", both, "example.org", general},
		{"override is exact, not case-folded", both, "GMAIL.com", general},
		{"no partition", both, "", nil},
		{"only overrides, named", onlyOverrides, "gmail.com", gmail},
		{"only overrides, other", onlyOverrides, "example.org", nil},
		{"no partition limits", Upstream{Limits: general}, "example.org", nil},
	} {
		got := c.u.PartitionLimitsFor(c.partition)
		if !slices.Equal(got, c.want) || (got == nil) != (c.want == nil) {
			t.Errorf("%s: PartitionLimitsFor(%q): got %v, want %v", c.name, c.partition, got, c.want)
		}
	}
	if !both.HasPartitionLimits() || !onlyOverrides.HasPartitionLimits() || (Upstream{Limits: general}).HasPartitionLimits() {
		t.Errorf("HasPartitionLimits: got %v, %v, %v; want true, true, false",
			both.HasPartitionLimits(), onlyOverrides.HasPartitionLimits(), (Upstream{Limits: general}).HasPartitionLimits())
	}
}

func TestWeight(t *testing.T) {
	u := Upstream{Fairness: Fairness{By: FairByTenant, Weights: map[string]int{"billing": 3, "broken": 0}}}
	for _, c := range []struct {
		key  string
		want int
	}{
		{"billing", 3},
		{"ops", 1},
		{"", 1},
		{"broken", 1}, // a weight below 1 (refused by config) never stalls a tenant
	} {
		if got := u.Weight(c.key); got != c.want {
			t.Errorf("Weight(%q): got %d, want %d", c.key, got, c.want)
		}
	}
	if got := (Upstream{}).Weight("x"); got != 1 {
		t.Errorf("Weight with no weights: got %d, want 1", got)
	}
}

func TestCheckPartition(t *testing.T) {
	for _, c := range []struct {
		name, partition string
		want            string // "" for valid
	}{
		{"domain", "example.org", ""},
		{"customer id", "cus_9s6XKzkNRiz8i3", ""},
		{"spaces and unicode", "Café Ltd — ünïcode", ""},
		{"longest", strings.Repeat("a", MaxPartitionBytes), ""},
		{"multibyte at the limit", strings.Repeat("é", MaxPartitionBytes/2), ""},
		{"empty", "", "must not be empty"},
		{"too long", strings.Repeat("a", MaxPartitionBytes+1), "is 201 bytes: must be at most 200"},
		{"multibyte over the limit", strings.Repeat("é", MaxPartitionBytes/2+1), "is 202 bytes: must be at most 200"},
		{"invalid UTF-8", "ab\xffcd", "is not valid UTF-8"},
		{"newline", "a\nb", "holds a control character (U+000A at byte 1)"},
		{"NUL", "\x00", "holds a control character (U+0000 at byte 0)"},
		{"DEL", "x\x7f", "holds a control character (U+007F at byte 1)"},
		{"C1 control", "x\u0085", "holds a control character (U+0085 at byte 1)"},
	} {
		err := CheckPartition(c.partition)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: got %v, want valid", c.name, err)
		case c.want != "" && (err == nil || err.Error() != c.want):
			t.Errorf("%s: got %v, want %q", c.name, err, c.want)
		}
	}
}
