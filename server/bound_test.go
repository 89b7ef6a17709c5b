package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
	"github.com/shaperhq/shaper/tokenbucket"
)

// TestGetJobNoLongerKept: a job that finished and was dropped past its
// upstream's result_max_count answers 404 job-expired, saying so; a job
// that never was answers 404 not-found.
func TestGetJobNoLongerKept(t *testing.T) {
	f := newFixture(t, tokenbucket.Limit{Capacity: 100, Refill: 10, Per: time.Second}, 100)
	m := newMailDrain(t, f)
	var ids []string
	for range 2 {
		ids = append(ids, m.finish(`{"upstream":"mail","task":"send","body":"hi"}`))
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

// TestRepeatAfterTheJobWasDropped: a job with an idempotency key, dropped
// past result_max_count, is still found by a repeat of its key, alone or
// in a batch: 200 with its id and final state, nothing enqueued; reading
// it answers 404 job-expired.
func TestRepeatAfterTheJobWasDropped(t *testing.T) {
	f := newFixture(t, tokenbucket.Limit{Capacity: 100, Refill: 10, Per: time.Second}, 100)
	const repeat = `{"upstream":"mail","task":"send","body":"hi","idempotency_key":"welcome-42"}`
	m := newMailDrain(t, f)
	var ids []string
	for _, body := range []string{repeat, `{"upstream":"mail","task":"send","body":"next"}`} {
		ids = append(ids, m.finish(body))
	}
	if resp, got := f.do("GET", "/v1/jobs/"+ids[0], ""); resp.StatusCode != 404 || got["type"] != "https://shaperhq.github.io/problems/job-expired" {
		t.Fatalf("dropped job: got %d %v, want 404 job-expired", resp.StatusCode, got)
	}
	resp, got := f.do("POST", "/v1/jobs", repeat)
	if resp.StatusCode != 200 || got["id"] != ids[0] || got["state"] != "succeeded" || got["idempotency_key"] != "welcome-42" {
		t.Errorf("repeat: got %d %v, want 200 with %s succeeded", resp.StatusCode, got, ids[0])
	}
	resp, got = f.do("POST", "/v1/jobs/batch", `{"jobs":[`+repeat+`]}`)
	res, _ := got["results"].([]any)
	if resp.StatusCode != 200 || len(res) != 1 {
		t.Fatalf("batch: got %d %v", resp.StatusCode, got)
	}
	item, _ := res[0].(map[string]any)
	job, _ := item["job"].(map[string]any)
	if item["status"] != float64(200) || job["id"] != ids[0] || job["state"] != "succeeded" {
		t.Errorf("batch item: got %v, want 200 with %s succeeded", item, ids[0])
	}
	// Nothing was enqueued: nothing to take, no task.
	if tk, err := m.taker.Take(context.Background(), 1); err != nil || len(tk.Jobs) != 0 {
		t.Errorf("take after the repeats: got %d jobs, %v, want none", len(tk.Jobs), err)
	}
	if f.rdb.Exists(context.Background(), m.space.TaskKey(ids[0])).Val() != 0 {
		t.Error("the dropped job's task is stored again")
	}
}

// mailDrain takes and finishes the fixture's "mail" jobs as a worker
// would, with result_max_count 1, so that each finished job drops the one
// before.
type mailDrain struct {
	t     *testing.T
	f     *fixture
	u     shaper.Upstream
	space jobstore.Space
	taker *jobstore.Taker
}

func newMailDrain(t *testing.T, f *fixture) *mailDrain {
	t.Helper()
	u, _ := f.q.Upstream("mail")
	u.ResultMaxCount = 1
	bucket, err := leaky.New(f.rdb, leaky.Config{}).Bucket(jobstore.QueueName("mail"), leaky.BucketConfig{Limits: []leaky.Limit{leaky.PerSecond(1000)}})
	if err != nil {
		t.Fatal(err)
	}
	space := jobstore.For("", "mail")
	taker, err := jobstore.NewTaker(f.rdb, space, jobstore.TakerConfig{Upstream: u, Bucket: bucket,
		Lookahead: time.Second, Lease: 30 * time.Second, ConcurrencyLease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return &mailDrain{t: t, f: f, u: u, space: space, taker: taker}
}

// finish enqueues body through the API, takes the job and records it
// succeeded; it returns the job's ID.
func (m *mailDrain) finish(body string) string {
	m.t.Helper()
	ctx := context.Background()
	resp, got := m.f.do("POST", "/v1/jobs", body)
	if resp.StatusCode != 202 {
		m.t.Fatalf("enqueue: got %d %v, want 202", resp.StatusCode, got)
	}
	id := got["id"].(string)
	tk, err := m.taker.Take(ctx, 1)
	if err != nil || len(tk.Jobs) != 1 || tk.Jobs[0].ID != id {
		m.t.Fatalf("took %+v, %v; want %s", tk.Jobs, err, id)
	}
	msg, err := jobstore.Unmarshal(tk.Jobs[0].Msg)
	if err != nil {
		m.t.Fatal(err)
	}
	_, err = jobstore.Finish(ctx, m.f.rdb, jobstore.AsynqKeys(jobstore.QueueName("mail")), m.space.CountsKey(), m.space.BacklogKey(),
		[]jobstore.Finished{{ID: id, Lane: "default", Msg: msg, Outcome: jobstore.Succeeded, Retention: time.Hour,
			Result: []byte(`{"v":2,"s":200,"b":"ok"}`)}},
		jobstore.KeepAtMost(m.space.FinishBounds(m.u, queue.IdempotentIDPattern)))
	if err != nil {
		m.t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond)
	return id
}
