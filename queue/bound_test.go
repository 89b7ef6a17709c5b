package queue

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/leaky"
)

// TestJobsPastTheirBoundAreNoLongerKept: finished past result_max_count and
// dead_max_count, the oldest jobs go, and reading one says it finished and
// is no longer kept, which a job that never was does not.
func TestJobsPastTheirBoundAreNoLongerKept(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	ups := upstreams(100)
	ups[0].ResultMaxCount, ups[0].DeadMaxCount = 2, 1
	q := newQueue(t, rdb, ups)
	u, _ := q.Upstream("stripe")
	bucket, err := leaky.New(rdb, leaky.Config{}).Bucket(jobstore.QueueName("stripe"), leaky.BucketConfig{Limits: []leaky.Limit{leaky.PerSecond(1000)}})
	if err != nil {
		t.Fatal(err)
	}
	space := jobstore.For("", "stripe")
	taker, err := jobstore.NewTaker(rdb, space, jobstore.TakerConfig{Upstream: u, Bucket: bucket,
		Lookahead: time.Second, Lease: 30 * time.Second, ConcurrencyLease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// One at a time, a millisecond apart, so "oldest" is well defined.
	var ids []string
	for i := range 5 {
		info, _, err := q.Enqueue(ctx, &Job{Upstream: "stripe", Path: "/x"})
		if err != nil {
			t.Fatal(err)
		}
		tk, err := taker.Take(ctx, 1)
		if err != nil || len(tk.Jobs) != 1 || tk.Jobs[0].ID != info.ID {
			t.Fatalf("took %+v, %v; want %s", tk.Jobs, err, info.ID)
		}
		msg, err := jobstore.Unmarshal(tk.Jobs[0].Msg)
		if err != nil {
			t.Fatal(err)
		}
		f := jobstore.Finished{ID: info.ID, Lane: "default", Msg: msg, Outcome: jobstore.Succeeded,
			Retention: time.Hour, Result: []byte(`{"v":2,"s":200,"b":"ok"}`)}
		if i >= 3 {
			f.Outcome, f.ErrMsg = jobstore.Dead, "upstream said 400"
		}
		errs, err := jobstore.Finish(ctx, rdb, jobstore.AsynqKeys(jobstore.QueueName("stripe")), space.CountsKey(), space.BacklogKey(),
			[]jobstore.Finished{f}, jobstore.KeepAtMost(finishBounds("", u)))
		if err != nil || errs[0] != nil {
			t.Fatalf("finish: %v, %v", errs, err)
		}
		ids = append(ids, info.ID)
		time.Sleep(2 * time.Millisecond)
	}
	// ids[0] (succeeded, oldest of 3 past 2) and ids[3] (dead, older of 2
	// past 1) went.
	for i, id := range ids {
		info, err := q.Get(ctx, id, "")
		switch i {
		case 0, 3:
			if !errors.Is(err, ErrNotFound) || !errors.Is(err, ErrNoLongerKept) {
				t.Errorf("job %d: got %+v, %v; want not found, no longer kept", i, info, err)
			}
		default:
			if err != nil {
				t.Errorf("job %d: got %v, want it kept", i, err)
			}
		}
	}
	_, err = q.Get(ctx, NewID("", "stripe", "default"), "")
	if !errors.Is(err, ErrNotFound) || errors.Is(err, ErrNoLongerKept) {
		t.Errorf("a job that never was: got %v, want not found only", err)
	}
	c, err := q.Counts(ctx, "stripe")
	if err != nil {
		t.Fatal(err)
	}
	if got := c["default"]; got.Succeeded != 2 || got.Dead != 1 {
		t.Errorf("counts: got %+v, want 2 succeeded and 1 dead (those kept)", got)
	}
}

// TestFinishBoundsDefaults: an upstream that says nothing keeps 100,000 of
// each, and tombstones for as many.
func TestFinishBoundsDefaults(t *testing.T) {
	b := finishBounds("", shaper.Upstream{Name: "stripe"})
	if b.Completed != shaper.DefaultResultMaxCount || b.Archived != shaper.DefaultDeadMaxCount {
		t.Errorf("got %d, %d kept, want %d, %d", b.Completed, b.Archived, shaper.DefaultResultMaxCount, shaper.DefaultDeadMaxCount)
	}
	if b.Gone.Max != 200_000 || b.Gone.For != shaper.DefaultDeadRetention || b.Gone.Key != "shaper:s:{shaper.stripe}:gone" {
		t.Errorf("tombstones: got %+v", b.Gone)
	}
	r := b.Remember
	if r.Key != "shaper:s:{shaper.stripe}:ik" || r.Window != shaper.DefaultIdempotencyWindow || r.CancelPrefix != "shaper:cancelled:{shaper.stripe}:" {
		t.Errorf("records: got %+v", r)
	}
}
