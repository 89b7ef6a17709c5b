package jobstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
)

// turnCommands is how many times Redis has run each of the commands that
// only the way of a call in contention (call_turn.lua's marks, line and
// lapse scans) sends.
func turnCommands(t *testing.T) map[string]int64 {
	t.Helper()
	all := commandCounts(t)
	out := map[string]int64{}
	for _, cmd := range []string{"zrangebyscore", "zrange", "zadd", "pexpire", "zcard", "zcount"} {
		if n, ok := all[cmd]; ok {
			out[cmd] = n
		}
	}
	return out
}

// TestCallAloneWithRoomSkipsTheTurn: a call that finds the upstream's
// slot free now and nobody else waiting books it without the marks, the
// line or their scans, and leaves no mark; a key that waits with jobs, or
// with a call, turns that off, so the call is marked and takes its turn;
// once the others' marks lapse, its key's calls are alone again.
func TestCallAloneWithRoomSkipsTheTurn(t *testing.T) {
	m := newCallSim(t, "alone", shaper.Upstream{Limits: []leaky.Limit{leaky.PerSecond(100)}})
	rdb := srv.Client(t)
	ctx := context.Background()
	book := func(fk, id string) Turn {
		t.Helper()
		tn, err := m.s.BookCall(ctx, rdb, Call{Upstream: m.u, Bucket: m.b, FairKey: fk, ID: id,
			Lookahead: 250 * time.Millisecond, Remaining: time.Second,
			Now: func() time.Time { return time.UnixMicro(m.now) }})
		if err != nil {
			t.Fatal(err)
		}
		return tn
	}
	marked := func(fk string) bool {
		t.Helper()
		_, err := rdb.ZScore(ctx, m.s.callQueueKey(), fk).Result()
		return err == nil
	}
	alone := func(fk, id string) {
		t.Helper()
		before := turnCommands(t)
		tn := book(fk, id)
		after := turnCommands(t)
		if tn.Slot == nil || tn.Slot.Delay != 0 {
			t.Fatalf("%s alone with room: got %+v, want a slot now", id, tn)
		}
		for cmd, n := range after {
			if n != before[cmd] {
				t.Errorf("%s alone with room sent %s %d times, want the turn skipped", id, cmd, n-before[cmd])
			}
		}
		if marked(fk) {
			t.Errorf("%s alone with room left its key marked", id)
		}
	}
	step := func() { m.now += 20 * time.Millisecond.Microseconds() }

	for i := range 3 {
		alone("a", fmt.Sprintf("a%d", i))
		step()
	}

	// b waits with a job: a's call takes its turn, and is marked.
	m.enqueue("b", 1)
	if tn := book("a", "a-jobs"); tn.Slot == nil || !marked("a") {
		t.Errorf("a's call with b's job waiting: got %+v, marked %v; want booked and marked", tn, marked("a"))
	}
	if _, err := rdb.Del(ctx, m.s.fKey(), m.s.callQueueKey(), m.s.callMarkKey()).Result(); err != nil {
		t.Fatal(err)
	}
	step()
	alone("a", "a-after-jobs")

	// b's calls: the first books the slot free now (alone), the second's
	// lies ahead, so b is marked; then a's call, with room again, takes its
	// turn behind b's mark.
	step()
	alone("b", "b0")
	if tn := book("b", "b1"); tn.Slot == nil || tn.Slot.Delay == 0 || !marked("b") {
		t.Fatalf("b's second call: got %+v, marked %v; want a slot ahead and b marked", tn, marked("b"))
	}
	step()
	if tn := book("a", "a-calls"); tn.Slot == nil || !marked("a") {
		t.Errorf("a's call with b marked: got %+v, marked %v; want booked and marked", tn, marked("a"))
	}

	// The marks lapse: a's next call clears them (it books in its turn,
	// nobody else waiting, and drops its own mark), and the one after is
	// alone again.
	m.now += time.Second.Microseconds()
	if tn := book("a", "a-lapsed"); tn.Slot == nil || marked("a") || marked("b") {
		t.Errorf("a's call after the marks lapsed: got %+v, marked a %v b %v; want booked, no marks", tn, marked("a"), marked("b"))
	}
	step()
	alone("a", "a-alone-again")
}
