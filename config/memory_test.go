package config

import (
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
)

// TestMemoryEstimate: each part of an upstream's estimate from its bounds,
// the records at the lowest sustained request rate, and the summary line.
func TestMemoryEstimate(t *testing.T) {
	c := shaper.MemoryCosts()
	u := &Upstream{MaxPending: 1000, ResultMaxCount: 200, DeadMaxCount: 100, IdempotencyWindow: Duration(time.Hour),
		Limits: []Limit{{Rate: 10, Per: Duration(time.Second)}, {Rate: 6000, Per: Duration(time.Hour)}, {Rate: 1, Per: Duration(time.Second), Cost: "tokens"}}}
	m := u.Memory()
	for _, tc := range []struct {
		name      string
		got, want int64
	}{
		{"backlog", m.Backlog, 1000 * (c.QueuedJob + EstimateBody)},
		{"succeeded", m.Succeeded, 200 * (c.FinishedJob + EstimateBody)},
		{"dead", m.Dead, 100 * (c.FinishedJob + 2*EstimateBody)},
		{"tombstones", m.Tombstones, 300 * c.Tombstone},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %d, want %d", tc.name, tc.got, tc.want)
		}
	}
	// 6000/h is the lower sustained rate (about 1.67/s against 10/s); the
	// cost limit does not count.
	if m.DrainPerSecond < 1.6 || m.DrainPerSecond > 1.67 {
		t.Errorf("drain: got %v/s, want about 1.67 (6000/h)", m.DrainPerSecond)
	}
	if want := int64(m.DrainPerSecond * 3600 * (1 + 2.0/24) * float64(c.IdempotencyRecord)); m.Records < want || m.Records > want+1 {
		t.Errorf("records: got %d, want %d", m.Records, want)
	}
	if m.Total() != m.Backlog+m.Succeeded+m.Dead+m.Tombstones+m.Records {
		t.Errorf("total %d is not the sum of the parts", m.Total())
	}
	line := m.describe(u)
	for _, want := range []string{"backlog 2.1 MiB (max_pending 1000)", "idempotency records", "for 1h0m0s"} {
		if !strings.Contains(line, want) {
			t.Errorf("summary line %q lacks %q", line, want)
		}
	}
	// Without a request limit the records have no rate to be counted at.
	u.Limits = nil
	if m := u.Memory(); m.Records != 0 || !strings.Contains(m.describe(u), "no request limit bounds them") {
		t.Errorf("no limits: got %d B of records, %q", m.Records, m.describe(u))
	}
}
