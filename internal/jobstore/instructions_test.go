package jobstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/shaperhq/shaper"
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
	ir, _ := measure(t, n, op)
	return ir
}

// measure is what Redis executed for each run of op, over n runs, and the
// commands it ran for each, script calls and the commands run inside
// scripts alike (INFO commandstats, read outside the instructions counted).
func measure(t *testing.T, n int, op func(i int)) (ir, cmds float64) {
	t.Helper()
	before := commandStats(t)
	if _, err := srv().Instructions(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		op(i)
	}
	total, err := srv().Instructions()
	if err != nil {
		t.Fatal(err)
	}
	var c int64
	for name, calls := range commandStats(t) {
		if name != "info" {
			c += calls - before[name]
		}
	}
	return float64(total) / float64(n), float64(c) / float64(n)
}

// TestRedisInstructions measures (it asserts nothing) the instructions
// Redis executes for a take of k jobs, a finish of k, a proxied call's
// booking (with and without its admission) and, beside them, asynq's
// dequeue and done of one job: counts that do not move with the
// machine's load, as CPU time does; and the commands Redis runs for each,
// which do not move either. Each take and finish runs on an upstream of
// its own with few jobs active, as in the dispatch benchmark: jobs of one
// lane, one fairness key and no partition (the common case), and, as the
// benchmark's -fair, jobs spread over 4 tenants (fair share by tenant) and
// 8 partitions with a partition limit too high to hold any back. Run it
// with
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
	row := func(name string, perOp, cmds float64, k int) {
		rows = append(rows, fmt.Sprintf("| %s | %.0f | %.0f | %.2f |", name, perOp/1000, perOp/float64(k)/1000, cmds/float64(k)))
	}
	ir, cmds := measure(t, n, func(int) { rdb.Ping(ctx) })
	row("PING", ir, cmds, 1)

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
	ir, cmds = measure(t, 1, func(int) {
		if err := a.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { ran <- struct{}{}; return nil })); err != nil {
			t.Fatal(err)
		}
		for range na {
			<-ran
		}
	})
	row("asynq: a job, dequeue and done (its server, 10 workers)", ir/na, cmds/na, 1)
	a.Shutdown()

	empty := newRig(t, rdb, fast("ir-empty"), 50*time.Millisecond)
	empty.take(1)
	ir, cmds = measure(t, n, func(int) { empty.take(1) })
	row("take, nothing to take", ir, cmds, 1)
	// (A partition limit as high as the upstream's gives a take as many
	// jobs as the upstream's: a take of the -fair case asking 32, as the
	// dispatcher's do, gives 32, four from each flow.)
	type size struct{ k, ask int }
	cases := []struct {
		name string
		u    shaper.Upstream
		job  func(i int) job
		ks   []size
	}{
		{"", fast("ir"), func(int) job { return job{} }, []size{{1, 1}, {4, 4}, {10, 10}}},
		{" (-fair: 4 tenants, 8 limited partitions)", fairUpstream("ir-fair"), func(i int) job {
			return job{tenant: fmt.Sprintf("t%d", i%4), partition: fmt.Sprintf("p%d", i%8)}
		}, []size{{1, 1}, {4, 4}, {8, 8}, {32, 32}}},
	}
	for _, c := range cases {
		for _, sz := range c.ks {
			k := sz.k
			name := fmt.Sprintf("%d%s", k, c.name)
			if sz.ask != k {
				name = fmt.Sprintf("%d, asking %d%s", k, sz.ask, c.name)
			}
			r := newRig(t, rdb, c.u, 50*time.Millisecond)
			r.addSized(n*k, irPayload, c.job)
			take, takeCmds := measure(t, n, func(int) {
				if ids := r.takeIDs(sz.ask); len(ids) != k {
					t.Fatalf("took %d, want %d", len(ids), k)
				}
			})
			row("take of "+name, take, takeCmds, k)
			// Finished a take at a time, so that few jobs are active.
			f := newRig(t, rdb, c.u, 50*time.Millisecond)
			f.addSized(n*k, irPayload, c.job)
			both, bothCmds := measure(t, n, func(int) {
				ids := f.takeIDs(sz.ask)
				f.succeed(ids...)
			})
			row("finish of "+name+" (kept 24 h, as by default): take and finish less the take", both-take, bothCmds-takeCmds, k)
		}
	}
	// A proxied call alone with room (call_turn.lua's quick way), booked
	// and its slot given back, as a call at an upstream with room is.
	c := newRig(t, rdb, fast("ir-call"), 50*time.Millisecond)
	ir, cmds = measure(t, n, func(i int) {
		tn, err := c.space.BookCall(ctx, rdb, jobstore.Call{Upstream: c.u, Bucket: c.bucket, FairKey: "t", ID: fmt.Sprint(i),
			Lookahead: 250 * time.Millisecond, Remaining: time.Second})
		if err != nil || tn.Slot == nil {
			t.Fatalf("book: %+v, %v", tn, err)
		}
		c.bucket.Release(ctx, tn.Slot)
	})
	row("proxied call alone with room: book (call_turn) and release", ir, cmds, 1)
	// The same call paying its key's admission in its booking, as the
	// proxy books one on a single Redis; beside it, admission asked on
	// its own (a lone caller's script), as a call on a Cluster pays it
	// before its booking; and ten calls booked together, each paying its
	// admission, as a CallBooker's batch books them under load.
	lim, err := tokenbucket.New(rdb, tokenbucket.Limit{Capacity: 1_000_000_000, Refill: 1_000_000, Per: time.Second}, tokenbucket.Config{Prefix: "ir"})
	if err != nil {
		t.Fatal(err)
	}
	ir, cmds = measure(t, n, func(int) {
		if _, err := lim.Allow(ctx, "ir", 1); err != nil {
			t.Fatal(err)
		}
	})
	row("a call's admission on its own (tokenbucket, a lone caller)", ir, cmds, 1)
	paying := func(id string) jobstore.Call {
		a, err := lim.Admission("ir", 1)
		if err != nil {
			t.Fatal(err)
		}
		return jobstore.Call{Upstream: c.u, Bucket: c.bucket, FairKey: "t", ID: id, Lookahead: 250 * time.Millisecond, Remaining: time.Second, Admit: &a}
	}
	ir, cmds = measure(t, n, func(i int) {
		tn, err := c.space.BookCall(ctx, rdb, paying(fmt.Sprint("a", i)))
		if err != nil || tn.Slot == nil || !tn.Admitted {
			t.Fatalf("book: %+v, %v", tn, err)
		}
	})
	row("proxied call alone with room, paying its admission in its booking", ir, cmds, 1)
	ir, cmds = measure(t, n, func(i int) {
		calls := make([]jobstore.Call, 10)
		for j := range calls {
			calls[j] = paying(fmt.Sprint("b", i, "-", j))
		}
		if _, err := c.space.BookCallsTogether(ctx, rdb, calls); err != nil {
			t.Fatal(err)
		}
	})
	row("ten proxied calls booked together, each paying its admission", ir, cmds, 10)
	t.Logf("Redis instructions (thousands; callgrind) and commands (commandstats, script calls included):\n"+
		"| operation | per call | per job | commands per job |\n| --- | ---: | ---: | ---: |\n%s", strings.Join(rows, "\n"))
}

