package jobstore

import (
	"context"
	"errors"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

var srv *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &srv) }

// env is one queue on a flushed Redis, with asynq's client and inspector
// over the same connection pool, and shaper's counter keys for the queue.
type env struct {
	t        testing.TB
	rdb      redis.UniversalClient
	k        Keys
	client   *asynq.Client
	insp     *asynq.Inspector
	counts   string
	pbacklog string
}

func newEnv(t testing.TB, queue string) *env {
	t.Helper()
	rdb := srv.Client(t)
	if err := rdb.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	return newEnvOn(t, rdb, queue)
}

func newEnvOn(t testing.TB, rdb redis.UniversalClient, queue string) *env {
	k := AsynqKeys(queue)
	return &env{t: t, rdb: rdb, k: k,
		client: asynq.NewClientFromRedisClient(rdb), insp: asynq.NewInspectorFromRedisClient(rdb),
		counts: "shaper:" + k.HashTag() + ":counts", pbacklog: "shaper:" + k.HashTag() + ":pbacklog"}
}

// enqueue puts a task in the queue with asynq's client, records shaper's
// lane and partition in its hash, and counts it in as shaper's enqueue
// would.
func (e *env) enqueue(id, lane, partition string, opts ...asynq.Option) {
	e.t.Helper()
	ctx := context.Background()
	opts = append([]asynq.Option{asynq.TaskID(id), asynq.Queue(e.k.Queue()), asynq.MaxRetry(3)}, opts...)
	if _, err := e.client.EnqueueContext(ctx, asynq.NewTask("call", []byte("body of "+id)), opts...); err != nil {
		e.t.Fatal(err)
	}
	must(e.t, e.rdb.HSet(ctx, e.k.Task(id), "sl", lane, "sp", partition).Err())
	e.count("pending:"+lane, 1)
	if partition != "" {
		must(e.t, e.rdb.ZIncrBy(ctx, e.pbacklog, 1, partition).Err())
	}
}

// take moves the oldest pending task to active as asynq's dequeue does
// (RPOPLPUSH pending -> active, state active, a lease), counts it over, and
// returns its message.
func (e *env) take(wantID string, leaseUntil time.Time) *Message {
	e.t.Helper()
	ctx := context.Background()
	id, err := e.rdb.RPopLPush(ctx, e.k.Pending(), e.k.Active()).Result()
	if err != nil || id != wantID {
		e.t.Fatalf("take: got %q, %v, want %q", id, err, wantID)
	}
	must(e.t, e.rdb.HSet(ctx, e.k.Task(id), "state", "active").Err())
	must(e.t, e.rdb.HDel(ctx, e.k.Task(id), "pending_since").Err())
	must(e.t, e.rdb.ZAdd(ctx, e.k.Lease(), redisZ(leaseUntil, id)).Err())
	lane := e.rdb.HGet(ctx, e.k.Task(id), "sl").Val()
	e.count("pending:"+lane, -1)
	e.count("active:"+lane, 1)
	raw, err := e.rdb.HGet(ctx, e.k.Task(id), "msg").Bytes()
	if err != nil {
		e.t.Fatal(err)
	}
	m, err := Unmarshal(raw)
	if err != nil {
		e.t.Fatal(err)
	}
	return m
}

// count moves a counter as shaper's scripts do: a field at zero goes.
func (e *env) count(field string, by int64) {
	e.t.Helper()
	ctx := context.Background()
	n, err := e.rdb.HIncrBy(ctx, e.counts, field, by).Result()
	must(e.t, err)
	if n <= 0 {
		must(e.t, e.rdb.HDel(ctx, e.counts, field).Err())
	}
}

// taken enqueues and takes a task with a lease a minute long.
func (e *env) taken(id, lane, partition string, opts ...asynq.Option) *Message {
	e.t.Helper()
	e.enqueue(id, lane, partition, opts...)
	return e.take(id, time.Now().Add(time.Minute))
}

