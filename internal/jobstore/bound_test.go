package jobstore

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

// seedTaken writes n taken tasks as a dequeue leaves them (hash with msg,
// state active and lane, in the active list and the lease set), counted
// active, in one pipeline: the shortest way to many finishes.
func (e *env) seedTaken(ids []string, lane string) []*Message {
	e.t.Helper()
	ctx := context.Background()
	body := []byte(strings.Repeat("b", 100))
	msgs := make([]*Message, len(ids))
	lease := time.Now().Add(time.Minute)
	p := e.rdb.Pipeline()
	for i, id := range ids {
		msgs[i] = &Message{Type: "call", Payload: body, ID: id, Queue: e.k.Queue(), Retry: 3, Timeout: 60}
		p.HSet(ctx, e.k.Task(id), "msg", msgs[i].Marshal(), "state", "active", "sl", lane)
		p.LPush(ctx, e.k.Active(), id)
		p.ZAdd(ctx, e.k.Lease(), redisZ(lease, id))
	}
	p.HIncrBy(ctx, e.counts, "active:"+lane, int64(len(ids)))
	if _, err := p.Exec(ctx); err != nil {
		e.t.Fatal(err)
	}
	return msgs
}

// finishMany seeds and finishes jobs [from, to) as outcome, batch at a
// time, as a dispatcher's finish batcher would, under bounds b.
func (e *env) finishMany(from, to, batch int, outcome Outcome, b Bounds) {
	e.t.Helper()
	ctx := context.Background()
	result := []byte(`{"status":200,"body":"` + strings.Repeat("r", 30) + `"}`)
	for lo := from; lo < to; lo += batch {
		hi := min(lo+batch, to)
		ids := make([]string, 0, hi-lo)
		for i := lo; i < hi; i++ {
			ids = append(ids, fmt.Sprintf("q.default.j%07d", i))
		}
		msgs := e.seedTaken(ids, "default")
		items := make([]Finished, len(ids))
		for i, id := range ids {
			items[i] = Finished{ID: id, Lane: "default", Msg: msgs[i], Outcome: outcome, Result: result,
				Retention: 24 * time.Hour, ErrMsg: "gave up"}
		}
		errs, err := Finish(ctx, e.rdb, e.k, e.counts, e.pbacklog, items, KeepAtMost(b))
		if err != nil {
			e.t.Fatal(err)
		}
		for i, err := range errs {
			if err != nil {
				e.t.Fatalf("finish %s: %v", ids[i], err)
			}
		}
	}
}

// TestFinishKeepsAtMost is issue 12's plateau: with 2000 kept, finishing
// 16,000 jobs leaves at most 2000 (plus one batch) and Redis's memory
// after 16,000 at most 1 MB above what it was after 8,000.
func TestFinishKeepsAtMost(t *testing.T) {
	if testing.Short() {
		t.Skip("16,000 finished jobs: runs in make test")
	}
	for _, tc := range []struct {
		name    string
		outcome Outcome
		set     Zset
		state   string
	}{
		{"succeeded", Succeeded, Completed, "succeeded"},
		{"dead", Dead, Archived, "dead"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			e := newEnv(t, "q")
			const most, batch = 2000, 200
			b := Bounds{Completed: most, Archived: most,
				Gone: Tombstones{Key: "shaper:" + e.k.HashTag() + ":gone", Max: most, For: time.Hour}}
			set := e.k.Completed()
			if tc.set == Archived {
				set = e.k.Archived()
			}
			e.finishMany(0, 8000, batch, tc.outcome, b)
			half := redistest.UsedMemory(e.t, e.rdb)
			e.finishMany(8000, 16000, batch, tc.outcome, b)
			full := redistest.UsedMemory(e.t, e.rdb)
			t.Logf("used_memory after 8000: %d B, after 16000: %d B (%+d B)", half, full, full-half)
			if full-half > 1<<20 {
				t.Errorf("used_memory grew by %d B from 8000 jobs to 16000, want at most 1 MB", full-half)
			}
			n := e.rdb.ZCard(ctx, set).Val()
			if n < most || n > most+batch {
				t.Errorf("%s set holds %d, want %d to %d", tc.set, n, most, most+batch)
			}
			// The oldest went: the newest job is kept, the first is not.
			if e.rdb.Exists(ctx, e.k.Task("q.default.j0015999")).Val() != 1 {
				t.Error("the newest job's hash is gone")
			}
			if e.rdb.Exists(ctx, e.k.Task("q.default.j0000000")).Val() != 0 {
				t.Error("the oldest job's hash is still there")
			}
			// Every kept task has its hash and nothing else does.
			tasks := 0
			iter := e.rdb.Scan(ctx, 0, e.k.TaskPrefix()+"*", 1000).Iterator()
			for iter.Next(ctx) {
				tasks++
			}
			must(t, iter.Err())
			if int64(tasks) != n {
				t.Errorf("task hashes: got %d, want %d (the kept tasks)", tasks, n)
			}
			// The counters count what is kept.
			if got, want := e.countsNow(), map[string]int64{tc.state + ":default": n}; !reflect.DeepEqual(got, want) {
				t.Errorf("counts: got %v, want %v", got, want)
			}
			// Tombstones: the trimmed are known, within their own bound.
			gone, err := b.Gone.WasDeleted(ctx, e.rdb, "q.default.j0013000")
			if err != nil || !gone {
				t.Errorf("a recently trimmed job: got gone %v, %v, want true", gone, err)
			}
			gone, err = b.Gone.WasDeleted(ctx, e.rdb, "q.default.never")
			if err != nil || gone {
				t.Errorf("a job that never was: got gone %v, %v, want false", gone, err)
			}
			if g := e.rdb.ZCard(ctx, b.Gone.Key).Val(); g > most {
				t.Errorf("tombstones: got %d, want at most %d", g, most)
			}
			if ttl := e.rdb.TTL(ctx, b.Gone.Key).Val(); ttl <= 0 || ttl > time.Hour {
				t.Errorf("tombstones' TTL: got %v, want up to 1h", ttl)
			}
		})
	}
}

