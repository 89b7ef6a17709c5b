package queue

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/leaky"
)

var srv *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &srv) }

func newQueue(t *testing.T, rdb redis.UniversalClient, ups []shaper.Upstream) *Queue {
	t.Helper()
	q, err := New(rdb, Config{Upstreams: ups})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}

func upstreams(maxPending int64) []shaper.Upstream {
	return []shaper.Upstream{
		{Name: "stripe", Limits: []leaky.Limit{leaky.PerSecond(1000)}, Lanes: map[string]int{"default": 1, "bulk": 1}, MaxPending: maxPending, Retry: shaper.Retry{MaxAttempts: 3},
			ResultRetention: time.Hour, DeadRetention: time.Hour},
	}
}

func TestEnqueueAndGet(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	q := newQueue(t, rdb, upstreams(100))
	job := &Job{Tenant: "billing", Upstream: "stripe", Method: "POST", Path: "/v1/charges",
		Headers: map[string]string{"Content-Type": "application/json"}, Body: []byte(`{"amount":100}`),
		Cost: map[string]int64{"tokens": 5}, Partition: "example.org"}
	info, created, err := q.Enqueue(ctx, job)
	if err != nil || !created {
		t.Fatalf("enqueue: got created %v, %v", created, err)
	}
	if info.State != StateQueued || info.Lane != "default" || info.MaxAttempts != 3 || info.IdempotencyKey != info.ID {
		t.Fatalf("got %+v, want queued on the default lane with 3 attempts and the ID as idempotency key", info)
	}
	if up, lane, err := ParseID(info.ID); err != nil || up != "stripe" || lane != "default" {
		t.Fatalf("ParseID(%s) = %s, %s, %v", info.ID, up, lane, err)
	}
	got, err := q.Get(ctx, info.ID, "billing")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != StateQueued || got.Path != "/v1/charges" || string(got.Body) != `{"amount":100}` || got.Cost["tokens"] != 5 || got.Partition != "example.org" {
		t.Fatalf("got %+v", got)
	}
	// Another tenant does not see it.
	if _, err := q.Get(ctx, info.ID, "ops"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("other tenant: got %v, want ErrNotFound", err)
	}
	for _, id := range []string{"nope", "stripe.default.none", "other.default.x", "a.b.c.d"} {
		if _, err := q.Get(ctx, id, ""); !errors.Is(err, ErrNotFound) {
			t.Errorf("Get(%q): got %v, want ErrNotFound", id, err)
		}
	}
	counts, err := q.Counts(ctx, "stripe")
	if err != nil || counts["default"].Pending != 1 || counts["bulk"].Pending != 0 {
		t.Fatalf("counts: got %+v, %v", counts, err)
	}
}

func TestEnqueueIsIdempotent(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	q := newQueue(t, rdb, upstreams(100))
	first, created, err := q.Enqueue(ctx, &Job{Tenant: "billing", Upstream: "stripe", Path: "/a", IdempotencyKey: "order-17"})
	if err != nil || !created {
		t.Fatalf("first: %v %v", created, err)
	}
	again, created, err := q.Enqueue(ctx, &Job{Tenant: "billing", Upstream: "stripe", Path: "/different", IdempotencyKey: "order-17"})
	if err != nil || created {
		t.Fatalf("repeat: got created %v, %v; want the existing job", created, err)
	}
	if again.ID != first.ID || again.Path != "/a" || again.IdempotencyKey != "order-17" {
		t.Fatalf("repeat returned %+v, want the first job %s", again, first.ID)
	}
	// The same key from another tenant is another job.
	other, created, err := q.Enqueue(ctx, &Job{Tenant: "ops", Upstream: "stripe", Path: "/a", IdempotencyKey: "order-17"})
	if err != nil || !created || other.ID == first.ID {
		t.Fatalf("other tenant: got %+v, %v, %v; want a new job", other, created, err)
	}
	if n, _ := q.Counts(ctx, "stripe"); n["default"].Pending != 2 {
		t.Fatalf("pending: got %d, want 2", n["default"].Pending)
	}
}