// countsNow is shaper's counter hash, with values parsed.
func (e *env) countsNow() map[string]int64 {
	e.t.Helper()
	raw, err := e.rdb.HGetAll(context.Background(), e.counts).Result()
	if err != nil {
		e.t.Fatal(err)
	}
	out := make(map[string]int64, len(raw))
	for f, v := range raw {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			e.t.Fatal(err)
		}
		out[f] = n
	}
	return out
}

// backlog is the partition backlog, member -> score.
func (e *env) backlog() map[string]float64 {
	e.t.Helper()
	zs, err := e.rdb.ZRangeWithScores(context.Background(), e.pbacklog, 0, -1).Result()
	if err != nil {
		e.t.Fatal(err)
	}
	out := make(map[string]float64, len(zs))
	for _, z := range zs {
		out[z.Member.(string)] = z.Score
	}
	return out
}

func (e *env) info(id string) *asynq.TaskInfo {
	e.t.Helper()
	ti, err := e.insp.GetTaskInfo(e.k.Queue(), id)
	if err != nil {
		e.t.Fatalf("GetTaskInfo(%s): %v", id, err)
	}
	return ti
}

func (e *env) queueInfo() *asynq.QueueInfo {
	e.t.Helper()
	qi, err := e.insp.GetQueueInfo(e.k.Queue())
	if err != nil {
		e.t.Fatal(err)
	}
	return qi
}

// sizes is a queue's sizes and stats as asynq's Inspector reports them:
// pending, active, scheduled, retry, archived, completed, processed today,
// failed today, processed total, failed total.
func (e *env) sizes() [10]int {
	e.t.Helper()
	q := e.queueInfo()
	return [10]int{q.Pending, q.Active, q.Scheduled, q.Retry, q.Archived, q.Completed,
		q.Processed, q.Failed, q.ProcessedTotal, q.FailedTotal}
}

func (e *env) finish(items ...Finished) []error {
	e.t.Helper()
	errs, err := Finish(context.Background(), e.rdb, e.k, e.counts, e.pbacklog, items)
	if err != nil {
		e.t.Fatal(err)
	}
	return errs
}

