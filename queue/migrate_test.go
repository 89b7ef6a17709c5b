package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/leaky"
)

// legacy writes jobs in the previous layout the way shaper's previous
// version did: through asynq's own client, into the lane's queue, with
// sensitive headers in a side key tagged by that queue.
type legacy struct {
	t      *testing.T
	rdb    redis.UniversalClient
	client *asynq.Client
	prefix string
}

func newLegacy(t *testing.T, rdb redis.UniversalClient, prefix string) *legacy {
	c := asynq.NewClientFromRedisClient(rdb)
	t.Cleanup(func() { c.Close() })
	return &legacy{t: t, rdb: rdb, client: c, prefix: prefix}
}

// enqueue stores job (Upstream, Lane, Tenant set) in its lane's old queue;
// a non-empty secret goes to its side key with a day's TTL.
func (l *legacy) enqueue(job Job, secret string, opts ...asynq.Option) Job {
	l.t.Helper()
	ctx := context.Background()
	job.ID = NewID(job.Tenant, job.Upstream, job.Lane)
	if job.MaxAttempts == 0 {
		job.MaxAttempts = 3
	}
	job.IdempotencyKey, job.CreatedAt = job.ID, time.Now().UTC().Truncate(time.Second)
	old := legacyQueueName(job.Upstream, job.Lane)
	if secret != "" {
		job.Secrets = fmt.Sprintf("%016x", time.Now().UnixNano())
		key := l.prefix + ":secrets:{" + old + "}:" + job.ID + ":" + job.Secrets
		if err := l.rdb.Set(ctx, key, `{"Authorization":"`+secret+`"}`, 24*time.Hour).Err(); err != nil {
			l.t.Fatal(err)
		}
	}
	payload, _ := json.Marshal(&job)
	opts = append([]asynq.Option{asynq.Queue(old), asynq.TaskID(job.ID), asynq.MaxRetry(job.MaxAttempts),
		asynq.Retention(time.Hour), asynq.Timeout(24 * time.Hour)}, opts...)
	if _, err := l.client.EnqueueContext(ctx, asynq.NewTask(TaskType, payload), opts...); err != nil {
		l.t.Fatalf("old enqueue: %v", err)
	}
	return job
}

// take does what asynq's server does when it dequeues the oldest pending
// job of an old queue (its dequeue script), with the lease ending at
// until: a worker that took it and then stopped, or still runs. A live
// asynq server would keep renewing its lease, so the test plays it.
func (l *legacy) take(queue string, until time.Time) string {
	l.t.Helper()
	ctx := context.Background()
	k := jobstore.AsynqKeys(queue)
	id, err := l.rdb.RPopLPush(ctx, k.Pending(), k.Active()).Result()
	if err != nil {
		l.t.Fatal(err)
	}
	l.rdb.HSet(ctx, k.Task(id), "state", "active")
	l.rdb.HDel(ctx, k.Task(id), "pending_since")
	l.rdb.ZAdd(ctx, k.Lease(), redis.Z{Score: float64(until.Unix()), Member: id})
	return id
}

// oldKeys lists every key left of the old queues and their side keys.
func oldKeys(t *testing.T, rdb redis.UniversalClient, upstream string) []string {
	t.Helper()
	var (
		mu  sync.Mutex // ForEachMaster scans the masters at once
		out []string
	)
	ctx := context.Background()
	scan := func(c *redis.Client) error {
		for _, pat := range []string{"asynq:{shaper." + upstream + ".*", "*:{shaper." + upstream + ".*}:*"} {
			keys, err := c.Keys(ctx, pat).Result()
			if err != nil {
				return err
			}
			mu.Lock()
			out = append(out, keys...)
			mu.Unlock()
		}
		return nil
	}
	var err error
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return scan(m) })
	case *redis.Client:
		err = scan(c)
	}
	if err != nil {
		t.Fatal(err)
	}
	// asynq's processed and failed statistics are history, not jobs.
	var jobs []string
	for _, k := range out {
		if !strings.Contains(k, "}:processed") && !strings.Contains(k, "}:failed") {
			jobs = append(jobs, k)
		}
	}
	return jobs
}