// TestFinishTrimsAnExcessOverCalls: a bound lowered below what is kept is
// reached a bounded number of deletions per Finish, not in one call.
func TestFinishTrimsAnExcessOverCalls(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "q")
	e.finishMany(0, 1000, 100, Succeeded, Bounds{})
	if n := e.rdb.ZCard(ctx, e.k.Completed()).Val(); n != 1000 {
		t.Fatalf("unbounded: got %d kept, want 1000", n)
	}
	b := Bounds{Completed: 100}
	// Each call finishes 10 and deletes at most 10 + TrimMargin.
	want := int64(1000)
	for call := range 12 {
		e.finishMany(1000+10*call, 1010+10*call, 10, Succeeded, b)
		want = max(want+10-10-TrimMargin, 100)
		if n := e.rdb.ZCard(ctx, e.k.Completed()).Val(); n != want {
			t.Fatalf("after call %d: got %d kept, want %d", call, n, want)
		}
	}
	if n := e.rdb.ZCard(ctx, e.k.Archived()).Val(); n != 0 {
		t.Fatalf("archived: got %d, want 0", n)
	}
	// With no more finishes, the retention sweep brings a lowered bound
	// down, within its limit per call.
	b.Completed = 40
	for _, want := range []int{25, 25, 10, 0} {
		n, err := DeleteExpired(ctx, e.rdb, e.k, e.counts, Completed, time.Now(), 25, b)
		if err != nil || n != want {
			t.Fatalf("sweep: got %d, %v, want %d", n, err, want)
		}
	}
	if n := e.rdb.ZCard(ctx, e.k.Completed()).Val(); n != 40 {
		t.Fatalf("after the sweeps: got %d kept, want 40", n)
	}
	if got, want := e.countsNow(), map[string]int64{"succeeded:default": 40}; !reflect.DeepEqual(got, want) {
		t.Fatalf("counts: got %v, want %v", got, want)
	}
}

// TestDeleteExpiredLeavesTombstones: a job aged out is known as gone, and
// its side keys go with it.
func TestDeleteExpiredLeavesTombstones(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "q")
	m := e.taken("d1", "default", "")
	e.finish(Finished{ID: "d1", Lane: "default", Msg: m, Outcome: Dead})
	side := "shaper:cancelled:" + e.k.HashTag() + ":"
	must(t, e.rdb.Set(ctx, side+"d1", "1", time.Hour).Err())
	b := Bounds{Gone: Tombstones{Key: "shaper:" + e.k.HashTag() + ":gone", Max: 10, For: time.Minute}, SidePrefixes: []string{side}}
	n, err := DeleteExpired(ctx, e.rdb, e.k, e.counts, Archived, time.Now().Add(time.Second), 10, b)
	if err != nil || n != 1 {
		t.Fatalf("got %d, %v, want 1", n, err)
	}
	if gone, err := b.Gone.WasDeleted(ctx, e.rdb, "d1"); err != nil || !gone {
		t.Fatalf("got gone %v, %v, want true", gone, err)
	}
	if e.rdb.Exists(ctx, side+"d1", e.k.Task("d1")).Val() != 0 {
		t.Fatal("the task's hash or side key is left")
	}
	if got := e.countsNow(); len(got) != 0 {
		t.Fatalf("counts: got %v, want none", got)
	}
}