func TestEnqueueRefusesBadJobsAndFullBacklog(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	q := newQueue(t, rdb, upstreams(3))
	if _, _, err := q.Enqueue(ctx, &Job{Upstream: "nope"}); !errors.Is(err, ErrUnknownUpstream) {
		t.Fatalf("unknown upstream: got %v", err)
	}
	if _, _, err := q.Enqueue(ctx, &Job{Upstream: "stripe", Lane: "vip"}); !errors.Is(err, ErrUnknownLane) || !strings.Contains(err.Error(), "default, bulk") {
		t.Fatalf("unknown lane: got %v, want ErrUnknownLane naming the lanes", err)
	}
	for _, p := range []string{strings.Repeat("p", shaper.MaxPartitionBytes+1), "a\nb", "\xff"} {
		if _, _, err := q.Enqueue(ctx, &Job{Upstream: "stripe", Partition: p}); !errors.Is(err, shaper.ErrInvalid) || !strings.HasPrefix(err.Error(), "partition: ") {
			t.Fatalf("partition %q: got %v, want shaper.ErrInvalid about the partition", p, err)
		}
	}
	if n, _ := q.pendingCount(ctx, "stripe"); n != 0 {
		t.Fatalf("after bad partitions: %d jobs, want 0 (nothing enqueued)", n)
	}
	for i := 0; i < 3; i++ {
		if _, _, err := q.Enqueue(ctx, &Job{Upstream: "stripe", Lane: []string{"default", "bulk"}[i%2]}); err != nil {
			t.Fatal(err)
		}
	}
	_, _, err := q.Enqueue(ctx, &Job{Upstream: "stripe"})
	var full *BacklogFullError
	if !errors.As(err, &full) || full.Pending != 3 || full.Max != 3 || !errors.Is(err, ErrBacklogFull) {
		t.Fatalf("got %v, want a BacklogFullError at 3 of 3", err)
	}
	if n, _ := q.pendingCount(ctx, "stripe"); n != 3 {
		t.Fatalf("after refusal: %d jobs, want 3 (nothing enqueued)", n)
	}
}