func TestMigrateLegacy(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	q := newQueue(t, rdb, upstreams(0))
	l := newLegacy(t, rdb, q.prefix)
	now := time.Now()

	// Jobs an old worker ran: one failed (retry), one gave up (dead), one
	// succeeded with a response.
	retried := l.enqueue(Job{Tenant: "t1", Upstream: "stripe", Lane: "bulk", Path: "/fail"}, "Bearer r")
	dead := l.enqueue(Job{Tenant: "t1", Upstream: "stripe", Lane: "bulk", Path: "/dead"}, "")
	done := l.enqueue(Job{Tenant: "t1", Upstream: "stripe", Lane: "bulk", Path: "/ok"}, "")
	ran := make(chan string, 3)
	asrv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Queues:            map[string]int{legacyQueueName("stripe", "bulk"): 1},
		TaskCheckInterval: 10 * time.Millisecond,
		RetryDelayFunc:    func(int, error, *asynq.Task) time.Duration { return time.Hour },
		LogLevel:          asynq.FatalLevel,
	})
	err := asrv.Start(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id := task.ResultWriter().TaskID()
		defer func() { ran <- id }()
		switch id {
		case retried.ID:
			return errors.New("upstream said 503")
		case done.ID:
			task.ResultWriter().Write([]byte(`{"status":200,"body":"b2s="}`))
			return nil
		}
		return fmt.Errorf("upstream said 400: %w", asynq.SkipRetry)
	}))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		select {
		case <-ran:
		case <-time.After(10 * time.Second):
			t.Fatal("asynq did not run the jobs")
		}
	}
	asrv.Shutdown()
	// asynq records an outcome just after its handler returns.
	insp := asynq.NewInspectorFromRedisClient(rdb)
	defer insp.Close()
	for id, want := range map[string]asynq.TaskState{retried.ID: asynq.TaskStateRetry, dead.ID: asynq.TaskStateArchived, done.ID: asynq.TaskStateCompleted} {
		var ti *asynq.TaskInfo
		for i := 0; i < 200; i++ {
			if ti, err = insp.GetTaskInfo(legacyQueueName("stripe", "bulk"), id); err == nil && ti.State == want {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil || ti.State != want {
			t.Fatalf("old job %s: %v, %v; want %v", id, ti, err, want)
		}
	}

	// Jobs waiting: queued (oldest first), scheduled, cancelled, in a lane
	// the config no longer has; and three an old worker took: one whose
	// worker still holds it, one whose worker died, one whose worker died
	// on its last attempt.
	first := l.enqueue(Job{Tenant: "t1", Upstream: "stripe", Lane: "default", Partition: "p1", Path: "/1",
		Cost: map[string]int64{"tokens": 5}}, "Bearer 1")
	second := l.enqueue(Job{Tenant: "t1", Upstream: "stripe", Lane: "default", Path: "/2"}, "")
	later := l.enqueue(Job{Tenant: "t1", Upstream: "stripe", Lane: "default", Path: "/later"}, "Bearer s",
		asynq.ProcessAt(now.Add(time.Hour)))
	cancelled := l.enqueue(Job{Tenant: "t1", Upstream: "stripe", Lane: "bulk", Path: "/c"}, "")
	if err := insp.ArchiveTask(legacyQueueName("stripe", "bulk"), cancelled.ID); err != nil {
		t.Fatal(err)
	}
	oldMark := q.prefix + ":cancelled:{" + legacyQueueName("stripe", "bulk") + "}:" + cancelled.ID
	rdb.Set(ctx, oldMark, "1", time.Hour)
	stray := l.enqueue(Job{Tenant: "t1", Upstream: "stripe", Lane: "legacy", Path: "/x"}, "")
	held := l.enqueue(Job{Tenant: "t1", Upstream: "stripe", Lane: "fast", Path: "/held"}, "Bearer h")
	lost := l.enqueue(Job{Tenant: "t1", Upstream: "stripe", Lane: "fast", Path: "/lost"}, "Bearer l")
	lastTry := l.enqueue(Job{Tenant: "t1", Upstream: "stripe", Lane: "fast", Path: "/last", MaxAttempts: 1}, "Bearer z")
	if id := l.take(legacyQueueName("stripe", "fast"), now.Add(time.Minute)); id != held.ID {
		t.Fatalf("took %s, want %s", id, held.ID)
	}
	l.take(legacyQueueName("stripe", "fast"), now.Add(-time.Second))
	l.take(legacyQueueName("stripe", "fast"), now.Add(-time.Second))
	// An id with no task behind it, as a crashed asynq client may leave.
	rdb.LPush(ctx, jobstore.AsynqKeys(legacyQueueName("stripe", "default")).Pending(), "stripe.default.orphan")

	// The config has lanes default and bulk; "fast" and "legacy" are old
	// queues listed in asynq's set only.
	if ups, err := q.LegacyUpstreams(ctx); err != nil || fmt.Sprint(ups) != "[stripe]" {
		t.Fatalf("LegacyUpstreams: %v, %v; want [stripe]", ups, err)
	}
	m, err := q.MigrateLegacy(ctx, "stripe")
	if err != nil {
		t.Fatal(err)
	}
	want := Migration{Upstream: "stripe", Pending: 3, Scheduled: 1, Retry: 1, Dead: 2, Succeeded: 1, Active: 2, Exhausted: 1, Dropped: 1}
	if m.Pending != want.Pending || m.Scheduled != want.Scheduled || m.Retry != want.Retry || m.Dead != want.Dead ||
		m.Succeeded != want.Succeeded || m.Active != want.Active || m.Exhausted != want.Exhausted || m.Existing != 0 || m.Dropped != 1 {
		t.Errorf("got %v, want %v", m, want)
	}
	if len(m.Skipped) != 1 || m.Skipped[0].ID != held.ID || m.Leased() != 1 || m.Skipped[0].LeaseUntil.Unix() != now.Add(time.Minute).Unix() {
		t.Errorf("skipped %v, want the held job until its lease ends", m.Skipped)
	}
	if got := fmt.Sprint(m.Queues); got != "[shaper.stripe.bulk shaper.stripe.default shaper.stripe.fast shaper.stripe.legacy]" {
		t.Errorf("queues %s", got)
	}
	if got := fmt.Sprint(m.Unlisted); got != "[shaper.stripe.bulk shaper.stripe.default shaper.stripe.legacy]" {
		t.Errorf("unlisted %s, want all but the queue of the held job", got)
	}

	for _, tc := range []struct {
		id       string
		state    State
		attempts int
		lastErr  string
		secret   string // "" for none
	}{
		{first.ID, StateQueued, 0, "", "Bearer 1"},
		{second.ID, StateQueued, 0, "", ""},
		{stray.ID, StateQueued, 0, "", ""},
		{lost.ID, StateQueued, 1, jobstore.LeaseExpiredError, "Bearer l"},
		{later.ID, StateScheduled, 0, "", "Bearer s"},
		{retried.ID, StateRetrying, 1, "upstream said 503", "Bearer r"},
		{dead.ID, StateDead, 1, "upstream said 400", ""},
		{lastTry.ID, StateDead, 1, jobstore.LeaseExpiredError, ""},
		{cancelled.ID, StateCancelled, 0, "", ""},
		{done.ID, StateSucceeded, 1, "", ""},
	} {
		info, err := q.Get(ctx, tc.id, "")
		if err != nil {
			t.Errorf("%s: %v", tc.id, err)
			continue
		}
		if info.State != tc.state || info.Attempts != tc.attempts || !strings.Contains(info.LastError, tc.lastErr) {
			t.Errorf("%s: got %s after %d attempts (%q), want %s after %d (%q)", tc.id, info.State, info.Attempts, info.LastError,
				tc.state, tc.attempts, tc.lastErr)
		}
		secret, err := LoadSecrets(ctx, rdb, q.prefix, &info.Job, time.Now())
		if got := secret["Authorization"]; got != tc.secret || (tc.secret != "" && err != nil) {
			t.Errorf("%s: sensitive header %q, %v; want %q", tc.id, got, err, tc.secret)
		}
		if tc.secret != "" {
			if ttl := rdb.PTTL(ctx, SecretsKey(q.prefix, &info.Job)).Val(); ttl <= 0 {
				t.Errorf("%s: sensitive headers with TTL %v, want a TTL", tc.id, ttl)
			}
		}
		switch tc.id {
		case later.ID:
			if info.NextAttemptAt.Unix() != now.Add(time.Hour).Unix() {
				t.Errorf("scheduled: next attempt %v, want %v", info.NextAttemptAt, now.Add(time.Hour))
			}
		case retried.ID:
			if d := time.Until(info.NextAttemptAt); d < 59*time.Minute || d > time.Hour {
				t.Errorf("retrying: next attempt in %v, want about an hour", d)
			}
		case done.ID:
			if info.Response == nil || info.Response.Status != 200 || string(info.Response.Body) != "ok" {
				t.Errorf("succeeded: response %+v", info.Response)
			}
		}
	}
	if ttl := rdb.PTTL(ctx, q.cancelKey(cancelled.ID)).Val(); ttl <= 59*time.Minute || ttl > time.Hour {
		t.Errorf("cancel mark TTL %v, want the old one's (an hour)", ttl)
	}
	counts, err := q.Counts(ctx, "stripe")
	if err != nil {
		t.Fatal(err)
	}
	wantCounts := map[string]LaneCounts{
		"default": {Pending: 2, Scheduled: 1},
		"bulk":    {Retry: 1, Dead: 2, Succeeded: 1},
		"fast":    {Pending: 1, Dead: 1},
		"legacy":  {Pending: 1},
	}
	if fmt.Sprint(counts) != fmt.Sprint(wantCounts) {
		t.Errorf("counts %v, want %v", counts, wantCounts)
	}

	// The queued jobs are takeable, the oldest of each lane first.
	u, _ := q.Upstream("stripe")
	bucket, err := leaky.New(rdb, leaky.Config{}).Bucket(jobstore.QueueName("stripe"), leaky.BucketConfig{Limits: []leaky.Limit{leaky.PerSecond(1000)}})
	if err != nil {
		t.Fatal(err)
	}
	taker, err := jobstore.NewTaker(rdb, jobstore.For("", "stripe"), jobstore.TakerConfig{Upstream: u, Bucket: bucket,
		Lookahead: time.Second, Lease: 30 * time.Second, ConcurrencyLease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	tk, err := taker.Take(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	took := map[string]*jobstore.Message{}
	var order []string
	for _, j := range tk.Jobs {
		msg, err := jobstore.Unmarshal(j.Msg)
		if err != nil {
			t.Fatal(err)
		}
		took[j.ID] = msg
		order = append(order, j.ID)
	}
	if len(took) != 4 || took[first.ID] == nil || took[second.ID] == nil || took[stray.ID] == nil || took[lost.ID] == nil {
		t.Fatalf("took %v, want the 4 queued jobs", order)
	}
	if msg := took[lost.ID]; msg.Retried != 1 || msg.Queue != jobstore.QueueName("stripe") {
		t.Errorf("recovered job's message: retried %d, queue %s; want 1, %s", msg.Retried, msg.Queue, jobstore.QueueName("stripe"))
	}
	if strings.Index(strings.Join(order, " "), first.ID) > strings.Index(strings.Join(order, " "), second.ID) {
		t.Errorf("took %v, want %s before %s", order, first.ID, second.ID)
	}

	// Only the held job is left of the old layout, and a second run moves
	// nothing.
	left := oldKeys(t, rdb, "stripe")
	for _, k := range left {
		if !strings.Contains(k, ".fast}") {
			t.Errorf("left in the old layout: %s", k)
		}
	}
	again, err := q.MigrateLegacy(ctx, "stripe")
	if err != nil || again.Moved() != 0 || again.Existing != 0 || again.Leased() != 1 {
		t.Errorf("second run: %v, %v; want nothing moved and the held job skipped", again, err)
	}

	// Once its lease has run out, the held job moves too, and then the
	// old layout is gone.
	rdb.ZAdd(ctx, jobstore.AsynqKeys(legacyQueueName("stripe", "fast")).Lease(), redis.Z{Score: float64(now.Unix() - 1), Member: held.ID})
	third, err := q.MigrateLegacy(ctx, "stripe")
	if err != nil || third.Active != 1 || len(third.Skipped) != 0 || fmt.Sprint(third.Unlisted) != "[shaper.stripe.fast]" {
		t.Errorf("third run: %v, %v; want the held job moved and its queue unlisted", third, err)
	}
	if left := oldKeys(t, rdb, "stripe"); len(left) != 0 {
		t.Errorf("left in the old layout: %v", left)
	}
	last, err := q.MigrateLegacy(ctx, "stripe")
	if err != nil || !last.Empty() {
		t.Errorf("run after everything moved: %v, %v; want nothing to do", last, err)
	}
	if members := rdb.SMembers(ctx, jobstore.AllQueues).Val(); fmt.Sprint(members) != "[shaper.stripe]" {
		t.Errorf("asynq's queues: %v, want only the new one", members)
	}
	if ups, err := q.LegacyUpstreams(ctx); err != nil || len(ups) != 0 {
		t.Errorf("LegacyUpstreams after the migration: %v, %v; want none", ups, err)
	}
	if _, err := q.LegacyUpstreams(ctx, "nope"); !errors.Is(err, ErrUnknownUpstream) {
		t.Errorf("LegacyUpstreams of an unknown upstream: %v, want ErrUnknownUpstream", err)
	}
	if _, err := q.MigrateLegacy(ctx, "nope"); !errors.Is(err, ErrUnknownUpstream) {
		t.Errorf("MigrateLegacy of an unknown upstream: %v, want ErrUnknownUpstream", err)
	}
}

// TestMigrateLegacyResumes checks that a run that stopped after writing
// some jobs into the new queue and before deleting them from the old is
// finished by the next one without a job lost or doubled.
func TestMigrateLegacyResumes(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	q := newQueue(t, rdb, upstreams(0))
	l := newLegacy(t, rdb, q.prefix)
	var jobs []Job
	for i := range 5 {
		jobs = append(jobs, l.enqueue(Job{Tenant: "t1", Upstream: "stripe", Lane: "default", Path: fmt.Sprint("/", i)}, "Bearer x"))
	}
	// A copy of the old queue, restored after the first run: as if that
	// run had written every job and crashed before deleting any.
	k := jobstore.AsynqKeys(legacyQueueName("stripe", "default"))
	snapshot := map[string]string{}
	for _, key := range oldKeys(t, rdb, "stripe") {
		d, err := rdb.Dump(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		snapshot[key] = d
	}
	if m, err := q.MigrateLegacy(ctx, "stripe"); err != nil || m.Pending != 5 {
		t.Fatalf("first run: %v, %v", m, err)
	}
	for key, d := range snapshot {
		if err := rdb.Restore(ctx, key, 0, d).Err(); err != nil {
			t.Fatal(err)
		}
	}
	rdb.SAdd(ctx, jobstore.AllQueues, k.Queue())
	m, err := q.MigrateLegacy(ctx, "stripe")
	if err != nil || m.Moved() != 0 || m.Existing != 5 {
		t.Fatalf("rerun: %v, %v; want the 5 jobs found already moved", m, err)
	}
	if left := oldKeys(t, rdb, "stripe"); len(left) != 0 {
		t.Errorf("left in the old layout: %v", left)
	}
	c, _ := q.Counts(ctx, "stripe")
	if c["default"].Pending != 5 {
		t.Errorf("pending %d, want 5", c["default"].Pending)
	}
	for _, j := range jobs {
		info, err := q.Get(ctx, j.ID, "")
		if err != nil || info.State != StateQueued {
			t.Fatalf("%s: %v, %v", j.ID, info, err)
		}
		if s, err := LoadSecrets(ctx, rdb, q.prefix, &info.Job, time.Now()); err != nil || s["Authorization"] != "Bearer x" {
			t.Errorf("%s: sensitive headers %v, %v", j.ID, s, err)
		}
	}
}

func TestMigrateLegacyOnCluster(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.NewCluster(t).Client(t)
	q := newQueue(t, rdb, upstreams(0))
	l := newLegacy(t, rdb, q.prefix)
	queued := l.enqueue(Job{Tenant: "t1", Upstream: "stripe", Lane: "default", Path: "/q"}, "Bearer q")
	later := l.enqueue(Job{Tenant: "t1", Upstream: "stripe", Lane: "bulk", Path: "/s"}, "Bearer s", asynq.ProcessAt(time.Now().Add(time.Hour)))
	cancelled := l.enqueue(Job{Tenant: "t1", Upstream: "stripe", Lane: "bulk", Path: "/c"}, "")
	insp := asynq.NewInspectorFromRedisClient(rdb)
	defer insp.Close()
	if err := insp.ArchiveTask(legacyQueueName("stripe", "bulk"), cancelled.ID); err != nil {
		t.Fatal(err)
	}
	rdb.Set(ctx, q.prefix+":cancelled:{"+legacyQueueName("stripe", "bulk")+"}:"+cancelled.ID, "1", time.Hour)

	m, err := q.MigrateLegacy(ctx, "stripe")
	if err != nil || m.Pending != 1 || m.Scheduled != 1 || m.Dead != 1 || len(m.Skipped) != 0 {
		t.Fatalf("got %v, %v; want one queued, one scheduled, one dead", m, err)
	}
	for id, want := range map[string]State{queued.ID: StateQueued, later.ID: StateScheduled, cancelled.ID: StateCancelled} {
		info, err := q.Get(ctx, id, "")
		if err != nil || info.State != want {
			t.Errorf("%s: %v, %v; want %s", id, info, err, want)
			continue
		}
		if want != StateCancelled {
			if s, err := LoadSecrets(ctx, rdb, q.prefix, &info.Job, time.Now()); err != nil || s["Authorization"] == "" {
				t.Errorf("%s: sensitive headers %v, %v", id, s, err)
			}
		}
	}
	if left := oldKeys(t, rdb, "stripe"); len(left) != 0 {
		t.Errorf("left in the old layout: %v", left)
	}
	if again, err := q.MigrateLegacy(ctx, "stripe"); err != nil || !again.Empty() {
		t.Errorf("second run: %v, %v; want nothing to do", again, err)
	}
}
