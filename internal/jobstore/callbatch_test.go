package jobstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
)

// TestCallsBookedTogetherAsInTurn: eight calls of one key booked in one
// script call, at an upstream of 10/s, each willing to wait 250 ms, are
// decided as if each came alone after the one before (as in
// TestCallsKnowTheLineAhead): one booked, two to wait their turn in line,
// five refused.
func TestCallsBookedTogetherAsInTurn(t *testing.T) {
	m := newCallSim(t, "batch-line", shaper.Upstream{Limits: []leaky.Limit{leaky.PerSecond(10)}})
	rdb := srv.Client(t)
	plan := m.b.Plan(0)
	var reqs []callReq
	for i := range 8 {
		reqs = append(reqs, callReq{Call{Upstream: m.u, Bucket: m.b, FairKey: "a", ID: fmt.Sprintf("c%d", i),
			Lookahead: 50 * time.Millisecond, Remaining: 250 * time.Millisecond,
			Now: func() time.Time { return time.UnixMicro(m.now) }}, plan})
	}
	if err := callTurnScript.Load(context.Background(), rdb).Err(); err != nil {
		t.Fatal(err)
	}
	evals := evalCalls(t)
	out, err := m.s.runCalls(context.Background(), rdb, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if n := evalCalls(t) - evals; n != 1 {
		t.Errorf("eight calls booked together took %d script calls, want 1", n)
	}
	var got []string
	for i, r := range out {
		switch {
		case r.err != nil:
			t.Fatalf("call %d: %v", i, r.err)
		case r.turn.Slot != nil:
			got = append(got, "booked")
		case r.turn.Refused:
			got = append(got, "refused")
		default:
			got = append(got, "waits")
		}
	}
	want := []string{"booked", "waits", "waits", "refused", "refused", "refused", "refused", "refused"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("eight calls together: %v, want %v", got, want)
	}
}

// TestCallBookerSharesScriptCalls: 32 calls booking at once through one
// CallBooker, at an upstream with room, each get a slot of their own, in
// fewer script calls than calls, and all are alone with room (slots a
// batch books one after the other within a millisecond): none leaves its
// key marked.
func TestCallBookerSharesScriptCalls(t *testing.T) {
	m := newCallSim(t, "batch-share", shaper.Upstream{Limits: []leaky.Limit{leaky.PerSecond(100000)}})
	bk := NewCallBooker(srv.Client(t), m.s)
	const n = 32
	evals := evalCalls(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	slots := map[int64]bool{}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tn, err := bk.Book(context.Background(), Call{Upstream: m.u, Bucket: m.b, FairKey: "a", ID: fmt.Sprintf("c%d", i),
				Lookahead: time.Second, Remaining: time.Second})
			if err != nil || tn.Slot == nil {
				t.Errorf("call %d: %+v %v, want a slot", i, tn, err)
				return
			}
			mu.Lock()
			slots[tn.Slot.Now.Add(tn.Slot.Delay).UnixMicro()] = true
			mu.Unlock()
		}()
	}
	wg.Wait()
	used := evalCalls(t) - evals
	t.Logf("%d calls, %d script calls, %d distinct slots", n, used, len(slots))
	if used >= n {
		t.Errorf("%d calls at once took %d script calls, want them shared", n, used)
	}
	if k, _ := srv.Client(t).Exists(context.Background(), m.s.callQueueKey(), m.s.callMarkKey()).Result(); k != 0 {
		t.Errorf("calls alone with room left marks (%d keys)", k)
	}
}

// TestCallQueuedForBatchKeepsItsWait: a call that waits in the
// CallBooker's queue while a batch is in flight (Redis paused 300 ms) is
// judged on the wait it has left when its batch is sent, not on the wait
// it had when it queued: its slot, 500 ms ahead when its batch is sent,
// lies beyond the 350 ms left of its wait then (650 ms from when it
// queued), so it is refused rather than booked past its wait.
func TestCallQueuedForBatchKeepsItsWait(t *testing.T) {
	m := newCallSim(t, "batch-wait", shaper.Upstream{Limits: []leaky.Limit{{Rate: 1, Per: 400 * time.Millisecond}}})
	rdb := srv.Client(t)
	ctx := context.Background()
	bk := NewCallBooker(rdb, m.s)
	if err := callTurnScript.Load(ctx, rdb).Err(); err != nil {
		t.Fatal(err)
	}
	call := func(id string, deadline time.Time) Call {
		return Call{Upstream: m.u, Bucket: m.b, FairKey: id, ID: id, Lookahead: 2 * time.Second, Deadline: deadline}
	}
	if tn, err := bk.Book(ctx, call("x0", time.Now().Add(10*time.Second))); err != nil || tn.Slot == nil {
		t.Fatalf("first call: %+v %v, want a slot now", tn, err)
	}
	ctl := srv.Client(t)
	start := time.Now()
	if err := ctl.Do(ctx, "CLIENT", "PAUSE", 300, "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if tn, err := bk.Book(ctx, call("y1", time.Now().Add(10*time.Second))); err != nil || tn.Slot == nil {
			t.Errorf("y1: %+v %v, want a slot", tn, err)
		}
	}()
	// y2 queues once y1 is in flight, held by the pause.
	for held := 0; held < 1; {
		info, err := ctl.Info(ctx, "clients").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "blocked_clients:"); ok {
				held, _ = strconv.Atoi(v)
			}
		}
		if time.Since(start) > 200*time.Millisecond {
			t.Fatalf("%d calls held by the pause after %v, want 1", held, time.Since(start))
		}
	}
	deadline := start.Add(650 * time.Millisecond)
	tn, err := bk.Book(ctx, call("y2", deadline))
	<-done
	if err != nil {
		t.Fatal(err)
	}
	if tn.Slot != nil {
		t.Fatalf("y2 booked a slot %v after it queued, its wait ending %v after: want it refused, its slot beyond its wait",
			tn.Slot.SendAt().Sub(start).Round(time.Millisecond), deadline.Sub(start))
	}
	if !tn.Refused {
		t.Errorf("y2: %+v, want refused", tn)
	}
}

// TestCallBookerKeepsItsPlan: a CallBooker builds a bucket's booking
// keys and arguments once while the bucket's limits stay the same, and
// again once they change (or for another lease lifetime).
func TestCallBookerKeepsItsPlan(t *testing.T) {
	m := newCallSim(t, "batch-plan", shaper.Upstream{Limits: []leaky.Limit{leaky.PerSecond(100)}})
	bk := NewCallBooker(srv.Client(t), m.s)
	p1, p2 := bk.planFor(m.b, time.Second), bk.planFor(m.b, time.Second)
	if &p1.Args[0] != &p2.Args[0] {
		t.Errorf("the same limits: the plan was built again")
	}
	if p3 := bk.planFor(m.b, 2*time.Second); &p3.Args[0] == &p1.Args[0] || p3.Args[1] == p1.Args[1] {
		t.Errorf("another lease lifetime: got the plan kept for the first, want one of its own")
	}
	if err := m.b.SetLimits([]leaky.Limit{leaky.PerSecond(50)}, 1, nil); err != nil {
		t.Fatal(err)
	}
	p4 := bk.planFor(m.b, time.Second)
	if p4.Version() == p1.Version() || p4.Version() != m.b.BookingVersion() || slices.Equal(p4.Args, p1.Args) {
		t.Errorf("after the limits changed: got a plan of version %d (args %v), want version %d under the new limits",
			p4.Version(), p4.Args, m.b.BookingVersion())
	}
}