func redisZ(t time.Time, member string) redis.Z {
	return redis.Z{Score: float64(t.UnixMilli()) / 1000, Member: member}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestFinishSucceededKept(t *testing.T) {
	e := newEnv(t, "q")
	m := e.taken("a", "default", "acct-1")
	e.enqueue("b", "default", "acct-1") // stays pending, same partition
	before := time.Now()
	errs := e.finish(Finished{ID: "a", Lane: "default", Partition: "acct-1", Msg: m, Outcome: Succeeded,
		Result: []byte(`{"ok":true}`), Retention: 90 * time.Minute})
	if errs[0] != nil {
		t.Fatalf("got %v, want nil", errs[0])
	}
	ti := e.info("a")
	if ti.State != asynq.TaskStateCompleted || string(ti.Result) != `{"ok":true}` || ti.Retention != 90*time.Minute ||
		ti.CompletedAt.Before(before.Truncate(time.Second)) || ti.CompletedAt.After(time.Now()) {
		t.Fatalf("got state %v, result %q, retention %v, completed at %v; want completed with the result, 90m, now",
			ti.State, ti.Result, ti.Retention, ti.CompletedAt)
	}
	if got, want := e.sizes(), [10]int{1, 0, 0, 0, 0, 1, 1, 0, 1, 0}; got != want {
		t.Fatalf("queue sizes: got %v, want %v", got, want)
	}
	if got, want := e.countsNow(), map[string]int64{"pending:default": 1, "succeeded:default": 1}; !reflect.DeepEqual(got, want) {
		t.Fatalf("counts: got %v, want %v", got, want)
	}
	if got, want := e.backlog(), map[string]float64{"acct-1": 1}; !reflect.DeepEqual(got, want) {
		t.Fatalf("pbacklog: got %v, want %v", got, want)
	}
	score := e.rdb.ZScore(context.Background(), e.k.Completed(), "a").Val()
	if until := ScoreTime(score); until.Sub(before.Truncate(time.Millisecond)) < 90*time.Minute || until.Sub(time.Now()) > 90*time.Minute {
		t.Fatalf("completed until %v, want 90m from now", until)
	}
	// The daily stats key expires as asynq's does.
	ttl := e.rdb.TTL(context.Background(), e.k.Processed(time.Now())).Val()
	if ttl < statsTTL-time.Minute || ttl > statsTTL {
		t.Fatalf("processed key TTL: got %v, want about %v", ttl, statsTTL)
	}
}

func TestFinishSucceededDeleted(t *testing.T) {
	e := newEnv(t, "q")
	m := e.taken("a", "bulk", "acct-1")
	errs := e.finish(Finished{ID: "a", Lane: "bulk", Partition: "acct-1", Msg: m, Outcome: Succeeded, Result: []byte("x")})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	if _, err := e.insp.GetTaskInfo("q", "a"); !errors.Is(err, asynq.ErrTaskNotFound) {
		t.Fatalf("GetTaskInfo: got %v, want ErrTaskNotFound", err)
	}
	if n := e.rdb.Exists(context.Background(), e.k.Task("a")).Val(); n != 0 {
		t.Fatalf("task hash still exists")
	}
	if got, want := e.sizes(), [10]int{0, 0, 0, 0, 0, 0, 1, 0, 1, 0}; got != want {
		t.Fatalf("queue sizes: got %v, want %v", got, want)
	}
	if got := e.countsNow(); len(got) != 0 {
		t.Fatalf("counts: got %v, want every field gone at zero", got)
	}
	if got := e.backlog(); len(got) != 0 {
		t.Fatalf("pbacklog: got %v, want the partition gone at zero", got)
	}
}

func TestFinishSucceededReleasesUniqueLock(t *testing.T) {
	e := newEnv(t, "q")
	m := e.taken("a", "default", "", asynq.Unique(time.Hour))
	if m.UniqueKey == "" {
		t.Fatal("asynq wrote no unique key")
	}
	e.finish(Finished{ID: "a", Lane: "default", Msg: m, Outcome: Succeeded, Retention: time.Minute})
	if n := e.rdb.Exists(context.Background(), m.UniqueKey).Val(); n != 0 {
		t.Fatalf("unique lock %s still held", m.UniqueKey)
	}
}

func TestFinishRetry(t *testing.T) {
	for _, tc := range []struct {
		name        string
		failure     bool
		waitsFor    string
		wantRetried int
		wantStats   [4]int // processed, failed today; processed, failed total
		wantCounts  map[string]int64
		wantSD      string // the task hash's sd field: "1" marks a deferral that names no cause
	}{
		{"failure spends an attempt", true, "", 2, [4]int{1, 1, 1, 1}, map[string]int64{"retry:default": 1}, ""},
		{"deferral spends none", false, "", 1, [4]int{0, 0, 0, 0}, map[string]int64{"deferred:default": 1}, "1"},
		{"deferral for pushback", false, "pushback", 1, [4]int{0, 0, 0, 0}, map[string]int64{"deferred:default": 1}, "pushback"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "q")
			m := e.taken("a", "default", "acct-1")
			m.Retried = 1 // as taken after one failed attempt
			retryAt := time.Now().Add(42 * time.Second).Truncate(time.Millisecond).Add(250 * time.Millisecond)
			before := time.Now()
			errs := e.finish(Finished{ID: "a", Lane: "default", Partition: "acct-1", Msg: m, Outcome: Retry,
				RetryAt: retryAt, ErrMsg: "upstream 503", Failure: tc.failure, WaitsFor: tc.waitsFor})
			if errs[0] != nil {
				t.Fatal(errs[0])
			}
			ti := e.info("a")
			if ti.State != asynq.TaskStateRetry || ti.Retried != tc.wantRetried || ti.LastErr != "upstream 503" ||
				!ti.NextProcessAt.Equal(time.Unix(retryAt.Unix(), 0)) {
				t.Fatalf("got state %v, retried %d, last err %q, next %v; want retry, %d, upstream 503, %v",
					ti.State, ti.Retried, ti.LastErr, ti.NextProcessAt, tc.wantRetried, time.Unix(retryAt.Unix(), 0))
			}
			// A deferral is no failure: it leaves LastFailedAt alone.
			if failed := !ti.LastFailedAt.IsZero(); failed != tc.failure || failed && ti.LastFailedAt.Before(before.Truncate(time.Second)) {
				t.Fatalf("last failed at %v, want a time from now: %v", ti.LastFailedAt, tc.failure)
			}
			if got := e.rdb.HGet(context.Background(), e.k.Task("a"), "sd").Val(); got != tc.wantSD {
				t.Fatalf("sd field: got %q, want %q", got, tc.wantSD)
			}
			if what, back := WaitsFor(e.rdb.HGet(context.Background(), e.k.Task("a"), "sd").Val()); back == tc.failure || what != tc.waitsFor {
				t.Fatalf("WaitsFor: got %q, %v; want %q, %v", what, back, tc.waitsFor, !tc.failure)
			}
			// shaper keeps the milliseconds.
			score := e.rdb.ZScore(context.Background(), e.k.Retry(), "a").Val()
			if got := ScoreTime(score); !got.Equal(retryAt) {
				t.Fatalf("retry score: got %v, want %v", got, retryAt)
			}
			q := e.queueInfo()
			if got := [4]int{q.Processed, q.Failed, q.ProcessedTotal, q.FailedTotal}; got != tc.wantStats {
				t.Fatalf("stats: got %v, want %v", got, tc.wantStats)
			}
			if q.Retry != 1 || q.Active != 0 {
				t.Fatalf("got %d retry, %d active, want 1 and 0", q.Retry, q.Active)
			}
			if got, want := e.countsNow(), tc.wantCounts; !reflect.DeepEqual(got, want) {
				t.Fatalf("counts: got %v, want %v", got, want)
			}
			if got, want := e.backlog(), map[string]float64{"acct-1": 1}; !reflect.DeepEqual(got, want) {
				t.Fatalf("pbacklog: got %v, want %v (a retry stays in the backlog)", got, want)
			}
		})
	}
}

