package jobstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
)

// TestTurnIsItsOwnAnswer: a call that is not its key's turn is told so in
// one script call (ReasonTurn, not the stale limits' reason, which would
// send it to read the limits again), with a wait to come back after; one
// whose turn lies beyond its wait is refused at once.
func TestTurnIsItsOwnAnswer(t *testing.T) {
	m := newCallSim(t, "turn", shaper.Upstream{Limits: []leaky.Limit{leaky.PerSecond(50)}})
	m.enqueue("b", 200)
	rdb := srv.Client(t)
	ctx := context.Background()
	calls := 0
	bookAs := func(id string, remaining time.Duration) Turn {
		t.Helper()
		tn, err := m.s.BookCall(ctx, rdb, Call{Upstream: m.u, Bucket: m.b, FairKey: "a", ID: id,
			Lookahead: 250 * time.Millisecond, Remaining: remaining,
			Now: func() time.Time { return time.UnixMicro(m.now) }})
		if err != nil {
			t.Fatal(err)
		}
		return tn
	}
	book := func(remaining time.Duration) Turn {
		t.Helper()
		calls++
		return bookAs(fmt.Sprintf("call-%d", calls), remaining)
	}
	// a's calls book until a is ahead of b, whose jobs wait.
	var tn Turn
	for i := 0; i < 10; i++ {
		if tn = book(30 * time.Second); tn.Slot == nil {
			break
		}
	}
	if tn.Slot != nil {
		t.Fatalf("10 calls of a booked while b's 200 jobs wait")
	}
	before := evalCalls(t)
	tn = bookAs("first", 30*time.Second)
	if calls := evalCalls(t) - before; calls != 1 {
		t.Errorf("a turn's answer took %d script calls, want 1", calls)
	}
	if tn.Slot != nil || tn.Reason != ReasonTurn || tn.Refused || tn.Wait < 2*time.Millisecond || tn.Wait > 50*time.Millisecond {
		t.Errorf("not a's turn, 30 s to wait: got %+v, want ReasonTurn, not refused, back in 2-50 ms", tn)
	}
	// The bucket's next slot is 40 ms away (the calls booked took the
	// ones before), a's turn one of b's sends (20 ms) later still: the
	// first of a's waiting calls, back with 45 ms to wait, is refused.
	if tn = bookAs("first", 45*time.Millisecond); tn.Slot != nil || tn.Reason != ReasonTurn || !tn.Refused {
		t.Errorf("not a's turn, 45 ms to wait: got %+v, want ReasonTurn and refused", tn)
	}
	if tn = book(time.Millisecond); tn.Slot != nil || !tn.Refused {
		t.Errorf("1 ms to wait: got %+v, want refused", tn)
	}
}

// TestCallsKnowTheLineAhead: calls of one key arrive together at an
// upstream of 10/s, each willing to wait 250 ms. The first books; those
// whose slot lies beyond their wait once the calls before them in the
// line have had theirs are refused at once, not once they find out.
func TestCallsKnowTheLineAhead(t *testing.T) {
	m := newCallSim(t, "line", shaper.Upstream{Limits: []leaky.Limit{leaky.PerSecond(10)}})
	rdb := srv.Client(t)
	var booked, waiting, refused int
	for i := range 8 {
		tn, err := m.s.BookCall(context.Background(), rdb, Call{Upstream: m.u, Bucket: m.b, FairKey: "a", ID: fmt.Sprintf("c%d", i),
			Lookahead: 50 * time.Millisecond, Remaining: 250 * time.Millisecond,
			Now: func() time.Time { return time.UnixMicro(m.now) }})
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case tn.Slot != nil:
			booked++
		case tn.Refused:
			refused++
		default:
			waiting++
		}
	}
	// Slots at 0, 100 and 200 ms: one booked, two to wait for theirs.
	if booked != 1 || waiting != 2 || refused != 5 {
		t.Errorf("8 calls at once: %d booked, %d waiting, %d refused; want 1, 2 and 5", booked, waiting, refused)
	}
}

// evalCalls is how many EVALSHA and EVAL calls Redis has run.
func evalCalls(t *testing.T) int64 {
	t.Helper()
	info, err := srv.Client(t).Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		for _, cmd := range []string{"cmdstat_evalsha:calls=", "cmdstat_eval:calls="} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd); ok {
				v, _, _ := strings.Cut(rest, ",")
				c, _ := strconv.ParseInt(v, 10, 64)
				n += c
			}
		}
	}
	return n
}
