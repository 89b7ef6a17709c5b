package jobstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/tokenbucket"
)

// TestCallPaysAdmissionInTurn: calls that pay admission in their booking
// (Call.Admit) are decided as tokenbucket's own Local decides the same
// requests in the same order, two keys' buckets in one batch; a call
// admission refuses books nothing and leaves nothing (no mark, no line,
// no slot), one it admits books as a call without admission does; each
// bucket is written once per batch, expiring as the limiter's own keys do;
// and calls that pay and calls that do not (a call coming back) share one
// script call.
func TestCallPaysAdmissionInTurn(t *testing.T) {
	m := newCallSim(t, "admit", shaper.Upstream{Limits: []leaky.Limit{leaky.PerSecond(10)}})
	rdb := srv.Client(t)
	ctx := context.Background()
	clock := time.UnixMicro(m.now)
	now := func() time.Time { return clock }
	l := tokenbucket.Limit{Capacity: 2, Refill: 1, Per: time.Hour}
	lim, err := tokenbucket.New(rdb, l, tokenbucket.Config{Prefix: "admit-" + m.u.Name, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	model := tokenbucket.NewLocal(l, now)
	if err := callTurnScript.Load(ctx, rdb).Err(); err != nil {
		t.Fatal(err)
	}
	plan := m.b.Plan(0)
	call := func(key, id string, pay bool) callReq {
		c := Call{Upstream: m.u, Bucket: m.b, FairKey: "fk-" + key, ID: id, Lookahead: time.Second, Remaining: 10 * time.Second,
			Now: func() time.Time { return time.UnixMicro(m.now) }}
		if pay {
			a, err := lim.Admission(key, 1)
			if err != nil {
				t.Fatal(err)
			}
			c.Admit = &a
		}
		return callReq{c, plan}
	}
	batch := func(reqs ...callReq) []Turn {
		t.Helper()
		evals := evalCalls(t)
		out, err := m.s.runCalls(ctx, rdb, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if n := evalCalls(t) - evals; n != 1 {
			t.Errorf("a batch took %d script calls, want 1", n)
		}
		turns := make([]Turn, len(out))
		for i, r := range out {
			if r.err != nil {
				t.Fatalf("call %d: %v", i, r.err)
			}
			turns[i] = r.turn
			if reqs[i].c.Admit == nil {
				continue
			}
			want, err := model.Allow(ctx, strings.TrimPrefix(reqs[i].c.FairKey, "fk-"), 1)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case want.Allowed && r.turn.Denied != nil:
				t.Errorf("call %s: denied %+v, want admitted as the model", reqs[i].c.ID, *r.turn.Denied)
			case !want.Allowed && (r.turn.Denied == nil || *r.turn.Denied != want):
				t.Errorf("call %s: got %+v, want denied %+v as the model", reqs[i].c.ID, r.turn, want)
			}
		}
		return turns
	}

	// a's three calls and b's one: a's third is refused, the rest book
	// (a slot now, then slots 100 ms apart, in turn).
	turns := batch(call("a", "a1", true), call("a", "a2", true), call("b", "b1", true), call("a", "a3", true))
	for i, want := range []bool{true, true, true, false} {
		if got := turns[i].Denied == nil; got != want {
			t.Fatalf("call %d: admitted %v, want %v", i, got, want)
		}
	}
	if turns[0].Slot == nil || turns[3].Slot != nil || turns[3].Wait != 0 || turns[3].Refused {
		t.Fatalf("got %+v and %+v, want a1 booked and a3 refused by admission alone", turns[0], turns[3])
	}
	// a3 stands in no line.
	if n, _ := rdb.ZCard(ctx, m.s.our+"ln:fk-a").Result(); n != 0 {
		t.Errorf("a's line holds %d calls, want none (a2 booked, a3 was refused admission)", n)
	}
	if ok, _ := rdb.ZScore(ctx, m.s.our+"ld", "fk-a|a3").Result(); ok != 0 {
		t.Errorf("a3 holds a place in line")
	}
	for _, k := range []string{"a", "b"} {
		a, _ := lim.Admission(k, 1)
		ttl, err := rdb.PTTL(ctx, a.Key).Result()
		if err != nil || ttl <= 0 || ttl > time.Duration(l.Capacity+1)*l.Per/time.Duration(l.Refill) {
			t.Errorf("admission bucket %s: PTTL %v %v, want it to expire within its span and one interval", a.Key, ttl, err)
		}
	}

	// Later: a1 sent; a2 and b1 come back without paying again, beside a
	// new call of b's (admitted) and a's (refused).
	m.now += 100_000
	turns = batch(call("a", "a2", false), call("b", "b1", false), call("b", "b2", true), call("a", "a4", true))
	if turns[0].Denied != nil || turns[1].Denied != nil || turns[3].Denied == nil || turns[2].Denied != nil {
		t.Fatalf("second batch: got %+v, want a4 alone refused admission", turns)
	}

	// A batch that raises writes no admission: none of its calls was
	// answered, so none paid.
	a, _ := lim.Admission("c", 1)
	rdb.Set(ctx, m.s.our+"ld", "not a sorted set", 0)
	m.now += 1_000_000
	// Another key waits, so c1 takes the full turn, which reads ld.
	rdb.ZAdd(ctx, m.s.callQueueKey(), redis.Z{Member: "fk-x", Score: 0})
	rdb.ZAdd(ctx, m.s.callMarkKey(), redis.Z{Member: "fk-x", Score: float64(m.now + 10_000_000)})
	if _, err := m.s.runCalls(ctx, rdb, []callReq{call("c", "c1", true), call("a", "a5", false)}); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("got %v, want the turn's WRONGTYPE", err)
	}
	if n, _ := rdb.Exists(ctx, a.Key).Result(); n != 0 {
		t.Errorf("c's admission bucket was written by a batch that raised")
	}
	rdb.Del(ctx, m.s.our+"ld", m.s.callQueueKey(), m.s.callMarkKey())
	if tn, err := m.s.BookCall(ctx, rdb, call("c", "c1", true).c); err != nil || tn.Denied != nil || !tn.Admitted {
		t.Errorf("c after the failed batch: %+v %v, want admitted", tn, err)
	}
}

// TestCallDeniedAdmissionBooksNothing: a call refused admission books no
// slot on the bucket: the slot it would have had is the next call's.
func TestCallDeniedAdmissionBooksNothing(t *testing.T) {
	m := newCallSim(t, "admit-none", shaper.Upstream{Limits: []leaky.Limit{leaky.PerSecond(1)}})
	rdb := srv.Client(t)
	ctx := context.Background()
	lim, err := tokenbucket.New(rdb, tokenbucket.Limit{Capacity: 1, Refill: 1, Per: time.Hour}, tokenbucket.Config{Prefix: "admit-" + m.u.Name})
	if err != nil {
		t.Fatal(err)
	}
	a, err := lim.Admission("k", 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lim.Allow(ctx, "k", 1); err != nil { // spends k's only token
		t.Fatal(err)
	}
	for i, pay := range []bool{true, false} {
		c := Call{Upstream: m.u, Bucket: m.b, FairKey: "fk", ID: fmt.Sprint("c", i), Lookahead: time.Second, Remaining: time.Second,
			Now: func() time.Time { return time.UnixMicro(m.now) }}
		if pay {
			c.Admit = &a
		}
		tn, err := m.s.BookCall(ctx, rdb, c)
		if err != nil {
			t.Fatal(err)
		}
		if pay && (tn.Denied == nil || tn.Slot != nil || tn.Admitted) {
			t.Fatalf("the call over admission: %+v, want denied, nothing booked", tn)
		}
		if !pay && (tn.Slot == nil || tn.Slot.Delay != 0) {
			t.Fatalf("the call after it: %+v, want the slot now, which the refused call did not take", tn)
		}
	}
}