func TestFinishDead(t *testing.T) {
	e := newEnv(t, "q")
	m := e.taken("a", "default", "acct-1")
	e.taken("b", "default", "acct-1")
	before := time.Now()
	errs := e.finish(Finished{ID: "a", Lane: "default", Partition: "acct-1", Msg: m, Outcome: Dead, ErrMsg: "HTTP 400"})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	ti := e.info("a")
	if ti.State != asynq.TaskStateArchived || ti.LastErr != "HTTP 400" || ti.Retried != 0 ||
		ti.LastFailedAt.Before(before.Truncate(time.Second)) {
		t.Fatalf("got state %v, last err %q, retried %d, failed at %v; want archived, HTTP 400, 0, now",
			ti.State, ti.LastErr, ti.Retried, ti.LastFailedAt)
	}
	if got, want := e.sizes(), [10]int{0, 1, 0, 0, 1, 0, 1, 1, 1, 1}; got != want {
		t.Fatalf("queue sizes: got %v, want %v", got, want)
	}
	if got, want := e.countsNow(), map[string]int64{"active:default": 1, "dead:default": 1}; !reflect.DeepEqual(got, want) {
		t.Fatalf("counts: got %v, want %v", got, want)
	}
	if got, want := e.backlog(), map[string]float64{"acct-1": 1}; !reflect.DeepEqual(got, want) {
		t.Fatalf("pbacklog: got %v, want %v", got, want)
	}
}

