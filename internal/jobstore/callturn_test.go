package jobstore

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
)

// callSim runs takes and proxied calls of one upstream on a clock of its
// own (the scripts' override), stepping it by step: the take has workers
// enough and runs every step; each caller books through BookCall, waits
// for its slot, sends at once and calls again. It counts the slots each
// fairness key got within [from, to) of the simulated time.
type callSim struct {
	t      *testing.T
	u      shaper.Upstream
	s      Space
	b      *leaky.Bucket
	tk     *Taker
	now    int64
	start  int64
	jobsOf map[string]string // job id -> fairness key
	laneOf map[string]string // job id -> lane
	slots  map[string]int
	// lanes counts the slots of each fairness key's lane, "fk/lane".
	lanes map[string]int
	from  int64
	to    int64
	// partition is the one the jobs enqueued and the calls booked are
	// in ("" none).
	partition string
	// callsFirst: at each step the callers call before the take runs
	// (else after it), as calls that come back for their slot the
	// moment the take does would, on a proxy nearer Redis than the
	// workers.
	callsFirst bool
	booked     func(c *simCaller) (ok bool, delay, wait time.Duration, refused bool)
}

type simCaller struct {
	id    string // its calls' id, one after the other
	fk    string
	lane  string
	next  int64 // µs when it calls (or comes back)
	slot  int64 // µs of its booked slot, 0 none
	calls int
	// partition, when not nil, is the partition its calls are in, instead
	// of the simulation's.
	partition *string
	// think is how long after its slot it calls again (µs): the
	// upstream's answer, and what the caller does with it.
	think int64
	// refusals counts 429s: a call whose slot lay beyond its wait.
	refusals int
}

