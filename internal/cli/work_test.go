package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// enqueueOld stores a job the way shaper's previous version did: in its
// lane's own asynq queue, "shaper.UPSTREAM.LANE", through asynq's client.
func enqueueOld(t *testing.T, rdb redis.UniversalClient, upstream, lane, path string) queue.Job {
	t.Helper()
	job := queue.Job{ID: queue.NewID("t1", upstream, lane), Tenant: "t1", Upstream: upstream, Lane: lane,
		Method: "POST", Path: path, MaxAttempts: 3, CreatedAt: time.Now().UTC()}
	job.IdempotencyKey = job.ID
	payload, err := json.Marshal(&job)
	if err != nil {
		t.Fatal(err)
	}
	c := asynq.NewClientFromRedisClient(rdb)
	defer c.Close()
	if _, err := c.Enqueue(asynq.NewTask(queue.TaskType, payload), asynq.Queue(jobstore.QueueName(upstream)+"."+lane),
		asynq.TaskID(job.ID), asynq.MaxRetry(3), asynq.Retention(time.Hour), asynq.Timeout(24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	return job
}

// TestWorkMigratesLegacyJobs starts `shaper work` on a Redis holding a job
// in the previous layout: the worker moves it at startup, says so, and
// sends it.
func TestWorkMigratesLegacyJobs(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	sent := make(chan string, 10)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent <- r.URL.Path
		w.Write([]byte("ok"))
	}))
	defer up.Close()
	cfg := writeFile(t, "work.yaml", `
redis: {url: "`+srv.URL()+`"}
upstreams:
  oldco:
    base_url: `+up.URL+`
    limits: [{rate: 100, per: 1s}]
`)
	job := enqueueOld(t, rdb, "oldco", "default", "/v1/old")

	var errOut bytes.Buffer
	f := &Factory{In: strings.NewReader(""), Out: io.Discard, ErrOut: &errOut,
		LookupEnv: func(string) (string, bool) { return "", false }}
	root := NewRootCmd(f)
	root.SetArgs([]string{"work", "--config", cfg, "--metrics-listen", "off"})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(runCtx) }()
	select {
	case p := <-sent:
		if p != "/v1/old" {
			t.Errorf("sent %s, want /v1/old", p)
		}
	case err := <-done:
		stop()
		t.Fatalf("work ended before sending the old job: %v\n%s", err, errOut.String())
	case <-time.After(15 * time.Second):
		stop()
		<-done
		t.Fatalf("the old job was not sent\n%s", errOut.String())
	}
	// Let the worker record the outcome, then stop it.
	q, err := queue.New(rdb, queue.Config{Upstreams: []shaper.Upstream{{Name: "oldco", Limits: []leaky.Limit{leaky.PerSecond(100)}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	var info *queue.Info
	for i := 0; i < 200; i++ {
		if info, err = q.Get(ctx, job.ID, ""); err == nil && info.State == queue.StateSucceeded {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("work: %v", err)
	}
	if err != nil || info.State != queue.StateSucceeded {
		t.Errorf("the old job after the worker: %+v, %v; want succeeded", info, err)
	}
	logs := errOut.String()
	if !strings.Contains(logs, "moved jobs from the previous queue layout") || !strings.Contains(logs, "pending=1") {
		t.Errorf("logs lack the migration:\n%s", logs)
	}
	if n := rdb.Exists(ctx, "asynq:{shaper.oldco.default}:pending", "asynq:{shaper.oldco.default}:t:"+job.ID).Val(); n != 0 {
		t.Errorf("%d keys of the old queue left", n)
	}
}

// TestMigrationRetriesHeldJobs checks that a job an old worker holds is
// reported at startup and moved by the retries once its lease ends, after
// which the retrying stops.
func TestMigrationRetriesHeldJobs(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	q, err := queue.New(rdb, queue.Config{Upstreams: []shaper.Upstream{{Name: "heldco", Limits: []leaky.Limit{leaky.PerSecond(100)}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	job := enqueueOld(t, rdb, "heldco", "default", "/held")
	// As asynq's server takes a job, with a lease a second or two long.
	k := jobstore.AsynqKeys("shaper.heldco.default")
	rdb.RPopLPush(ctx, k.Pending(), k.Active())
	rdb.HSet(ctx, k.Task(job.ID), "state", "active")
	rdb.ZAdd(ctx, k.Lease(), redis.Z{Score: float64(time.Now().Unix() + 2), Member: job.ID})

	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	left := migrateLegacy(ctx, q, nil, log)
	if len(left) != 1 || left[0] != "heldco" {
		t.Fatalf("left %v, want [heldco]", left)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), job.ID) {
		t.Errorf("logs lack a warning about the held job:\n%s", logs.String())
	}
	retryCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	retryMigration(retryCtx, q, left, 50*time.Millisecond, log)
	if retryCtx.Err() != nil {
		t.Fatalf("the retries did not end\n%s", logs.String())
	}
	info, err := q.Get(ctx, job.ID, "")
	if err != nil || info.State != queue.StateQueued || info.Attempts != 1 {
		t.Errorf("the held job after its lease ended: %+v, %v; want queued after 1 attempt (the lost one)", info, err)
	}
	if !strings.Contains(logs.String(), "active=1") {
		t.Errorf("logs lack the move of the held job:\n%s", logs.String())
	}
	// A migrated deployment has nothing left to retry.
	if left := migrateLegacy(ctx, q, nil, log); len(left) != 0 {
		t.Errorf("left %v after the migration, want none", left)
	}
}
