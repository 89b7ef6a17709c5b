package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/drain"
	"github.com/shaperhq/shaper/internal/redistest"
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
	if u.AtLimitSeconds < 0.3 || u.AtLimitSeconds > 0.32 {
		t.Fatalf("time at the limit %v, want 30 jobs at 98/s", u.AtLimitSeconds)
	}
	// Sends recorded 2-11 seconds ago: 10 per second.
	rec := drain.NewRecorder(rdb, "")
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

// TestDrainKeysExpire: the per-second counts never outlive drain.Keep.
func TestDrainKeysExpire(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	rec := drain.NewRecorder(rdb, "")
	rec.Sent("api", time.Now())
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	keys, _ := rdb.Keys(ctx, "shaper:drain:*").Result()
	if len(keys) != 1 {
		t.Fatalf("keys %v", keys)
	}
	if ttl := rdb.TTL(ctx, keys[0]).Val(); ttl <= 0 || ttl > drain.Keep {
		t.Fatalf("TTL %v, want within %v", ttl, drain.Keep)
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