// fairUpstream is fast's upstream with the dispatch benchmark's -fair
// partition limit: as high as the upstream's, so that it holds nothing back
// but every job goes through its partition's bucket.
func fairUpstream(name string) shaper.Upstream {
	u := fast(name)
	u.PartitionLimits = u.Limits
	return u
}

// addSized enqueues n jobs whose messages carry payload, job i of tenant
// and partition as mk(i) says.
func (r *rig) addSized(n int, payload []byte, mk func(i int) job) {
	r.t.Helper()
	for i := range n {
		id := fmt.Sprintf("%s-%d", r.u.Name, i)
		j := mk(i)
		j.id = id
		e := r.entry(j)
		msg := jobstore.Message{Type: "http", ID: id, Queue: r.space.Queue, Payload: payload, Retry: 8}
		e.Msg = msg.Marshal()
		if ok, err := r.space.Enqueue(context.Background(), r.rdb, e); err != nil || !ok {
			r.t.Fatalf("enqueue %s: created %v, err %v", id, ok, err)
		}
		r.ids = append(r.ids, id)
		r.lane[id], r.part[id] = e.Lane, j.partition
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
		items[i] = jobstore.Finished{ID: id, Lane: r.lane[id], Partition: r.part[id], Msg: &msg, Outcome: jobstore.Succeeded, Retention: 24 * time.Hour}
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
