package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

var srv *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &srv) }

func TestUpstreamStatus(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	q, err := queue.New(rdb, queue.Config{Upstreams: []shaper.Upstream{
		{Name: "api", Lanes: map[string]int{"default": 1, "bulk": 1}, Limits: []leaky.Limit{leaky.PerSecond(100)}, Concurrency: 5},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	r, err := NewReader(rdb, q, "")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 30; i++ {
		if _, _, err := q.Enqueue(ctx, &queue.Job{Upstream: "api", Lane: []string{"default", "bulk", "bulk"}[i%3]}); err != nil {
			t.Fatal(err)
		}
	}
	// Idle: a backlog, nothing draining.
	u, err := r.Upstream(ctx, "api")
	if err != nil {
		t.Fatal(err)
	}
	if u.Backlog.Total != 30 || u.Backlog.Lanes["bulk"].Pending != 20 || u.TimeToDrainSeconds != nil || u.PausedUntil != nil {
		t.Fatalf("idle: %+v", u)
	}
	if u.Limits[0].Description != "100 requests per 1s" || u.Limits[0].SustainedPerSecond < 97 || u.Limits[0].SustainedPerSecond >= 100 {
		t.Fatalf("limits: %+v", u.Limits)
	}
	if l := u.Limits[0]; l.EffectiveRate != 100 || l.Source != SourceConfigured || l.Adaptive {
		t.Fatalf("a plain limit: got effective rate %v from %q (adaptive %v), want 100 from configured", l.EffectiveRate, l.Source, l.Adaptive)
	}
	if b, _ := json.Marshal(u.StatedLimits); string(b) != "[]" {
		t.Fatalf("stated limits JSON: got %s, want []", b)
	}
	if u.AtLimitSeconds < 0.3 || u.AtLimitSeconds > 0.32 {
		t.Fatalf("time at the limit %v, want 30 jobs at 98/s", u.AtLimitSeconds)
	}
	// Sends recorded 2-11 seconds ago: 10 per second.
	rec := jobstore.NewRecorder(rdb, "")
	now := time.Now()
	for s := 2; s <= 11; s++ {
		for i := 0; i < 10; i++ {
			rec.Sent("api", now.Add(-time.Duration(s)*time.Second))
		}
	}
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	u, err = r.Upstream(ctx, "api")
	if err != nil {
		t.Fatal(err)
	}
	if u.DrainRate.Last10s != 10 || u.DrainRate.Last60s < 1.6 || u.DrainRate.Last60s > 1.7 {
		t.Fatalf("drain rates %+v, want 10/s over 10s and 100/60 over 60s", u.DrainRate)
	}
	if u.TimeToDrainSeconds == nil || *u.TimeToDrainSeconds != 3 {
		t.Fatalf("time to drain %v, want 30 jobs at 10/s = 3s", u.TimeToDrainSeconds)
	}
	// Paused: no estimate, and the reason shows.
	b, _ := r.Bucket("api")
	if _, err := b.Block(ctx, time.Minute, "maintenance"); err != nil {
		t.Fatal(err)
	}
	u, _ = r.Upstream(ctx, "api")
	if u.PausedUntil == nil || u.PauseReason != "maintenance" || u.TimeToDrainSeconds != nil {
		t.Fatalf("paused: %+v", u)
	}
	all, err := r.All(ctx)
	if err != nil || len(all) != 1 {
		t.Fatalf("All: %v %v", all, err)
	}
	if _, err := r.Upstream(ctx, "nope"); !errors.Is(err, queue.ErrUnknownUpstream) {
		t.Fatalf("unknown upstream: %v", err)
	}
}

// TestPartitionBacklog: status counts the partitions with jobs not yet
// finished and lists the busiest TopPartitions of them, most first; a job
// that finishes (here, cancelled) leaves the count.
func TestPartitionBacklog(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	q, err := queue.New(rdb, queue.Config{Upstreams: []shaper.Upstream{
		{Name: "mail", Limits: []leaky.Limit{leaky.PerSecond(200)}, PartitionLimits: []leaky.Limit{leaky.PerMinute(100)}},
		{Name: "plain", Limits: []leaky.Limit{leaky.PerSecond(10)}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	r, err := NewReader(rdb, q, "")
	if err != nil {
		t.Fatal(err)
	}
	// Partition p00 gets 1 job, p01 2, ... p11 12 (78 jobs), and two jobs
	// have no partition.
	var first *queue.Info
	for p := 0; p < TopPartitions+2; p++ {
		for i := 0; i <= p; i++ {
			info, _, err := q.Enqueue(ctx, &queue.Job{Upstream: "mail", Tenant: "billing", Partition: fmt.Sprintf("p%02d", p)})
			if err != nil {
				t.Fatal(err)
			}
			if p == TopPartitions+1 && first == nil {
				first = info
			}
		}
	}
	for i := 0; i < 2; i++ {
		if _, _, err := q.Enqueue(ctx, &queue.Job{Upstream: "mail", Tenant: "billing"}); err != nil {
			t.Fatal(err)
		}
	}
	u, err := r.Upstream(ctx, "mail")
	if err != nil {
		t.Fatal(err)
	}
	if u.Backlog.Total != 80 {
		t.Fatalf("backlog: got %d, want 80", u.Backlog.Total)
	}
	if u.Partitions.WithBacklog != TopPartitions+2 {
		t.Fatalf("partitions with backlog: got %d, want %d", u.Partitions.WithBacklog, TopPartitions+2)
	}
	if len(u.Partitions.Top) != TopPartitions {
		t.Fatalf("top: got %d entries, want %d: %+v", len(u.Partitions.Top), TopPartitions, u.Partitions.Top)
	}
	for i, got := range u.Partitions.Top {
		p := TopPartitions + 1 - i
		want := PartitionBacklog{Partition: fmt.Sprintf("p%02d", p), Backlog: int64(p + 1)}
		if got != want {
			t.Fatalf("top[%d]: got %+v, want %+v", i, got, want)
		}
	}
	// A cancelled job is finished: p11 drops to 11 jobs, level with p10.
	if _, err := q.Cancel(ctx, first.ID, "billing"); err != nil {
		t.Fatal(err)
	}
	u, err = r.Upstream(ctx, "mail")
	if err != nil {
		t.Fatal(err)
	}
	if got := u.Partitions.Top[0]; got.Backlog != 11 {
		t.Fatalf("after a cancel, top[0]: got %+v, want a backlog of 11", got)
	}

	// No partitions: zero, and an empty list (not null) in the JSON.
	u, err = r.Upstream(ctx, "plain")
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(u.Partitions)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), `{"with_backlog":0,"top":[]}`; got != want {
		t.Fatalf("JSON: got %s, want %s", got, want)
	}
}

// TestShowLimits: each configured limit shows the rate the fleet paces it
// at, from the bucket's State.Limits, and where that rate comes from; the
// upstream's stated limits are listed on their own.
func TestShowLimits(t *testing.T) {
	req := leaky.PerSecond(100)
	adaptive := leaky.Limit{Rate: 100, Per: time.Second, Adaptive: true}
	tokens := leaky.Limit{Rate: 600, Per: time.Second, Cost: "tokens"}
	stated := func(rate int64, per time.Duration, cost string) leaky.LimitState {
		return leaky.LimitState{Limit: leaky.Limit{Rate: rate, Per: per, Cost: cost}, Rate: float64(rate), Source: leaky.SourceStated}
	}
	type eff struct {
		rate   float64
		source string
	}
	cases := []struct {
		name       string
		configured []leaky.Limit
		states     []leaky.LimitState
		want       []eff
		wantStated []string
	}{
		{"no dynamic state read", []leaky.Limit{req, adaptive, tokens}, nil,
			[]eff{{100, "configured"}, {100, "adaptive"}, {600, "configured"}}, nil},
		{"as configured", []leaky.Limit{req, tokens},
			[]leaky.LimitState{{Limit: req, Rate: 100, Source: "configured"}, {Limit: tokens, Rate: 600, Source: "configured"}},
			[]eff{{100, "configured"}, {600, "configured"}}, nil},
		{"adaptive below its ceiling", []leaky.Limit{adaptive},
			[]leaky.LimitState{{Limit: adaptive, Rate: 37.5, Source: "adaptive"}},
			[]eff{{37.5, "adaptive"}}, nil},
		{"stated lower caps the configured", []leaky.Limit{req, tokens},
			[]leaky.LimitState{{Limit: req, Rate: 100, Source: "configured"}, {Limit: tokens, Rate: 600, Source: "configured"}, stated(40, time.Second, "")},
			[]eff{{40, "stated"}, {600, "configured"}}, []string{"40 requests per 1s"}},
		{"stated over another window, at its long-run rate", []leaky.Limit{req},
			[]leaky.LimitState{{Limit: req, Rate: 100, Source: "configured"}, stated(3000, time.Minute, "")},
			[]eff{{50, "stated"}}, []string{"3000 requests per 1m0s"}},
		{"stated higher changes nothing", []leaky.Limit{req},
			[]leaky.LimitState{{Limit: req, Rate: 100, Source: "configured"}, stated(500, time.Second, "")},
			[]eff{{100, "configured"}}, []string{"500 requests per 1s"}},
		{"stated below an adaptive limit's current rate", []leaky.Limit{adaptive},
			[]leaky.LimitState{{Limit: adaptive, Rate: 80, Source: "adaptive"}, stated(20, 500*time.Millisecond, "")},
			[]eff{{40, "stated"}}, []string{"20 requests per 500ms"}},
		{"stated tokens cap only the token limit", []leaky.Limit{req, tokens},
			[]leaky.LimitState{{Limit: req, Rate: 100, Source: "configured"}, {Limit: tokens, Rate: 600, Source: "configured"}, stated(12000, time.Minute, "tokens")},
			[]eff{{100, "configured"}, {200, "stated"}}, []string{"12000 tokens per 1m0s (burst 3000)"}},
		{"the lowest of several stated", []leaky.Limit{req},
			[]leaky.LimitState{{Limit: req, Rate: 100, Source: "configured"}, stated(90, time.Second, ""), stated(60, time.Second, "")},
			[]eff{{60, "stated"}}, []string{"90 requests per 1s", "60 requests per 1s"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			shown, st := showLimits(c.configured, 20*time.Millisecond, c.states)
			if len(shown) != len(c.want) {
				t.Fatalf("got %d limits, want %d", len(shown), len(c.want))
			}
			for i, w := range c.want {
				l := shown[i]
				if l.EffectiveRate != w.rate || l.Source != w.source {
					t.Errorf("limit %d (%s): got %v from %q, want %v from %q", i, l.Description, l.EffectiveRate, l.Source, w.rate, w.source)
				}
				if l.Rate != c.configured[i].Rate || l.Adaptive != c.configured[i].Adaptive {
					t.Errorf("limit %d: got rate %d adaptive %v, want the configured %v", i, l.Rate, l.Adaptive, c.configured[i])
				}
			}
			var got []string
			for _, s := range st {
				got = append(got, s.Description)
				if s.Source != SourceStated || s.EffectiveRate != float64(s.Rate) {
					t.Errorf("stated %s: got source %q, effective %v", s.Description, s.Source, s.EffectiveRate)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(c.wantStated) {
				t.Errorf("stated: got %v, want %v", got, c.wantStated)
			}
		})
	}
	// The JSON of an adaptive limit paced below its ceiling.
	shown, _ := showLimits([]leaky.Limit{adaptive}, 20*time.Millisecond, []leaky.LimitState{{Limit: adaptive, Rate: 37.5, Source: "adaptive"}})
	b, err := json.Marshal(shown[0])
	if err != nil {
		t.Fatal(err)
	}
	want := `{"rate":100,"per":"1s","burst":0,"description":"100 requests per 1s","sustained_per_second":98.03921568627452,"adaptive":true,"effective_rate":37.5,"source":"adaptive"}`
	if string(b) != want {
		t.Errorf("JSON: got %s, want %s", b, want)
	}
}