func newCallSim(t *testing.T, name string, u shaper.Upstream) *callSim {
	t.Helper()
	rdb := srv.Client(t)
	u.Name = fmt.Sprintf("%s-%d", name, time.Now().UnixNano()%1e9)
	u = u.WithDefaults()
	b, err := leaky.New(rdb, leaky.Config{}).Bucket(QueueName(u.Name), leaky.BucketConfig{Limits: u.Limits, Guard: u.Guard})
	if err != nil {
		t.Fatal(err)
	}
	s := For("", u.Name)
	tk, err := NewTaker(rdb, s, TakerConfig{Upstream: u, Bucket: b, Lookahead: 250 * time.Millisecond, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMicro()
	sim := &callSim{t: t, u: u, s: s, b: b, tk: tk, now: now, start: now, jobsOf: map[string]string{}, laneOf: map[string]string{}, slots: map[string]int{}, lanes: map[string]int{}}
	sim.booked = func(c *simCaller) (bool, time.Duration, time.Duration, bool) {
		part := sim.partition
		if c.partition != nil {
			part = *c.partition
		}
		tn, err := s.BookCall(context.Background(), rdb, Call{Upstream: u, Bucket: b, FairKey: c.fk, Lane: c.lane, ID: c.id,
			Partition: part, PartitionLimits: u.PartitionLimits,
			Lookahead: 250 * time.Millisecond, Remaining: 30 * time.Second,
			Now: func() time.Time { return time.UnixMicro(sim.now) }})
		if err != nil {
			t.Fatal(err)
		}
		if tn.Slot == nil {
			return false, 0, tn.Wait, tn.Refused
		}
		return true, tn.Slot.Delay, 0, false
	}
	return sim
}

func (m *callSim) enqueue(fk string, n int) { m.enqueueIn(fk, shaper.DefaultLane, n) }

func (m *callSim) enqueueIn(fk, lane string, n int) {
	m.t.Helper()
	rdb := srv.Client(m.t)
	for i := range n {
		id := fmt.Sprintf("%s-%s-%s%04d", fk, lane, m.partition, i)
		msg := Message{Type: "http", ID: id, Queue: m.s.Queue}
		e := Entry{ID: id, Lane: lane, FairKey: fk, Partition: m.partition, Msg: msg.Marshal()}
		if c, err := m.s.enqueue(context.Background(), rdb, e, "", strconv.FormatInt(m.now, 10)); err != nil || c != 1 {
			m.t.Fatalf("enqueue %s: %d %v", id, c, err)
		}
		m.jobsOf[id], m.laneOf[id] = fk, lane
	}
}

func (m *callSim) count(fk, lane string, slot int64) {
	if slot >= m.from && slot < m.to {
		m.slots[fk]++
		if lane == "" {
			lane = shaper.DefaultLane
		}
		m.lanes[fk+"/"+lane]++
	}
}

// run steps the clock until to (µs after the start), counting from from.
func (m *callSim) run(callers []*simCaller, from, to, step time.Duration) {
	m.t.Helper()
	m.from, m.to = m.start+from.Microseconds(), m.start+to.Microseconds()
	for m.now < m.to {
		if !m.callsFirst {
			m.take()
		}
		m.call(callers)
		if m.callsFirst {
			m.take()
		}
		m.now += step.Microseconds()
	}
}

// take runs the take at the clock's time, counting the slots of the jobs
// it gives.
func (m *callSim) take() {
	m.t.Helper()
	tk, err := m.tk.take(context.Background(), 64, strconv.FormatInt(m.now, 10))
	if err != nil {
		m.t.Fatal(err)
	}
	for _, j := range tk.Jobs {
		m.count(m.jobsOf[j.ID], m.laneOf[j.ID], m.now+j.Slot.Delay.Microseconds())
	}
}

// call lets each caller whose time came call, counting the slots booked.
func (m *callSim) call(callers []*simCaller) {
	m.t.Helper()
	for _, c := range callers {
		if c.slot != 0 && c.slot <= m.now {
			c.next = c.slot + c.think // sent; it calls again
			c.slot = 0
		}
		if c.slot != 0 || c.next > m.now {
			continue
		}
		ok, delay, wait, refused := m.booked(c)
		switch {
		case ok:
			c.slot = m.now + delay.Microseconds()
			c.calls++
			m.count(c.fk, c.lane, c.slot)
		case refused:
			c.refusals++
			c.next = m.now + wait.Microseconds()
		default:
			c.next = m.now + max(wait.Microseconds(), 1)
		}
	}
}

func callers(fk string, n int) []*simCaller {
	out := make([]*simCaller, n)
	for i := range out {
		out[i] = &simCaller{fk: fk, id: fmt.Sprintf("%s-%d-%p", fk, i, &out)}
	}
	return out
}

// share fails unless key a got its part of the slots counted, within tol,
// and the upstream stayed at its limit: 50/s over the 7 s counted.
func (m *callSim) share(a string, part, tol float64) {
	m.t.Helper()
	m.shareOf(a, part, tol, 340)
}

// shareOf is share where the slots counted must be at least least.
func (m *callSim) shareOf(a string, part, tol float64, least int) {
	m.t.Helper()
	total := 0
	for _, n := range m.slots {
		total += n
	}
	got := float64(m.slots[a]) / float64(total)
	m.t.Logf("%s got %d of %d slots (%.1f%%); all %v, by lane %v", a, m.slots[a], total, 100*got, m.slots, m.lanes)
	if total < least || got < part-tol || got > part+tol {
		m.t.Errorf("%s got %d of %d slots (%.0f%%), want %.0f%% ± %.0f%% (all: %v)", a, m.slots[a], total, 100*got, 100*part, 100*tol, m.slots)
	}
}

// TestCallsTakeTheirFairShare: at an upstream of 50/s that is the
// bottleneck, a tenant's proxied calls get its fair share of the slots,
// no more and no less, whether the other tenant waits with jobs or with
// calls: 4 callers of a against b's 500 queued jobs, b's one caller
// against a's 1,000 jobs, 4 callers against 1, and by weight (b weighs 3).
func TestCallsTakeTheirFairShare(t *testing.T) {
	if testing.Short() {
		t.Skip("seven simulated seconds of takes and calls, five times: runs in make test")
	}
	u := shaper.Upstream{Limits: []leaky.Limit{leaky.PerSecond(50)}}
	step := 5 * time.Millisecond
	t.Run("a's calls against b's jobs", func(t *testing.T) {
		m := newCallSim(t, "fair-calls-jobs", u)
		m.enqueue("b", 500)
		m.run(callers("a", 4), time.Second, 8*time.Second, step)
		m.share("a", 0.5, 0.08)
	})
	t.Run("b's caller against a's jobs", func(t *testing.T) {
		m := newCallSim(t, "fair-jobs-call", u)
		m.enqueue("a", 1000)
		m.run(callers("b", 1), time.Second, 8*time.Second, step)
		m.share("b", 0.5, 0.08)
	})
	t.Run("4 callers against 1", func(t *testing.T) {
		m := newCallSim(t, "fair-calls-calls", u)
		m.run(append(callers("a", 4), callers("b", 1)...), time.Second, 8*time.Second, step)
		m.share("a", 0.5, 0.08)
	})
	t.Run("by weight", func(t *testing.T) {
		w := u
		w.Fairness.Weights = map[string]int{"b": 3}
		m := newCallSim(t, "fair-weights", w)
		m.enqueue("b", 500)
		m.run(callers("a", 4), time.Second, 8*time.Second, step)
		m.share("a", 0.25, 0.08)
	})
	// A's calls and b's jobs in one partition whose limit is the
	// upstream's: the take books the partition's slots as far ahead as
	// the upstream's, and a call whose partition can send by the
	// upstream's own next slot takes its turn (it no longer waits for the
	// partition to be free at once, which b's take never left it).
	t.Run("in the jobs' partition", func(t *testing.T) {
		p := u
		p.PartitionLimits = []leaky.Limit{leaky.PerSecond(50)}
		m := newCallSim(t, "fair-partition", p)
		m.partition = "p"
		m.enqueue("b", 500)
		m.run(callers("a", 4), time.Second, 8*time.Second, step)
		m.share("a", 0.5, 0.08)
	})
	// A's calls and b's jobs in one partition tighter than the upstream
	// (25/s at 50/s): the partition, not the upstream, is what they share,
	// and a call it holds marks the partition, so that the take leaves
	// its next slot to the call while a is behind (it did not: a call
	// got a slot only if it came back before the take, none of 155).
	// Whether the calls come back for the partition's slot before the take
	// does, or after.
	for _, first := range []bool{false, true} {
		t.Run(fmt.Sprintf("in a partition tighter than the upstream, calls first %v", first), func(t *testing.T) {
			p := u
			p.PartitionLimits = []leaky.Limit{leaky.PerSecond(25)}
			m := newCallSim(t, "fair-tight", p)
			m.partition, m.callsFirst = "p", first
			m.enqueue("b", 500)
			m.run(callers("a", 4), time.Second, 8*time.Second, step)
			// (The partition's 25/s over 7 s, less what the clock's steps of
			// 5 ms lose.)
			m.shareOf("a", 0.5, 0.08, 150)
		})
	}
	// The same, with b's jobs in a second partition too: a's calls wait
	// for their partition, not for the upstream, so the take still sends
	// b's jobs of the other one (the upstream stays at its limit), and
	// the keys waiting for p take turns in it by what each sent there: a
	// gets half of p's slots, a quarter of the upstream's.
	t.Run("in a tight partition beside another", func(t *testing.T) {
		p := u
		p.PartitionLimits = []leaky.Limit{leaky.PerSecond(25)}
		m := newCallSim(t, "fair-tight-other", p)
		m.partition = "q"
		m.enqueue("b", 300)
		m.partition = "p"
		m.enqueue("b", 300)
		m.run(callers("a", 4), time.Second, 8*time.Second, step)
		// (Both partitions' 25/s over 7 s, less what the clock's steps
		// lose: the upstream's 50/s.)
		m.shareOf("a", 0.25, 0.06, 300)
	})
	// Two tenants' calls and a third's jobs in one tight partition: a call
	// of a key ahead of one whose call waits for the partition leaves it
	// the partition's slot, as the take does, so the 4 callers of a, the
	// one of c and b's jobs get a third each (a's callers took all).
	t.Run("two tenants' calls in a tight partition", func(t *testing.T) {
		p := u
		p.PartitionLimits = []leaky.Limit{leaky.PerSecond(25)}
		m := newCallSim(t, "fair-tight-calls", p)
		m.partition = "p"
		m.enqueue("b", 300)
		m.run(append(callers("a", 4), callers("c", 1)...), time.Second, 8*time.Second, step)
		m.shareOf("a", 1.0/3, 0.08, 150)
		m.shareOf("c", 1.0/3, 0.08, 150)
	})
	// A call's lane counts in its tenant's share as a job of that lane:
	// a's calls in lane fast and its jobs in fast and bulk (equal
	// weights) split a's half, fast (calls and jobs) and bulk alike, and
	// a's own jobs do not hold its calls back.
	t.Run("lanes", func(t *testing.T) {
		l := u
		l.Lanes = map[string]int{"default": 1, "fast": 1, "bulk": 1}
		m := newCallSim(t, "fair-lanes", l)
		m.enqueueIn("a", "fast", 300)
		m.enqueueIn("a", "bulk", 300)
		m.enqueue("b", 500)
		cs := callers("a", 4)
		for _, c := range cs {
			c.lane = "fast"
		}
		m.run(cs, time.Second, 8*time.Second, step)
		m.share("a", 0.5, 0.08)
		calls := 0
		for _, c := range cs {
			calls += c.calls
		}
		t.Logf("a's callers made %d calls", calls)
		if calls < 60 {
			t.Errorf("a's callers made %d calls in 8 s, want them not held back by a's own jobs", calls)
		}
		fast, bulk := m.lanes["a/fast"], m.lanes["a/bulk"]
		if d := float64(fast-bulk) / float64(fast+bulk); d > 0.15 || d < -0.15 {
			t.Errorf("a's lanes: fast (calls and jobs) %d, bulk %d; want them about even", fast, bulk)
		}
	})
}

// TestJobsShareATightPartition: two tenants' jobs in one partition
// whose limit is tighter than the upstream's get half of its slots each.
// Each take leaves the tenants' lanes on the calendar until the partition
// can send; a key that left the rotation so comes back at the virtual
// time it left with (kv), not level with whoever is there (a key alone,
// or none), which gave every slot to the key whose name sorts first.
func TestJobsShareATightPartition(t *testing.T) {
	m := newCallSim(t, "fair-tight-jobs", shaper.Upstream{Limits: []leaky.Limit{leaky.PerSecond(50)},
		PartitionLimits: []leaky.Limit{leaky.PerSecond(25)}})
	m.partition = "p"
	m.enqueue("b", 200)
	m.enqueue("a", 200)
	m.run(nil, time.Second, 5*time.Second, 5*time.Millisecond)
	m.shareOf("a", 0.5, 0.08, 85)
}

// TestLanesShareATightPartition: a tenant's lanes whose jobs share one
// tight partition divide its slots by lane weight (fast 3, bulk 1), as
// keys do above: a lane back from the calendar comes in at the virtual
// time it left with (kl). Before, bulk, whose name sorts first, got every
// slot (89 of 89).
func TestLanesShareATightPartition(t *testing.T) {
	m := newCallSim(t, "fair-tight-lanes", shaper.Upstream{Limits: []leaky.Limit{leaky.PerSecond(50)},
		PartitionLimits: []leaky.Limit{leaky.PerSecond(25)}, Lanes: map[string]int{"default": 1, "fast": 3, "bulk": 1}})
	m.partition = "p"
	m.enqueueIn("a", "fast", 200)
	m.enqueueIn("a", "bulk", 200)
	m.run(nil, time.Second, 5*time.Second, 5*time.Millisecond)
	fast, bulk := m.lanes["a/fast"], m.lanes["a/bulk"]
	t.Logf("fast %d, bulk %d", fast, bulk)
	if share := float64(fast) / float64(fast+bulk); fast+bulk < 85 || share < 0.67 || share > 0.83 {
		t.Errorf("fast got %d and bulk %d of the partition's slots, want fast 75%% ± 8%% of at least 85", fast, bulk)
	}
}

// TestNewcomersInATightPartition: a key that had a tight partition to
// itself for 10 s (its virtual time far ahead) and a key that comes then
// take turns in it: the newcomer starts level with it, not at the
// rotation's 0 (which gave the newcomer every slot, 89 of 89, until it
// caught up: 9 s), whether each waits with jobs or with calls.
func TestNewcomersInATightPartition(t *testing.T) {
	if testing.Short() {
		t.Skip("fourteen simulated seconds of takes and calls, three times: runs in make test")
	}
	tight := shaper.Upstream{Limits: []leaky.Limit{leaky.PerSecond(50)}, PartitionLimits: []leaky.Limit{leaky.PerSecond(25)}}
	step := 5 * time.Millisecond
	for _, tc := range []struct {
		name             string
		first, newcomers string // "jobs" or "calls"
	}{
		{"jobs after jobs", "jobs", "jobs"},
		{"calls after calls", "calls", "calls"},
		{"jobs after calls", "calls", "jobs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newCallSim(t, "fair-newcomer", tight)
			m.partition = "p"
			var cs []*simCaller
			if tc.first == "jobs" {
				m.enqueue("c", 600)
			} else {
				cs = callers("c", 1)
			}
			m.run(cs, 0, 10*time.Second, step)
			m.slots = map[string]int{}
			if tc.newcomers == "jobs" {
				m.enqueue("a", 300)
			} else {
				cs = append(cs, callers("a", 1)...)
			}
			m.run(cs, 10*time.Second, 14*time.Second, step)
			m.shareOf("a", 0.5, 0.1, 80)
		})
	}
}

// TestLeftPartitionCallsHoldNobody: callers whose partition held them
// that stop coming back leave marks on the partition that lapse as a
// key's do: within CallMark and a few of the partition's slots the take
// gives every one of them to the jobs again.
func TestLeftPartitionCallsHoldNobody(t *testing.T) {
	m := newCallSim(t, "fair-left-tight", shaper.Upstream{Limits: []leaky.Limit{leaky.PerSecond(50)},
		PartitionLimits: []leaky.Limit{leaky.PerSecond(25)}})
	m.partition = "p"
	m.enqueue("b", 300)
	m.run(callers("a", 4), 0, 2*time.Second, 5*time.Millisecond)
	if m.slots["a"] < 15 {
		t.Fatalf("a's callers got %d slots in 2 s, want their share", m.slots["a"])
	}
	m.slots = map[string]int{}
	const lapse = CallMark + 100*time.Millisecond
	m.run(nil, 2*time.Second+lapse, 4*time.Second, 5*time.Millisecond)
	// (The partition's 25/s, less what the clock's steps of 5 ms lose.)
	if want := int(0.85 * 25 * (2*time.Second - lapse).Seconds()); m.slots["b"] < want || m.slots["a"] != 0 {
		t.Errorf("after a's callers left: b got %d slots, a %d; want b at least %d, a none", m.slots["b"], m.slots["a"], want)
	}
	// And no mark lives on: the take's marks for b's jobs beside the
	// calls are not renewed once no call waits.
	rdb := srv.Client(t)
	for _, k := range []string{"cpw", "jpw"} {
		live, err := rdb.ZCount(context.Background(), m.s.our+k, fmt.Sprintf("(%d", m.now), "+inf").Result()
		if err != nil || live != 0 {
			t.Errorf("%s: %d marks live 2 s after the callers left (%v), want none", k, live, err)
		}
	}
}

// TestLeftCallsHoldNobody: callers that stop coming back (their serve
// died mid-wait, or they hung up) booked nothing while they waited their
// turn, and their key's mark lapses: within CallMark and a horizon the
// take gives every slot to the jobs again.
func TestLeftCallsHoldNobody(t *testing.T) {
	m := newCallSim(t, "fair-left", shaper.Upstream{Limits: []leaky.Limit{leaky.PerSecond(50)}})
	m.enqueue("b", 500)
	cs := callers("a", 4)
	m.run(cs, 0, 2*time.Second, 5*time.Millisecond)
	if m.slots["a"] < 30 {
		t.Fatalf("a's callers got %d slots in 2 s, want their share", m.slots["a"])
	}
	// They leave while ahead and waiting their turn.
	m.slots = map[string]int{}
	const lapse = CallMark + 250*time.Millisecond
	m.run(nil, 2*time.Second+lapse, 4*time.Second, 5*time.Millisecond)
	if want := int(0.95 * 50 * (2*time.Second - lapse).Seconds()); want < 60 || m.slots["b"] < want || m.slots["a"] != 0 {
		t.Errorf("after a's callers left: b got %d slots, a %d; want b at least %d, a none", m.slots["b"], m.slots["a"], want)
	}
}

// TestTightPartitionCallsGetTheirShare: a's 4 callers in partition p,
// whose limit (10/s) is a fifth of the upstream's (50/s), and b's jobs in
// five other partitions as tight, which alone could fill the upstream: a,
// behind b, gets what its partition can carry (10/s, a's share being
// more), b the rest, and the upstream stays at its limit. The take leaves
// the upstream's slot at the time a held call comes back (before, it
// booked the upstream's slots out to its horizon, and a got 27 of 343).
func TestTightPartitionCallsGetTheirShare(t *testing.T) {
	if testing.Short() {
		t.Skip("seven simulated seconds of takes and calls: runs in make test")
	}
	for _, tc := range []struct {
		callers int
		think   time.Duration
	}{{4, 0}, {1, 60 * time.Millisecond}} {
		t.Run(fmt.Sprintf("%d callers answered after %v", tc.callers, tc.think), func(t *testing.T) {
			m := newCallSim(t, "fair-tight-share", shaper.Upstream{Limits: []leaky.Limit{leaky.PerSecond(50)},
				PartitionLimits: []leaky.Limit{leaky.PerSecond(10)}})
			for _, q := range []string{"q1", "q2", "q3", "q4", "q5"} {
				m.partition = q
				m.enqueue("b", 120)
			}
			m.partition = "p"
			cs := callers("a", tc.callers)
			for _, c := range cs {
				c.think = tc.think.Microseconds()
			}
			m.run(cs, time.Second, 8*time.Second, 5*time.Millisecond)
			m.shareOf("a", 0.2, 0.05, 330)
		})
	}
}

// TestTightPartitionSharedBesideAFullUpstream: c's calls and d's jobs in
// partition p (10/s), b's jobs in five partitions as tight that fill the
// upstream (50/s) without p: c and d take turns in p, half each, and b
// has the rest. (Keys took turns by their places in the rotation, where d,
// back from the calendar each time near b's, stood far ahead of c: d got
// 0 of p's 69.) And callers that answer 60 ms after their slot (the
// upstream's answer) leave the upstream at its limit: a slot held for a
// call is the one it comes back for, not the one it booked.
func TestTightPartitionSharedBesideAFullUpstream(t *testing.T) {
	if testing.Short() {
		t.Skip("seven simulated seconds of takes and calls, twice: runs in make test")
	}
	for _, think := range []time.Duration{0, 60 * time.Millisecond} {
		t.Run(fmt.Sprintf("callers answered after %v", think), func(t *testing.T) {
			m := newCallSim(t, "fair-tight-beside", shaper.Upstream{Limits: []leaky.Limit{leaky.PerSecond(50)},
				PartitionLimits: []leaky.Limit{leaky.PerSecond(10)}})
			for _, q := range []string{"q1", "q2", "q3", "q4", "q5"} {
				m.partition = q
				m.enqueue("b", 120)
			}
			m.partition = "p"
			m.enqueue("d", 100)
			cs := callers("c", 2)
			for _, c := range cs {
				c.think = think.Microseconds()
			}
			m.run(cs, time.Second, 8*time.Second, 5*time.Millisecond)
			total := m.slots["b"] + m.slots["c"] + m.slots["d"]
			t.Logf("b %d, c %d, d %d of %d", m.slots["b"], m.slots["c"], m.slots["d"], total)
			if total < 330 || m.slots["c"] < 25 || m.slots["d"] < 25 || m.slots["c"]+m.slots["d"] < 60 {
				t.Errorf("b %d, c %d, d %d of %d slots: want c and d about 35 each of p's 70, the upstream at its limit (at least 330)",
					m.slots["b"], m.slots["c"], m.slots["d"], total)
			}
		})
	}
}

// TestTightPartitionCallOfABusyTenant: c's one caller in partition p
// (10/s), whose tenant also calls with four callers outside any
// partition, beside d's jobs in p and four more partitions and b's jobs
// in five others, which fill the upstream (50/s): the three tenants get a
// third of the upstream each, and c's caller in p is not starved (it made
// no call when a call key's time in the rotation was set against the
// jobs' times within the partition; which of c's own callers use c's
// share is first come, first served).
func TestTightPartitionCallOfABusyTenant(t *testing.T) {
	if testing.Short() {
		t.Skip("seven simulated seconds of takes and calls: runs in make test")
	}
	m := newCallSim(t, "fair-tight-busy", shaper.Upstream{Limits: []leaky.Limit{leaky.PerSecond(50)},
		PartitionLimits: []leaky.Limit{leaky.PerSecond(10)}})
	for _, q := range []string{"r1", "r2", "r3", "r4", "r5"} {
		m.partition = q
		m.enqueue("b", 120)
	}
	for _, q := range []string{"p", "q1", "q2", "q3", "q4"} {
		m.partition = q
		m.enqueue("d", 60)
	}
	inP, none := "p", ""
	cp := callers("c", 1)
	cp[0].partition = &inP
	cn := callers("c", 4)
	for _, c := range cn {
		c.partition = &none
	}
	m.run(append(cp, cn...), time.Second, 8*time.Second, 5*time.Millisecond)
	t.Logf("slots %v; c's caller in p made %d calls", m.slots, cp[0].calls)
	for _, k := range []string{"b", "c", "d"} {
		m.shareOf(k, 1.0/3, 0.05, 330)
	}
	if cp[0].calls < 3 {
		t.Errorf("c's caller in p made %d calls in 8 s, want a turn in p now and then", cp[0].calls)
	}
}
