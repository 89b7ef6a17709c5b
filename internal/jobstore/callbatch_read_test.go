package jobstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
)

// commandCounts is INFO commandstats: calls by command name.
func commandCounts(t *testing.T) map[string]int64 {
	t.Helper()
	return srv.CommandCalls(t)
}

// TestCallBatchReadsBucketOnce: a batch of calls of one upstream, on one
// clock, with a partition's limit that binds within it, reads the
// bucket (its dynamic limits, block, TATs) and the partition's TAT once
// and writes each changed TAT once, and decides every call as the same
// calls booked one by one do: the same slots and answers, and the same
// state left for the call after.
func TestCallBatchReadsBucketOnce(t *testing.T) { testCallBatch(t, 0) }

// TestCallBatchOnClocksInTurn: a batch whose calls each read another
// clock (overrides 300 µs apart) opens the bucket again for each, after
// writing what the calls before booked: the same answers as one by one.
func TestCallBatchOnClocksInTurn(t *testing.T) { testCallBatch(t, 300) }

func testCallBatch(t *testing.T, step int64) {
	const n = 8
	u := shaper.Upstream{Limits: []leaky.Limit{leaky.PerSecond(2000)}}
	plim := []leaky.Limit{{Rate: 1000, Per: time.Second, Burst: 4}}
	call := func(m *callSim, i int) Call {
		return Call{Upstream: m.u, Bucket: m.b, FairKey: fmt.Sprintf("k%d", i%2), ID: fmt.Sprintf("c%d", i),
			Partition: "p", PartitionLimits: plim,
			Lookahead: 50 * time.Millisecond, Remaining: time.Second,
			Now: func() time.Time { return time.UnixMicro(m.now + int64(i)*step) }}
	}
	answer := func(tn Turn) string {
		if tn.Slot != nil {
			return fmt.Sprintf("booked+%v", tn.Slot.Delay)
		}
		return fmt.Sprintf("wait %v reason %d refused %v", tn.Wait, tn.Reason, tn.Refused)
	}
	rdb := srv.Client(t)
	if err := callTurnScript.Load(context.Background(), rdb).Err(); err != nil {
		t.Fatal(err)
	}

	// One by one.
	one := newCallSim(t, "batch-one", u)
	var want []string
	for i := range n {
		tn, err := one.s.BookCall(context.Background(), rdb, call(one, i))
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, answer(tn))
	}

	// Together.
	m := newCallSim(t, "batch-once", u)
	plan := m.b.Plan(0)
	var reqs []callReq
	for i := range n {
		reqs = append(reqs, callReq{call(m, i), plan})
	}
	before := commandCounts(t)
	out, err := m.s.runCalls(context.Background(), rdb, reqs)
	if err != nil {
		t.Fatal(err)
	}
	after := commandCounts(t)
	var got []string
	booked := 0
	for i, r := range out {
		if r.err != nil {
			t.Fatalf("call %d: %v", i, r.err)
		}
		if r.turn.Slot != nil {
			booked++
		}
		got = append(got, answer(r.turn))
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%d calls together:\n%v\nwant, as one by one:\n%v", n, got, want)
	}
	if booked < 2 || booked == n {
		t.Errorf("%d of %d calls booked: want some booked and some held back by the partition (%v)", booked, n, got)
	}
	used := map[string]int64{}
	for _, cmd := range []string{"hgetall", "hget", "mget", "get", "set", "evalsha"} {
		used[cmd] = after[cmd] - before[cmd]
	}
	t.Logf("%d calls (%d booked) in one batch: %v", n, booked, used)
	// The dyn hash, the block, the bucket's TATs and the partition's once
	// per batch; the bucket's TAT and the partition's written once.
	for cmd, max := range map[string]int64{"hgetall": 1, "hget": 1, "mget": 1, "get": 1, "set": 2, "evalsha": 1} {
		if step != 0 {
			break
		}
		if used[cmd] > max {
			t.Errorf("a batch of %d calls ran %s %d times, want at most %d", n, cmd, used[cmd], max)
		}
	}

	// Each left the same state: the next call, alone, is answered alike.
	one.now += 1000 + n*step
	m.now += 1000 + n*step
	a, err := one.s.BookCall(context.Background(), rdb, call(one, n))
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.s.BookCall(context.Background(), rdb, call(m, n))
	if err != nil {
		t.Fatal(err)
	}
	if answer(a) != answer(b) {
		t.Errorf("the call after the batch: %s, after the same calls one by one: %s", answer(b), answer(a))
	}
}