func TestFinishBatch(t *testing.T) {
	e := newEnv(t, "q")
	var items []Finished
	for i := range 300 {
		id := "t" + strconv.Itoa(i)
		lane := []string{"default", "bulk"}[i%2]
		part := "p" + strconv.Itoa(i%7)
		m := e.taken(id, lane, part)
		it := Finished{ID: id, Lane: lane, Partition: part, Msg: m, ErrMsg: "e"}
		switch i % 3 {
		case 0:
			it.Outcome, it.Retention = Succeeded, time.Hour
		case 1:
			it.Outcome, it.Failure, it.RetryAt = Retry, true, time.Now().Add(time.Hour)
		case 2:
			it.Outcome = Dead
		}
		items = append(items, it)
	}
	// Not taken: still pending, or never there, or twice in the batch.
	e.enqueue("pending", "default", "p0")
	items = append(items,
		Finished{ID: "pending", Lane: "default", Partition: "p0", Msg: &Message{ID: "pending", Queue: "q"}, Outcome: Dead},
		Finished{ID: "ghost", Lane: "default", Msg: &Message{ID: "ghost", Queue: "q"}, Outcome: Succeeded},
		items[0])
	errs := e.finish(items...)
	for i, err := range errs {
		want := error(nil)
		if i >= 300 {
			want = ErrNotActive
		}
		if err != want {
			t.Fatalf("item %d (%s): got %v, want %v", i, items[i].ID, err, want)
		}
	}
	if got, want := e.sizes(), [10]int{1, 0, 0, 100, 100, 100, 300, 200, 300, 200}; got != want {
		t.Fatalf("queue sizes: got %v, want %v", got, want)
	}
	if ti := e.info("pending"); ti.State != asynq.TaskStatePending || ti.LastErr != "" {
		t.Fatalf("the pending task changed: %+v", ti)
	}
	want := map[string]int64{"pending:default": 1, "succeeded:default": 50, "succeeded:bulk": 50,
		"retry:default": 50, "retry:bulk": 50, "dead:default": 50, "dead:bulk": 50}
	if got := e.countsNow(); !reflect.DeepEqual(got, want) {
		t.Fatalf("counts: got %v, want %v", got, want)
	}
	// Each partition keeps its retries, plus the pending task in p0.
	wantBacklog := map[string]float64{}
	for i := range 300 {
		if i%3 == 1 {
			wantBacklog["p"+strconv.Itoa(i%7)]++
		}
	}
	wantBacklog["p0"]++
	if got := e.backlog(); !reflect.DeepEqual(got, wantBacklog) {
		t.Fatalf("pbacklog: got %v, want %v", got, wantBacklog)
	}
}

// TestFinishNeedsActiveAndLease: a task must be both in the active list
// and in the lease set to be finished, and one that is in only one of them
// is left as it is.
func TestFinishNeedsActiveAndLease(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "q")
	noLease := e.taken("no-lease", "default", "p")
	must(t, e.rdb.ZRem(ctx, e.k.Lease(), "no-lease").Err())
	notActive := e.taken("not-active", "default", "p")
	must(t, e.rdb.LRem(ctx, e.k.Active(), 0, "not-active").Err())
	errs := e.finish(
		Finished{ID: "no-lease", Lane: "default", Partition: "p", Msg: noLease, Outcome: Dead},
		Finished{ID: "not-active", Lane: "default", Partition: "p", Msg: notActive, Outcome: Dead})
	if errs[0] != ErrNotActive || errs[1] != ErrNotActive {
		t.Fatalf("got %v, want ErrNotActive twice", errs)
	}
	if e.rdb.LPos(ctx, e.k.Active(), "no-lease", redis.LPosArgs{}).Err() != nil {
		t.Fatal("the task without a lease left the active list")
	}
	if e.rdb.ZScore(ctx, e.k.Lease(), "not-active").Err() != nil {
		t.Fatal("the task outside the active list lost its lease")
	}
	if got, want := e.countsNow(), map[string]int64{"active:default": 2}; !reflect.DeepEqual(got, want) {
		t.Fatalf("counts: got %v, want %v", got, want)
	}
	if got, want := e.sizes(), [10]int{0, 1, 0, 0, 0, 0, 0, 0, 0, 0}; got != want {
		t.Fatalf("queue sizes: got %v, want %v", got, want)
	}
}

