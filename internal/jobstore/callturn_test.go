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
	booked    func(c *simCaller) (ok bool, delay, wait time.Duration, refused bool)
}

type simCaller struct {
	id    string // its calls' id, one after the other
	fk    string
	lane  string
	next  int64 // µs when it calls (or comes back)
	slot  int64 // µs of its booked slot, 0 none
	calls int
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
		tn, err := s.BookCall(context.Background(), rdb, Call{Upstream: u, Bucket: b, FairKey: c.fk, Lane: c.lane, ID: c.id,
			Partition: sim.partition, PartitionLimits: u.PartitionLimits,
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
		id := fmt.Sprintf("%s-%s-%04d", fk, lane, i)
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
		tk, err := m.tk.take(context.Background(), 64, strconv.FormatInt(m.now, 10))
		if err != nil {
			m.t.Fatal(err)
		}
		for _, j := range tk.Jobs {
			m.count(m.jobsOf[j.ID], m.laneOf[j.ID], m.now+j.Slot.Delay.Microseconds())
		}
		for _, c := range callers {
			if c.slot != 0 && c.slot <= m.now {
				c.slot = 0 // sent; it calls again
				c.next = m.now
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
		m.now += step.Microseconds()
	}
}

func callers(fk string, n int) []*simCaller {
	out := make([]*simCaller, n)
	for i := range out {
		out[i] = &simCaller{fk: fk, id: fmt.Sprintf("%s-%d-%p", fk, i, &out)}
	}
	return out
}

// share fails unless key a got its part of the slots counted, within tol.
func (m *callSim) share(a string, part, tol float64) {
	m.t.Helper()
	total := 0
	for _, n := range m.slots {
		total += n
	}
	got := float64(m.slots[a]) / float64(total)
	m.t.Logf("%s got %d of %d slots (%.1f%%); all %v, by lane %v", a, m.slots[a], total, 100*got, m.slots, m.lanes)
	// The upstream stays at its limit: 50/s over the 7 s counted.
	if total < 340 || got < part-tol || got > part+tol {
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