// TestCallBatchAloneAsksOnce: calls alone with room in one batch, of two
// fairness keys, ask Redis whether anyone waits (EXISTS f cq ln:FK) once
// for the batch and once more for the second key's line, not once per
// call; and after a call of the batch takes the full turn (which marks
// its key waiting), the next call asks again. (Each batch opens its
// bucket once, which asks too: EXISTS dyn block, leaky's booking library.)
func TestCallBatchAloneAsksOnce(t *testing.T) {
	m := newCallSim(t, "batch-alone", shaper.Upstream{Limits: []leaky.Limit{leaky.PerSecond(100000)}})
	rdb := srv.Client(t)
	if err := callTurnScript.Load(context.Background(), rdb).Err(); err != nil {
		t.Fatal(err)
	}
	// The same bucket with a cap of one call in flight.
	capped, err := leaky.New(rdb, leaky.Config{}).Bucket(QueueName(m.u.Name), leaky.BucketConfig{Limits: m.u.Limits, Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	batch := func(b *leaky.Bucket, calls ...[2]string) []callRes {
		plan := b.Plan(time.Second)
		var reqs []callReq
		for i, c := range calls {
			reqs = append(reqs, callReq{Call{Upstream: m.u, Bucket: b, FairKey: c[0], Lease: c[1], ID: fmt.Sprintf("%s%d", c[0], i),
				Lookahead: time.Second, Remaining: time.Second,
				Now: func() time.Time { return time.UnixMicro(m.now) }}, plan})
		}
		out, err := m.s.runCalls(context.Background(), rdb, reqs)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range out {
			if r.err != nil {
				t.Fatalf("call %d: %v", i, r.err)
			}
		}
		return out
	}
	before := commandCounts(t)["exists"]
	for i, r := range batch(m.b, [2]string{"a"}, [2]string{"b"}, [2]string{"a"}, [2]string{"b"}, [2]string{"a"}, [2]string{"b"}) {
		if r.turn.Slot == nil {
			t.Fatalf("call %d: %+v, want a slot", i, r.turn)
		}
	}
	if n := commandCounts(t)["exists"] - before; n != 1+2 {
		t.Errorf("6 calls alone with room, of 2 keys, asked EXISTS %d times, want 1+2 (the bucket's, then the calls')", n)
	}

	// a books and holds the one lease; b, capped, takes the full turn and
	// waits marked; a again (its lease held) asks and finds b's mark.
	m.now += 10000
	before = commandCounts(t)["exists"]
	out := batch(capped, [2]string{"a", "l1"}, [2]string{"b", "l2"}, [2]string{"a", "l1"})
	if out[0].turn.Slot == nil || out[1].turn.Slot != nil || out[1].turn.Reason != leaky.ReasonConcurrency {
		t.Fatalf("a then b at a cap of 1: %+v, %+v; want a booked, b to wait for concurrency", out[0].turn, out[1].turn)
	}
	// The bucket's; a's, b's (its own line), and a's again after b's turn.
	if n := commandCounts(t)["exists"] - before; n != 1+3 {
		t.Errorf("a, b capped, a: asked EXISTS %d times, want 1+3 (the bucket's, then a's after b's turn again)", n)
	}
	if k, _ := rdb.Exists(context.Background(), m.s.callQueueKey()).Result(); k != 1 {
		t.Errorf("b's mark: cq exists %d, want 1", k)
	}
}

// TestCallBatchErrorKeepsWhatWasBooked: when a call of a batch raises (a
// Redis error, here a key of the wrong type in its turn), the script ends
// with an error for every call, and what the calls before it booked is
// written whole: their lease with its TTL, the bucket's TAT.
func TestCallBatchErrorKeepsWhatWasBooked(t *testing.T) {
	m := newCallSim(t, "batch-error", shaper.Upstream{Limits: []leaky.Limit{leaky.PerSecond(100000)}})
	rdb := srv.Client(t)
	ctx := context.Background()
	capped, err := leaky.New(rdb, leaky.Config{}).Bucket(QueueName(m.u.Name), leaky.BucketConfig{Limits: m.u.Limits, Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	rdb.Set(ctx, m.s.our+"ld", "not a sorted set", 0)
	plan := capped.Plan(time.Second)
	var reqs []callReq
	for i, c := range [][2]string{{"a", "l1"}, {"b", "l2"}} {
		reqs = append(reqs, callReq{Call{Upstream: m.u, Bucket: capped, FairKey: c[0], Lease: c[1], ID: fmt.Sprintf("%s%d", c[0], i),
			Lookahead: time.Second, Remaining: time.Second,
			Now: func() time.Time { return time.UnixMicro(m.now) }}, plan})
	}
	if _, err := m.s.runCalls(ctx, rdb, reqs); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("got %v, want the second call's WRONGTYPE", err)
	}
	keys, _ := rdb.Keys(ctx, "*batch-error*").Result()
	var leases, tats int
	for _, k := range keys {
		pttl, _ := rdb.PTTL(ctx, k).Result()
		if pttl < 0 && k != m.s.our+"ld" {
			t.Errorf("key %s has no TTL after the failed batch", k)
		}
		switch typ, _ := rdb.Type(ctx, k).Result(); {
		case strings.HasSuffix(k, "leases"):
			leases++
		case typ == "string" && k != m.s.our+"ld":
			tats++
		}
	}
	if leases != 1 || tats == 0 {
		t.Errorf("after the failed batch: keys %v; want the first call's lease and the bucket's TAT written", keys)
	}
}
