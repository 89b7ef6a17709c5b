package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper/internal/sched"
	"github.com/shaperhq/shaper/internal/taskstore"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
	"github.com/shaperhq/shaper/tokenbucket"
)

// TestGetJobNoLongerKept: a job that finished and was dropped past its
// upstream's result_max_count answers 404 job-expired, saying so; a job
// that never was answers 404 not-found.
func TestGetJobNoLongerKept(t *testing.T) {
	f := newFixture(t, tokenbucket.Limit{Capacity: 100, Refill: 10, Per: time.Second}, 100)
	ctx := context.Background()
	u, _ := f.q.Upstream("mail")
	u.ResultMaxCount = 1
	bucket, err := leaky.New(f.rdb, leaky.Config{}).Bucket(queue.QueueName("mail"), leaky.BucketConfig{Limits: []leaky.Limit{leaky.PerSecond(1000)}})
	if err != nil {
		t.Fatal(err)
	}
	space := sched.For("", "mail")
	taker, err := sched.NewTaker(f.rdb, space, sched.TakerConfig{Upstream: u, Bucket: bucket,
		Lookahead: time.Second, Lease: 30 * time.Second, ConcurrencyLease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for range 2 {
		resp, body := f.do("POST", "/v1/jobs", `{"upstream":"mail","task":"send","body":"hi"}`)
		if resp.StatusCode != 202 {
			t.Fatalf("enqueue: got %d %v, want 202", resp.StatusCode, body)
		}
		id := body["id"].(string)
		tk, err := taker.Take(ctx, 1)
		if err != nil || len(tk.Jobs) != 1 || tk.Jobs[0].ID != id {
			t.Fatalf("took %+v, %v; want %s", tk.Jobs, err, id)
		}
		msg, err := taskstore.Unmarshal(tk.Jobs[0].Msg)
		if err != nil {
			t.Fatal(err)
		}
		_, err = taskstore.Finish(ctx, f.rdb, taskstore.For(queue.QueueName("mail")), space.CountsKey(), space.BacklogKey(),
			[]taskstore.Finished{{ID: id, Lane: "default", Msg: msg, Outcome: taskstore.Succeeded, Retention: time.Hour,
				Result: []byte(`{"status":200,"body":"b2s="}`)}},
			taskstore.KeepAtMost(queue.FinishBounds("", u)))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		time.Sleep(2 * time.Millisecond)
	}
	resp, got := f.do("GET", "/v1/jobs/"+ids[0], "")
	if resp.StatusCode != 404 || got["type"] != "https://shaperhq.github.io/problems/job-expired" {
		t.Fatalf("trimmed job: got %d %v, want 404 job-expired", resp.StatusCode, got)
	}
	if d, _ := got["detail"].(string); !strings.Contains(d, ids[0]) || !strings.Contains(d, "finished and its result is no longer kept") {
		t.Errorf("trimmed job: detail %q, want it to name the job and say it finished and is no longer kept", d)
	}
	if resp, got := f.do("GET", "/v1/jobs/"+ids[1], ""); resp.StatusCode != 200 || got["state"] != "succeeded" {
		t.Errorf("kept job: got %d %v, want 200 succeeded", resp.StatusCode, got)
	}
	never := queue.NewID("billing", "mail", "default")
	if resp, got := f.do("GET", "/v1/jobs/"+never, ""); resp.StatusCode != 404 || got["type"] != "https://shaperhq.github.io/problems/not-found" {
		t.Errorf("a job that never was: got %d %v, want 404 not-found", resp.StatusCode, got)
	}
	// Another tenant learns nothing of it.
	if resp, got := f.do("GET", "/v1/jobs/"+ids[0], "", "Authorization", "Bearer ops-secret"); resp.StatusCode != 404 || got["type"] != "https://shaperhq.github.io/problems/not-found" {
		t.Errorf("another tenant: got %d %v, want 404 not-found", resp.StatusCode, got)
	}
}
