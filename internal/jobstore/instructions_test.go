package jobstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/queue"
	"github.com/shaperhq/shaper/tokenbucket"
)

// irPayload is a job's payload of the size the dispatch benchmark's jobs
// have, so that messages cost what they cost there.
var irPayload = []byte(`{"upstream":"noop","method":"POST","path":"/v1/items/1","headers":{"Content-Type":"application/json"},` +
	`"body":"eyJuIjoxfQ==","idempotency_key":"shaper-noop-000000000001","lane":"default","max_attempts":8}`)

// instructions is what Redis executed for each run of op, over n runs.
func instructions(t *testing.T, n int, op func(i int)) float64 {
	t.Helper()
	if _, err := srv().Instructions(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		op(i)
	}
	ir, err := srv().Instructions()
	if err != nil {
		t.Fatal(err)
	}
	return float64(ir) / float64(n)
}

// TestRedisInstructions measures (it asserts nothing) the instructions
// Redis executes for a take of k jobs, a finish of k, a proxied call's
// booking (with and without its admission) and, beside them, asynq's
// dequeue and done of one job: counts that do not move with the
// machine's load, as CPU time does. Each take and finish runs on an
// upstream of its own with few jobs active, as in the dispatch benchmark.
// Run it with
//
//	SHAPER_REDIS_CALLGRIND=$(mktemp -d) go test -count=1 -run TestRedisInstructions -v ./internal/jobstore/
func TestRedisInstructions(t *testing.T) {
	if _, err := srv().Instructions(); errors.Is(err, redistest.ErrNotCounted) {
		t.Skip("a measurement: set " + redistest.CallgrindEnv)
	}
	ctx := context.Background()
	rdb := srv().Client(t)
	const n = 200
	var rows []string
	row := func(name string, perOp float64, k int) {
		rows = append(rows, fmt.Sprintf("| %s | %.0f | %.0f |", name, perOp/1000, perOp/float64(k)/1000))
	}
	row("PING", instructions(t, n, func(int) { rdb.Ping(ctx) }), 1)

	// asynq's own server, ten workers, a no-op handler: its dequeue and
	// done scripts and its polls, per job.
	cl := asynq.NewClientFromRedisClient(rdb)
	const na = 2000
	for range na {
		if _, err := cl.Enqueue(asynq.NewTask("noop", irPayload), asynq.Queue("ir")); err != nil {
			t.Fatal(err)
		}
	}
	ran := make(chan struct{}, na)
	a := asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: 10, Queues: map[string]int{"ir": 1}, LogLevel: asynq.ErrorLevel})
	row("asynq: a job, dequeue and done (its server, 10 workers)", instructions(t, 1, func(int) {
		if err := a.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { ran <- struct{}{}; return nil })); err != nil {
			t.Fatal(err)
		}
		for range na {
			<-ran
		}
	})/na, 1)
	a.Shutdown()

	empty := newRig(t, rdb, fast("ir-empty"), 50*time.Millisecond)
	empty.take(1)
	row("take, nothing to take", instructions(t, n, func(int) { empty.take(1) }), 1)
	for _, k := range []int{1, 4, 10} {
		r := newRig(t, rdb, fast(fmt.Sprintf("ir-take%d", k)), 50*time.Millisecond)
		r.addSized(n*k, irPayload)
		take := instructions(t, n, func(int) {
			if ids := r.takeIDs(k); len(ids) != k {
				t.Fatalf("took %d, want %d", len(ids), k)
			}
		})
		row(fmt.Sprintf("take of %d", k), take, k)
		// Finished a take at a time, so that few jobs are active.
		f := newRig(t, rdb, fast(fmt.Sprintf("ir-finish%d", k)), 50*time.Millisecond)
		f.addSized(n*k, irPayload)
		both := instructions(t, n, func(int) {
			ids := f.takeIDs(k)
			f.succeed(ids...)
		})
		row(fmt.Sprintf("finish of %d (kept 24 h, as by default): take and finish less the take", k), both-take, k)
	}
	// A proxied call alone with room (call_turn.lua's quick way), booked
	// and its slot given back, as a call at an upstream with room is.
	c := newRig(t, rdb, fast("ir-call"), 50*time.Millisecond)
	row("proxied call alone with room: book (call_turn) and release", instructions(t, n, func(i int) {
		tn, err := c.space.BookCall(ctx, rdb, jobstore.Call{Upstream: c.u, Bucket: c.bucket, FairKey: "t", ID: fmt.Sprint(i),
			Lookahead: 250 * time.Millisecond, Remaining: time.Second})
		if err != nil || tn.Slot == nil {
			t.Fatalf("book: %+v, %v", tn, err)
		}
		c.bucket.Release(ctx, tn.Slot)
	}), 1)
	// The same call paying its key's admission in its booking, as the
	// proxy books one on a single Redis; beside it, admission asked on
	// its own (a lone caller's script), as a call on a Cluster pays it
	// before its booking; and ten calls booked together, each paying its
	// admission, as a CallBooker's batch books them under load.
	lim, err := tokenbucket.New(rdb, tokenbucket.Limit{Capacity: 1_000_000_000, Refill: 1_000_000, Per: time.Second}, tokenbucket.Config{Prefix: "ir"})
	if err != nil {
		t.Fatal(err)
	}
	row("a call's admission on its own (tokenbucket, a lone caller)", instructions(t, n, func(int) {
		if _, err := lim.Allow(ctx, "ir", 1); err != nil {
			t.Fatal(err)
		}
	}), 1)
	paying := func(id string) jobstore.Call {
		a, err := lim.Admission("ir", 1)
		if err != nil {
			t.Fatal(err)
		}
		return jobstore.Call{Upstream: c.u, Bucket: c.bucket, FairKey: "t", ID: id, Lookahead: 250 * time.Millisecond, Remaining: time.Second, Admit: &a}
	}
	row("proxied call alone with room, paying its admission in its booking", instructions(t, n, func(i int) {
		tn, err := c.space.BookCall(ctx, rdb, paying(fmt.Sprint("a", i)))
		if err != nil || tn.Slot == nil || !tn.Admitted {
			t.Fatalf("book: %+v, %v", tn, err)
		}
	}), 1)
	row("ten proxied calls booked together, each paying its admission", instructions(t, n, func(i int) {
		calls := make([]jobstore.Call, 10)
		for j := range calls {
			calls[j] = paying(fmt.Sprint("b", i, "-", j))
		}
		if _, err := c.space.BookCallsTogether(ctx, rdb, calls); err != nil {
			t.Fatal(err)
		}
	}), 10)
	t.Logf("Redis instructions (thousands; callgrind):\n| operation | per call | per job |\n| --- | ---: | ---: |\n%s", strings.Join(rows, "\n"))
}