func TestFinishRejectsBadItems(t *testing.T) {
	e := newEnv(t, "q")
	m := e.taken("a", "default", "")
	for _, tc := range []struct {
		name string
		it   Finished
	}{
		{"no id", Finished{Msg: m, Outcome: Dead}},
		{"no message", Finished{ID: "a", Outcome: Dead}},
		{"another task's message", Finished{ID: "b", Msg: m, Outcome: Dead}},
		{"another queue's message", Finished{ID: "a", Msg: &Message{ID: "a", Queue: "other"}, Outcome: Dead}},
		{"no outcome", Finished{ID: "a", Msg: m}},
	} {
		errs, err := Finish(context.Background(), e.rdb, e.k, e.counts, e.pbacklog, []Finished{tc.it})
		if err == nil || errs != nil {
			t.Errorf("%s: got %v, %v, want an error for the call", tc.name, errs, err)
		}
	}
	if ti := e.info("a"); ti.State != asynq.TaskStateActive {
		t.Fatalf("got %v, want the task still active", ti.State)
	}
}

// TestFinishRace has two clients, each on its own connection pool, finish
// the same tasks at once: exactly one wins each task.
func TestFinishRace(t *testing.T) {
	e := newEnv(t, "q")
	const n = 100
	msgs := make([]*Message, n)
	for i := range n {
		msgs[i] = e.taken("t"+strconv.Itoa(i), "default", "p")
	}
	clients := []*redis.Client{srv.Client(t), srv.Client(t)}
	outcomes := []Outcome{Succeeded, Dead}
	results := [2][n]error{}
	var wg sync.WaitGroup
	failed := make(chan error, 2*n)
	for i := range n {
		// Both start on each task together, so either may win it.
		start := make(chan struct{})
		for g := range 2 {
			wg.Go(func() {
				<-start
				errs, err := Finish(context.Background(), clients[g], e.k, e.counts, e.pbacklog, []Finished{{
					ID: "t" + strconv.Itoa(i), Lane: "default", Partition: "p", Msg: msgs[i], Outcome: outcomes[g], Retention: time.Hour}})
				if err != nil {
					failed <- err
					return
				}
				results[g][i] = errs[0]
			})
		}
		close(start)
	}
	wg.Wait()
	close(failed)
	for err := range failed {
		t.Fatal(err)
	}
	wins := [2]int{}
	for i := range n {
		a, b := results[0][i], results[1][i]
		switch {
		case a == nil && b == ErrNotActive:
			wins[0]++
		case b == nil && a == ErrNotActive:
			wins[1]++
		default:
			t.Fatalf("task %d: got %v and %v, want exactly one nil and one ErrNotActive", i, a, b)
		}
	}
	t.Logf("wins: %v", wins)
	if got, want := e.sizes(), [10]int{0, 0, 0, 0, wins[1], wins[0], n, wins[1], n, wins[1]}; got != want {
		t.Fatalf("queue sizes: got %v, want %v", got, want)
	}
	want := map[string]int64{"succeeded:default": int64(wins[0]), "dead:default": int64(wins[1])}
	for f, v := range want {
		if v == 0 {
			delete(want, f)
		}
	}
	if got := e.countsNow(); !reflect.DeepEqual(got, want) {
		t.Fatalf("counts: got %v, want %v", got, want)
	}
	if got := e.backlog(); len(got) != 0 {
		t.Fatalf("pbacklog: got %v, want empty", got)
	}
}

func TestExtendLeases(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "q")
	now := time.Now()
	e.taken("a", "default", "")
	m := e.taken("b", "default", "")
	e.finish(Finished{ID: "b", Lane: "default", Msg: m, Outcome: Succeeded})
	until := now.Add(5 * time.Minute).Truncate(time.Millisecond).Add(7 * time.Millisecond)
	must(t, ExtendLeases(ctx, e.rdb, e.k, []string{"a", "b", "never"}, until))
	zs := e.rdb.ZRangeWithScores(ctx, e.k.Lease(), 0, -1).Val()
	if len(zs) != 1 || zs[0].Member != "a" || !ScoreTime(zs[0].Score).Equal(until) {
		t.Fatalf("lease set: got %v, want only a, until %v", zs, until)
	}
	// asynq's Inspector reads the lease too: a is held, c (lease gone by)
	// is orphaned.
	e.enqueue("c", "default", "")
	e.take("c", now.Add(-2*time.Second))
	tasks, err := e.insp.ListActiveTasks("q")
	if err != nil {
		t.Fatal(err)
	}
	orphaned := map[string]bool{}
	for _, ti := range tasks {
		orphaned[ti.ID] = ti.IsOrphaned
	}
	if want := map[string]bool{"a": false, "c": true}; !reflect.DeepEqual(orphaned, want) {
		t.Fatalf("orphaned: got %v, want %v", orphaned, want)
	}
	must(t, ExtendLeases(ctx, e.rdb, e.k, nil, until))
}

