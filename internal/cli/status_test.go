package cli

import (
	"bytes"
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper/status"
)

func TestHumanDuration(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0s"},
		{0, "0s"},
		{850400 * time.Microsecond, "850ms"},
		{12400 * time.Millisecond, "12s"},
		{200 * time.Second, "3m20s"},
		{59*time.Minute + 59600*time.Millisecond, "1h0m"},
		{2*time.Hour + 5*time.Minute + 10*time.Second, "2h5m"},
		{1000 * time.Hour, "42d"},
	} {
		if got := humanDuration(tc.d); got != tc.want {
			t.Errorf("humanDuration(%v): got %q, want %q", tc.d, got, tc.want)
		}
	}
}

func TestPartitionsLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    status.Partitions
		want string
	}{
		{"none", status.Partitions{Top: []status.PartitionBacklog{}}, ""},
		{"all shown", status.Partitions{WithBacklog: 2, Top: []status.PartitionBacklog{{Partition: "a.example", Backlog: 150}, {Partition: "b.example", Backlog: 3}}},
			"partitions with backlog: 2 (top: a.example 150, b.example 3)"},
		{"more than the top", status.Partitions{WithBacklog: 40, Top: []status.PartitionBacklog{{Partition: "a.example", Backlog: 150}, {Partition: "b.example", Backlog: 3}}},
			"partitions with backlog: 40 (top: a.example 150, b.example 3, …)"},
		{"ambiguous names quoted", status.Partitions{WithBacklog: 2, Top: []status.PartitionBacklog{{Partition: "acme, inc", Backlog: 7}, {Partition: "x y", Backlog: 1}}},
			`partitions with backlog: 2 (top: "acme, inc" 7, "x y" 1)`},
		{"no top listed", status.Partitions{WithBacklog: 5}, "partitions with backlog: 5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := partitionsLine(tc.p); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestHeldLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		u    status.Upstream
		want string
	}{
		{"none held", status.Upstream{Scheduled: 3, WaitingFor: map[string]int64{}}, ""},
		{"old server without the field", status.Upstream{Scheduled: 3}, ""},
		{"pause", status.Upstream{Scheduled: 40, WaitingFor: map[string]int64{"pause": 40}}, "scheduled 40, waiting for: pause 40"},
		{"in a fixed order, not_before jobs in the total", status.Upstream{Scheduled: 45, WaitingFor: map[string]int64{"limit": 3, "pushback": 40}},
			"scheduled 45, waiting for: pushback 40, limit 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := heldLine(tc.u); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLimitLines(t *testing.T) {
	req := status.Limit{Rate: 100, Per: "1s", EffectiveRate: 100, Source: status.SourceConfigured}
	tokens := status.Limit{Rate: 600, Per: "1s", Cost: "tokens", EffectiveRate: 600, Source: status.SourceConfigured}
	perMinute := status.Limit{Rate: 5000, Per: "1m0s", EffectiveRate: 5000, Source: status.SourceConfigured}
	adaptive := status.Limit{Rate: 100, Per: "1s", Adaptive: true, EffectiveRate: 37.5, Source: status.SourceAdaptive}
	stated := func(rate int64, per, cost string) status.Limit {
		return status.Limit{Rate: rate, Per: per, Cost: cost, EffectiveRate: float64(rate), Source: status.SourceStated}
	}
	for _, tc := range []struct {
		name string
		u    status.Upstream
		want []string
	}{
		{"as configured", status.Upstream{Limits: []status.Limit{req, tokens}}, nil},
		{"adaptive", status.Upstream{Limits: []status.Limit{adaptive}}, []string{"adaptive: pacing 37.5 per 1s (ceiling 100)"}},
		{"adaptive at its ceiling", status.Upstream{Limits: []status.Limit{{Rate: 50, Per: "1s", Adaptive: true, EffectiveRate: 50, Source: status.SourceAdaptive}}},
			[]string{"adaptive: pacing 50 per 1s (ceiling 50)"}},
		{"stated", status.Upstream{Limits: []status.Limit{req}, StatedLimits: []status.Limit{stated(40, "1s", "")}},
			[]string{"stated 40 per 1s, configured 100 per 1s"}},
		{"stated compared with the limit of its window", status.Upstream{Limits: []status.Limit{perMinute, req, tokens}, StatedLimits: []status.Limit{stated(40, "1s", "")}},
			[]string{"stated 40 per 1s, configured 100 per 1s"}},
		{"stated tokens", status.Upstream{Limits: []status.Limit{req, tokens}, StatedLimits: []status.Limit{stated(12000, "1m0s", "tokens")}},
			[]string{"stated 12000 tokens per 1m0s, configured 600 tokens per 1s"}},
		{"stated with no configured limit of its units", status.Upstream{Limits: []status.Limit{req}, StatedLimits: []status.Limit{stated(1000, "1m0s", "tokens")}},
			[]string{"stated 1000 tokens per 1m0s"}},
		{"adaptive and stated", status.Upstream{Limits: []status.Limit{adaptive}, StatedLimits: []status.Limit{stated(30, "1s", "")}},
			[]string{"adaptive: pacing 37.5 per 1s (ceiling 100)", "stated 30 per 1s, configured 100 per 1s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := limitLines(tc.u); !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestStatusWatchPlain: --watch into something that is not a terminal (a
// buffer, a pipe) prints plain snapshots a blank line apart, with no
// escape codes.
func TestStatusWatchPlain(t *testing.T) {
	good := writeFile(t, "good.yaml", strings.ReplaceAll(goodConfig, "%REDIS%", srv.URL()))
	var out, errOut bytes.Buffer
	f := &Factory{In: strings.NewReader(""), Out: &out, ErrOut: &errOut, LookupEnv: func(string) (string, bool) { return "", false }}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	if code := f.execute(ctx, []string{"status", "--config", good, "--watch", "--interval", "200ms"}); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	got := out.String()
	if strings.Contains(got, "\x1b") {
		t.Fatalf("output holds escape codes: %q", got)
	}
	snapshots := strings.Split(got, "\n\nshaper status — ")
	if len(snapshots) < 2 {
		t.Fatalf("got %d snapshot(s), want at least 2 a blank line apart:\n%s", len(snapshots), got)
	}
	if !strings.HasPrefix(got, "shaper status — ") {
		t.Errorf("output starts %q, want the first snapshot's header", got[:min(len(got), 40)])
	}
	for i, s := range snapshots {
		if !strings.Contains(s, "UPSTREAM") || !strings.Contains(s, "stripe") {
			t.Errorf("snapshot %d lacks the table:\n%s", i, s)
		}
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if isTerminal(w) {
		t.Errorf("isTerminal(pipe) = true, want false")
	}
}

// TestTimeToDrainColumn: the table says when the time to drain rests on the
// observed rate rather than the limit, and why there is none.
func TestTimeToDrainColumn(t *testing.T) {
	secs := func(v float64) *float64 { return &v }
	paused := time.Now().Add(time.Minute)
	for _, tc := range []struct {
		name string
		u    status.Upstream
		want string
	}{
		{"at the limit", status.Upstream{Backlog: status.Backlog{Total: 30}, TimeToDrainSeconds: secs(6), TimeToDrainBasis: status.BasisLimit}, "  6s\n"},
		{"observed", status.Upstream{Backlog: status.Backlog{Total: 30}, TimeToDrainSeconds: secs(15), TimeToDrainBasis: status.BasisObserved}, "  15s (observed rate)\n"},
		{"stalled", status.Upstream{Backlog: status.Backlog{Total: 30}, AtLimitSeconds: 6}, "  stalled (6s at the limit)\n"},
		{"paused", status.Upstream{Backlog: status.Backlog{Total: 30}, PausedUntil: &paused, AtLimitSeconds: 6}, "  paused\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.u.Name = "demo"
			var out bytes.Buffer
			printStatus(&out, []status.Upstream{tc.u}, time.Now())
			lines := strings.SplitAfter(out.String(), "\n")
			if len(lines) < 2 || !strings.HasSuffix(lines[1], tc.want) {
				t.Fatalf("got %q, want a row ending %q", out.String(), tc.want)
			}
		})
	}
}