// addSized enqueues n jobs whose messages carry payload.
func (r *rig) addSized(n int, payload []byte) {
	r.t.Helper()
	for i := range n {
		id := fmt.Sprintf("%s-%d", r.u.Name, i)
		e := r.entry(job{id: id})
		msg := jobstore.Message{Type: "http", ID: id, Queue: r.space.Queue, Payload: payload, Retry: 8}
		e.Msg = msg.Marshal()
		if ok, err := r.space.Enqueue(context.Background(), r.rdb, e); err != nil || !ok {
			r.t.Fatalf("enqueue %s: created %v, err %v", id, ok, err)
		}
		r.ids = append(r.ids, id)
		r.lane[id] = e.Lane
	}
}

// succeed finishes taken jobs as the dispatcher finishes a success: the
// message kept with the default retention, under the dispatcher's options
// (bounds on what is kept, final announcements, callbacks' due set).
func (r *rig) succeed(ids ...string) {
	r.t.Helper()
	items := make([]jobstore.Finished, len(ids))
	for i, id := range ids {
		msg := jobstore.Message{Type: "http", ID: id, Queue: r.space.Queue, Payload: irPayload, Retry: 8}
		items[i] = jobstore.Finished{ID: id, Lane: r.lane[id], Msg: &msg, Outcome: jobstore.Succeeded, Retention: 24 * time.Hour}
	}
	errs, err := jobstore.Finish(context.Background(), r.rdb, r.store, r.space.CountsKey(), r.space.BacklogKey(), items,
		jobstore.WakeOnRetry(r.space.SleepKey(), jobstore.WakeChannel(""), r.u.Name),
		jobstore.KeepAtMost(r.space.FinishBounds(r.u, queue.IdempotentIDPattern)), jobstore.AnnounceFinal(jobstore.FinalChannel("")),
		jobstore.Callbacks(r.space.CallbacksDueKey()))
	if err != nil {
		r.t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			r.t.Fatalf("finish %s: %v", ids[i], e)
		}
	}
}