func TestExpiredLeases(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "q")
	now := time.Now().Truncate(time.Millisecond)
	e.enqueue("old", "default", "p1")
	e.take("old", now.Add(-time.Minute))
	e.enqueue("just", "bulk", "")
	e.take("just", now)
	e.enqueue("live", "default", "p1")
	e.take("live", now.Add(time.Millisecond))
	// A lease whose task hash is gone.
	must(t, e.rdb.LPush(ctx, e.k.Active(), "gone").Err())
	must(t, e.rdb.ZAdd(ctx, e.k.Lease(), redisZ(now.Add(-time.Hour), "gone")).Err())

	got, err := ExpiredLeases(ctx, e.rdb, e.k, now, 10)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, x := range got {
		ids = append(ids, x.ID+"/"+x.Lane+"/"+x.Partition+"/"+x.Msg.ID+"/"+string(x.Msg.Payload))
	}
	want := []string{"old/default/p1/old/body of old", "just/bulk//just/body of just"}
	if !reflect.DeepEqual(ids, want) {
		t.Fatalf("got %v, want %v", ids, want)
	}
	if e.rdb.ZScore(ctx, e.k.Lease(), "gone").Err() != redis.Nil || e.rdb.LPos(ctx, e.k.Active(), "gone", redis.LPosArgs{}).Err() != redis.Nil {
		t.Fatal("the lease of a task without a hash was kept")
	}
	got, err = ExpiredLeases(ctx, e.rdb, e.k, now, 1)
	if err != nil || len(got) != 1 || got[0].ID != "old" {
		t.Fatalf("limit 1: got %v, %v, want old only", got, err)
	}
	if _, err := ExpiredLeases(ctx, e.rdb, e.k, now, 0); err == nil {
		t.Fatal("limit 0: got no error")
	}
}

func TestRecover(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "q")
	now := time.Now()
	past := now.Add(-time.Second)
	// MaxRetry is max_attempts in shaper: 3 attempts.
	e.enqueue("first", "default", "p")
	e.take("first", past) // attempt 1 of 3 lost
	e.enqueue("last", "default", "p")
	e.take("last", past)
	must(t, e.rdb.HSet(ctx, e.k.Task("last"), "msg", (&Message{Type: "call", ID: "last", Queue: "q", Retry: 3, Retried: 2}).Marshal()).Err())
	e.enqueue("live", "default", "p")
	e.take("live", now.Add(time.Minute))

	n, err := Recover(ctx, e.rdb, e.k, e.counts, e.pbacklog, now, 100)
	if err != nil || n != 2 {
		t.Fatalf("got %d, %v, want 2 recovered", n, err)
	}
	if ti := e.info("first"); ti.State != asynq.TaskStateRetry || ti.Retried != 1 || ti.LastErr != LeaseExpiredError ||
		ti.NextProcessAt.Unix() != now.Unix() {
		t.Fatalf("first: got %v, retried %d, %q, next %v; want retry now with 1 attempt spent", ti.State, ti.Retried, ti.LastErr, ti.NextProcessAt)
	}
	if ti := e.info("last"); ti.State != asynq.TaskStateArchived || ti.Retried != 2 || ti.LastErr != LeaseExpiredError {
		t.Fatalf("last: got %v, retried %d, %q; want archived", ti.State, ti.Retried, ti.LastErr)
	}
	if got, want := e.countsNow(), map[string]int64{"active:default": 1, "retry:default": 1, "dead:default": 1}; !reflect.DeepEqual(got, want) {
		t.Fatalf("counts: got %v, want %v", got, want)
	}
	if got, want := e.backlog(), map[string]float64{"p": 2}; !reflect.DeepEqual(got, want) {
		t.Fatalf("pbacklog: got %v, want %v", got, want)
	}
	if got, want := e.sizes(), [10]int{0, 1, 0, 1, 1, 0, 2, 2, 2, 2}; got != want {
		t.Fatalf("queue sizes: got %v, want %v", got, want)
	}
	if n, err := Recover(ctx, e.rdb, e.k, e.counts, e.pbacklog, now, 100); err != nil || n != 0 {
		t.Fatalf("again: got %d, %v, want nothing left", n, err)
	}
}