func TestCancel(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	q := newQueue(t, rdb, upstreams(100))
	info, _, err := q.Enqueue(ctx, &Job{Tenant: "t", Upstream: "stripe", NotBefore: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if info.State != StateScheduled {
		t.Fatalf("got %s, want scheduled", info.State)
	}
	if _, err := q.Cancel(ctx, info.ID, "other"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("cancel by another tenant: got %v, want ErrNotFound", err)
	}
	got, err := q.Cancel(ctx, info.ID, "t")
	if err != nil || got.State != StateCancelled {
		t.Fatalf("cancel: got %+v, %v", got, err)
	}
	again, err := q.Get(ctx, info.ID, "t")
	if err != nil || again.State != StateCancelled {
		t.Fatalf("after cancel: got %+v, %v; want cancelled", again, err)
	}
	// The mark outlives the job (dead retention 1h) by a day, so that the
	// sweep that drops the job still reads it as cancelled.
	if ttl := rdb.TTL(ctx, q.cancelKey(info.ID)).Val(); ttl <= 24*time.Hour || ttl > 25*time.Hour {
		t.Fatalf("cancel mark TTL %v, want the dead retention (1h) and a day", ttl)
	}
	if n, _ := q.Counts(ctx, "stripe"); n["default"].Backlog() != 0 || n["default"].Dead != 1 {
		t.Fatalf("counts after cancel: %+v", n["default"])
	}
}

// TestStatesThroughAsynq checks the states a worker's outcomes leave a
// job in, as asynq's Inspector reads them,, including a deferral that spends no attempt.
func TestStatesThroughAsynq(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	q := newQueue(t, rdb, upstreams(100))
	deferred, _, _ := q.Enqueue(ctx, &Job{Upstream: "stripe", Path: "/defer"})
	done, _, _ := q.Enqueue(ctx, &Job{Upstream: "stripe", Path: "/ok"})
	dead, _, _ := q.Enqueue(ctx, &Job{Upstream: "stripe", Path: "/dead"})
	// Take them as a worker does and record each outcome.
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
	tk, err := taker.Take(ctx, 10)
	if err != nil || len(tk.Jobs) != 3 {
		t.Fatalf("took %d jobs, %v; want 3", len(tk.Jobs), err)
	}
	result, err := EncodeResponse(&Response{Status: 200, Body: []byte("ok")})
	if err != nil {
		t.Fatal(err)
	}
	var items []jobstore.Finished
	for _, j := range tk.Jobs {
		msg, err := jobstore.Unmarshal(j.Msg)
		if err != nil {
			t.Fatal(err)
		}
		f := jobstore.Finished{ID: j.ID, Lane: "default", Msg: msg}
		switch j.ID {
		case deferred.ID:
			f.Outcome, f.RetryAt, f.ErrMsg = jobstore.Retry, time.Now().Add(time.Hour), "waiting: upstream blocked"
		case done.ID:
			f.Outcome, f.Retention, f.Result = jobstore.Succeeded, time.Hour, result
		default:
			f.Outcome, f.ErrMsg = jobstore.Dead, "upstream said 400"
		}
		items = append(items, f)
	}
	if _, err := jobstore.Finish(ctx, rdb, jobstore.AsynqKeys(jobstore.QueueName("stripe")), space.CountsKey(), space.BacklogKey(), items); err != nil {
		t.Fatal(err)
	}
	want := map[string]State{deferred.ID: StateScheduled, done.ID: StateSucceeded, dead.ID: StateDead}
	for id, state := range want {
		info, err := q.Get(ctx, id, "")
		if err != nil || info.State != state {
			t.Fatalf("job %s: got %+v, %v; want %s", id, info, err, state)
		}
		switch state {
		case StateScheduled:
			if info.Attempts != 0 || info.LastError != "" {
				t.Errorf("deferred job: got %d attempts and error %q, want none", info.Attempts, info.LastError)
			}
		case StateSucceeded:
			if info.Response == nil || info.Response.Status != 200 || string(info.Response.Body) != "ok" {
				t.Errorf("succeeded job: got response %+v", info.Response)
			}
		case StateDead:
			if info.Attempts != 1 || !strings.Contains(info.LastError, "400") {
				t.Errorf("dead job: got %d attempts, error %q", info.Attempts, info.LastError)
			}
		}
	}
	// A resume makes the deferred job due at once, and touches nothing else.
	moved, err := q.RunDeferred(ctx, "stripe")
	if err != nil || moved != 1 {
		t.Fatalf("RunDeferred: moved %d, %v; want the one deferred job", moved, err)
	}
	if info, _ := q.Get(ctx, deferred.ID, ""); info.State != StateQueued {
		t.Fatalf("deferred job after RunDeferred: %s, want queued", info.State)
	}
	if info, _ := q.Get(ctx, dead.ID, ""); info.State != StateDead {
		t.Fatalf("dead job after RunDeferred: %s, want still dead", info.State)
	}
}

func TestIDs(t *testing.T) {
	a := IdempotentID("t", "stripe", "default", "k")
	if a != IdempotentID("t", "stripe", "default", "k") || a == IdempotentID("u", "stripe", "default", "k") {
		t.Fatal("idempotent IDs must depend on tenant and key only")
	}
	n := NewID("t", "s", "l")
	if n == NewID("t", "s", "l") {
		t.Fatal("two new IDs were equal")
	}
	byHand := "stripe.default.order-17" // set in Job.ID by a Go caller
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{a, true}, {n, true}, {byHand, true}, {"stripe.default.3kq7zxmbe2ltwvyd4ph5ia6c", true}, {"stripe.default.x", true},
		{"Stripe.default.x", false}, {"stripe..x", false}, {"", false}, {"a.b.c.d", false},
	} {
		if _, _, err := ParseID(tc.id); (err == nil) != tc.ok {
			t.Errorf("ParseID(%q): got %v, want ok=%v", tc.id, err, tc.ok)
		}
	}
	for _, id := range []string{a, n} {
		if !strings.HasPrefix(id[strings.LastIndexByte(id, '.')+1:], tenantTag("t")+"-") {
			t.Errorf("ID %q does not carry tenant t's tag %s", id, tenantTag("t"))
		}
		if strings.ContainsAny(id, "{}") || strings.Trim(id, "abcdefghijklmnopqrstuvwxyz0123456789.-") != "" {
			t.Errorf("ID %q holds characters outside [a-z0-9.-]", id)
		}
		if foreignID(id, "t") || !foreignID(id, "u") {
			t.Errorf("foreignID(%q): wrong for its own tenant t or for another u", id)
		}
	}
	// IDs without a tag are never foreign by their tag: the payload decides.
	for _, id := range []string{byHand, "stripe.default.3kq7zxmbe2ltwvyd4ph5ia6c", "stripe.default.abcdef12"} {
		if foreignID(id, "u") {
			t.Errorf("foreignID(%q, u): true for an ID without a tag", id)
		}
	}
}

// TestForeignTenantIsNotFound: another tenant's job is not found, by Get or
// Cancel, whatever the ID's format; with a tagged ID that is decided before
// Redis is asked, so an unreachable Redis makes no difference.
func TestForeignTenantIsNotFound(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	q := newQueue(t, rdb, upstreams(100))
	tagged, _, err := q.Enqueue(ctx, &Job{Tenant: "billing", Upstream: "stripe", Path: "/a"})
	if err != nil {
		t.Fatal(err)
	}
	keyed, _, err := q.Enqueue(ctx, &Job{Tenant: "billing", Upstream: "stripe", Path: "/b", IdempotencyKey: "k1"})
	if err != nil {
		t.Fatal(err)
	}
	// A job whose ID a Go caller set, without a tag.
	byHand, _, err := q.Enqueue(ctx, &Job{ID: "stripe.default.order-17", Tenant: "billing", Upstream: "stripe", Path: "/c"})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{tagged.ID, keyed.ID, byHand.ID} {
		if _, err := q.Get(ctx, id, "billing"); err != nil {
			t.Errorf("own tenant's Get(%s): %v", id, err)
		}
		if _, err := q.Get(ctx, id, "ops"); !errors.Is(err, ErrNotFound) {
			t.Errorf("other tenant's Get(%s): got %v, want ErrNotFound", id, err)
		}
		if _, err := q.Cancel(ctx, id, "ops"); !errors.Is(err, ErrNotFound) {
			t.Errorf("other tenant's Cancel(%s): got %v, want ErrNotFound", id, err)
		}
	}
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer down.Close()
	qd := newQueue(t, down, upstreams(100))
	for _, id := range []string{tagged.ID, keyed.ID} {
		if _, err := qd.Get(ctx, id, "ops"); !errors.Is(err, ErrNotFound) {
			t.Errorf("other tenant's Get(%s) without Redis: got %v, want ErrNotFound before any Redis call", id, err)
		}
	}
	if _, err := qd.Get(ctx, tagged.ID, "billing"); err == nil || errors.Is(err, ErrNotFound) {
		t.Errorf("own tenant's Get without Redis: got %v, want a store error (the test must reach Redis)", err)
	}
}

// TestIdempotentEnqueueRoundTrips: an idempotent enqueue, first or
// repeated, asks Redis nothing beyond the enqueue itself.
func TestIdempotentEnqueueRoundTrips(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	var mu sync.Mutex
	sent := map[string]int{}
	rdb.AddHook(commandCounter{&mu, sent})
	q := newQueue(t, rdb, upstreams(100))
	for i := 0; i < 2; i++ {
		if _, _, err := q.Enqueue(ctx, &Job{Tenant: "billing", Upstream: "stripe", Path: "/a", IdempotencyKey: "order-1"}); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sent) == 0 {
		t.Fatal("the hook saw no commands: the test counts nothing")
	}
	if n := sent["exists"]; n != 0 {
		t.Errorf("two idempotent enqueues sent EXISTS %d times, want none (commands: %v)", n, sent)
	}
}

// commandCounter counts the commands a client sends, by name.
type commandCounter struct {
	mu   *sync.Mutex
	sent map[string]int
}

func (c commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.mu.Lock()
		c.sent[cmd.Name()]++
		c.mu.Unlock()
		return next(ctx, cmd)
	}
}
func (c commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.mu.Lock()
		for _, cmd := range cmds {
			c.sent[cmd.Name()]++
		}
		c.mu.Unlock()
		return next(ctx, cmds)
	}
}

func TestOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-master Redis Cluster takes seconds to start: runs in make test")
	}
	cl := redistest.NewCluster(t)
	ctx := context.Background()
	q := newQueue(t, cl.Client(t), []shaper.Upstream{
		{Name: "a", Limits: []leaky.Limit{leaky.PerSecond(1000)}, Lanes: map[string]int{"default": 1, "low": 1}, MaxPending: 10},
		{Name: "b", Limits: []leaky.Limit{leaky.PerSecond(1000)}, MaxPending: 10},
	})
	for _, up := range []string{"a", "b"} {
		info, _, err := q.Enqueue(ctx, &Job{Upstream: up, IdempotencyKey: "k"})
		if err != nil {
			t.Fatalf("enqueue on %s: %v", up, err)
		}
		if _, _, err := q.Enqueue(ctx, &Job{Upstream: up, IdempotencyKey: "k"}); err != nil {
			t.Fatalf("repeat on %s: %v", up, err)
		}
		if _, err := q.Get(ctx, info.ID, ""); err != nil {
			t.Fatalf("get on %s: %v", up, err)
		}
		if _, err := q.Counts(ctx, up); err != nil {
			t.Fatalf("counts on %s: %v", up, err)
		}
		if _, err := q.Cancel(ctx, info.ID, ""); err != nil {
			t.Fatalf("cancel on %s: %v", up, err)
		}
	}
}

// The queue relies on the upstream's one check, and says what it found.
func TestNewValidatesUpstreams(t *testing.T) {
	rdb := srv.Client(t)
	_, err := New(rdb, Config{Upstreams: []shaper.Upstream{{Name: "stripe", Lanes: map[string]int{"default": 1, "Bulk": 1}}}})
	var ps *shaper.Problems
	if !errors.As(err, &ps) || len(ps.List) != 2 || ps.List[0].Field() != "limits" || ps.List[1].Field() != "lanes.Bulk" {
		t.Fatalf("got %v, want the missing limits and the lane's name", err)
	}
}
