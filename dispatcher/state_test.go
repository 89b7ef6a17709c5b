package dispatcher

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/fakeupstream"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// TestPushbackTellsOneStory: an upstream that allows one request per 5s
// refuses the second with a Retry-After. While the fleet-wide block
// lasts, the job that met the 429 and those left untaken read scheduled,
// waiting for the pushback, in GET and in the counts; none is retrying or
// spent an attempt; and asynq's own Inspector shows the refused job's
// wait in words, with no failure recorded.
func TestPushbackTellsOneStory(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out an upstream allowing one request in 5 s: about 20 s, runs in make test")
	}
	ctx := context.Background()
	h := newHarness(t, fakeupstream.Config{Rate: 1, Per: 5 * time.Second, Style: fakeupstream.StylePlain}, shaper.Upstream{}, 3)
	d := h.start(Config{Upstreams: []shaper.Upstream{{Name: "api", Limits: []leaky.Limit{leaky.PerSecond(100)}, Workers: 4}}}, nil)
	var ids []string
	for i := range 5 {
		ids = append(ids, h.enqueue(&queue.Job{Upstream: "api", Path: fmt.Sprintf("/j/%d", i)}).ID)
	}
	// Wait (bounded) for the refusal and the block it places.
	for deadline := time.Now().Add(10 * time.Second); h.fake.Report().Rejected == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the upstream refused nothing")
		}
	}
	time.Sleep(200 * time.Millisecond)

	insp := asynq.NewInspectorFromRedisClient(h.rdb)
	defer insp.Close()
	waiting, refused := 0, 0
	for _, id := range ids {
		info, err := h.q.Get(ctx, id, "")
		if err != nil {
			t.Fatal(err)
		}
		if info.State == queue.StateSucceeded {
			continue
		}
		waiting++
		if info.State != queue.StateScheduled || info.WaitingFor != queue.WaitingPushback || info.Attempts != 0 || info.LastError != "" {
			t.Errorf("job %s during the block: %s waiting for %q, %d attempts, error %q; want scheduled, pushback, none, none",
				id, info.State, info.WaitingFor, info.Attempts, info.LastError)
		}
		ti, err := insp.GetTaskInfo(jobstore.QueueName("api"), id)
		if err != nil {
			t.Fatal(err)
		}
		if ti.State != asynq.TaskStateRetry {
			continue // untaken, in its flow
		}
		refused++
		if !strings.HasPrefix(ti.LastErr, "waiting for pushback: upstream blocked until 20") || !strings.HasSuffix(ti.LastErr, "Z (429 from upstream)") ||
			ti.Retried != 0 || !ti.LastFailedAt.IsZero() {
			t.Errorf("asynq's view of the refused job %s: last error %q, retried %d, last failed %v; want a readable wait, no failure",
				id, ti.LastErr, ti.Retried, ti.LastFailedAt)
		}
	}
	if waiting != 4 || refused == 0 || refused != int(h.fake.Report().Rejected) {
		t.Fatalf("%d jobs waiting, %d handed back, %d refused by the upstream; want 4 waiting, each refusal handed back",
			waiting, refused, h.fake.Report().Rejected)
	}
	held, err := h.q.ReadHeld(ctx, "api")
	if err != nil {
		t.Fatal(err)
	}
	c := held.Lanes[shaper.DefaultLane]
	if c.Retry != 0 || c.Pending != 0 || c.Scheduled != 4 || c.WaitingFor[queue.WaitingPushback] != 4 || held.BlockReason != queue.BlockRefused {
		t.Fatalf("counts during the block: %+v, block %q; want 4 scheduled waiting for the pushback, none retrying", c, held.BlockReason)
	}

	// Lifted as a resume does: every job goes, each on its first attempt.
	if err := d.ups["api"].bucket.Unblock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := h.q.RunDeferred(ctx, "api"); err != nil {
		t.Fatal(err)
	}
	h.fake.Reset()
	for id, info := range h.waitFor(ids, queue.StateSucceeded, queue.StateDead) {
		if info.State != queue.StateSucceeded {
			t.Errorf("job %s: %s (%s)", id, info.State, info.LastError)
		}
	}
}

// TestAsynqPauseHonoured: a queue paused through asynq's Inspector is
// drained by no worker; its jobs read scheduled, waiting for the pause,
// and the paused gauge says so. Lifted, they all go.
func TestAsynqPauseHonoured(t *testing.T) {
	if testing.Short() {
		t.Skip("seconds of a pause: runs in make test")
	}
	ctx := context.Background()
	h := newHarness(t, fakeupstream.Config{}, shaper.Upstream{}, 2)
	insp := asynq.NewInspectorFromRedisClient(h.rdb)
	defer insp.Close()
	// Paused before any worker runs, and also while one does.
	if err := insp.PauseQueue(jobstore.QueueName("api")); err != nil {
		t.Fatal(err)
	}
	d := h.start(Config{Upstreams: []shaper.Upstream{{Name: "api", Limits: []leaky.Limit{leaky.PerSecond(100)}, Workers: 2}}}, nil)
	var ids []string
	for range 5 {
		ids = append(ids, h.enqueue(&queue.Job{Upstream: "api", Path: "/x"}).ID)
	}
	time.Sleep(1500 * time.Millisecond)
	if n := h.fake.Report().Total; n != 0 {
		t.Fatalf("the upstream got %d requests while its queue was paused through asynq, want none", n)
	}
	for _, id := range ids {
		info, err := h.q.Get(ctx, id, "")
		if err != nil {
			t.Fatal(err)
		}
		if info.State != queue.StateScheduled || info.WaitingFor != queue.WaitingPause || info.Attempts != 0 {
			t.Fatalf("job %s: %s waiting for %q with %d attempts; want scheduled, pause, none", id, info.State, info.WaitingFor, info.Attempts)
		}
	}
	if g := gaugeValue(t, d.m.UpstreamPaused.WithLabelValues("api")); g != 1 {
		t.Errorf("shaper_upstream_paused %v while paused through asynq, want 1", g)
	}
	if err := insp.UnpauseQueue(jobstore.QueueName("api")); err != nil {
		t.Fatal(err)
	}
	h.waitFor(ids, queue.StateSucceeded)
	if g := gaugeValue(t, d.m.UpstreamPaused.WithLabelValues("api")); g != 0 {
		t.Errorf("shaper_upstream_paused %v after the unpause, want 0", g)
	}
}

func gaugeValue(t *testing.T, g prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}