func TestExhausted(t *testing.T) {
	for _, tc := range []struct {
		retry, retried int32
		want           bool
	}{
		{3, 0, false}, {3, 1, false}, {3, 2, true}, {3, 3, true}, {1, 0, true}, {0, 0, true},
	} {
		if got := Exhausted(&Message{Retry: tc.retry, Retried: tc.retried}); got != tc.want {
			t.Errorf("Exhausted(retry %d, retried %d): got %v, want %v", tc.retry, tc.retried, got, tc.want)
		}
	}
}

func TestDeleteExpired(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "q")
	for i := range 6 {
		id := "c" + strconv.Itoa(i)
		m := e.taken(id, []string{"default", "bulk"}[i%2], "")
		e.finish(Finished{ID: id, Lane: []string{"default", "bulk"}[i%2], Msg: m, Outcome: Succeeded,
			Retention: time.Duration(i+1) * time.Hour})
		id = "d" + strconv.Itoa(i)
		m = e.taken(id, "default", "")
		e.finish(Finished{ID: id, Lane: "default", Msg: m, Outcome: Dead})
	}
	// A task asynq's client put in the completed set has no lane.
	must(t, e.rdb.HSet(ctx, e.k.Task("foreign"), "msg", (&Message{ID: "foreign", Queue: "q"}).Marshal(), "state", "completed").Err())
	must(t, e.rdb.ZAdd(ctx, e.k.Completed(), redisZ(time.Now(), "foreign")).Err())

	// Completed tasks expire at the end of their retention: by now+3h30m,
	// c0, c1, c2 and foreign have.
	cutoff := time.Now().Add(3*time.Hour + 30*time.Minute)
	n, err := DeleteExpired(ctx, e.rdb, e.k, e.counts, Completed, cutoff, 3)
	if err != nil || n != 3 {
		t.Fatalf("got %d, %v, want 3 (the limit)", n, err)
	}
	n, err = DeleteExpired(ctx, e.rdb, e.k, e.counts, Completed, cutoff, 3)
	if err != nil || n != 1 {
		t.Fatalf("got %d, %v, want the 1 left", n, err)
	}
	left := e.rdb.ZRange(ctx, e.k.Completed(), 0, -1).Val()
	if !reflect.DeepEqual(left, []string{"c3", "c4", "c5"}) {
		t.Fatalf("completed left: got %v, want c3 c4 c5", left)
	}
	for _, id := range []string{"c0", "c1", "c2", "foreign"} {
		if e.rdb.Exists(ctx, e.k.Task(id)).Val() != 0 {
			t.Fatalf("task %s still has a hash", id)
		}
	}
	// Archived tasks are scored by when they died: all of them go.
	n, err = DeleteExpired(ctx, e.rdb, e.k, e.counts, Archived, time.Now().Add(time.Second), 100)
	if err != nil || n != 6 {
		t.Fatalf("archived: got %d, %v, want 6", n, err)
	}
	if got, want := e.countsNow(), map[string]int64{"succeeded:default": 1, "succeeded:bulk": 2}; !reflect.DeepEqual(got, want) {
		t.Fatalf("counts: got %v, want %v", got, want)
	}
	if got, want := e.sizes(), [10]int{0, 0, 0, 0, 0, 3, 12, 6, 12, 6}; got != want {
		t.Fatalf("queue sizes: got %v, want %v", got, want)
	}
	if _, err := DeleteExpired(ctx, e.rdb, e.k, e.counts, Zset(9), cutoff, 1); err == nil {
		t.Fatal("unknown set: got no error")
	}
}
