package jobstore_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/leaky"
	"slices"
	"strconv"
	"testing"
	"time"
)

// waitNext sleeps until a take said something comes due, failing if it
// said nothing does or names a time outside [lo, hi].
func waitNext(t *testing.T, tk jobstore.Take, lo, hi time.Duration) {
	t.Helper()
	if tk.Next < lo || tk.Next > hi {
		t.Fatalf("take said next %v, want within [%v, %v]", tk.Next, lo, hi)
	}
	time.Sleep(tk.Next + 5*time.Millisecond)
}

func onCalendar(r *rig, lane, fk string) bool {
	r.t.Helper()
	_, err := r.rdb.ZScore(context.Background(), r.space.CalendarKey(), lane+"|"+fk).Result()
	return err == nil
}

// A partition that cannot send within the lookahead is parked; when every
// partition of a lane is parked the lane leaves the rotation for the
// calendar, and comes back when its earliest partition can send. A job
// enqueued meanwhile into another partition goes at once; one enqueued
// into the parked partition waits for it.
func TestLaneCalendarAndParkedPartition(t *testing.T) {
	if testing.Short() {
		t.Skip("seconds of parked partitions: runs in make test")
	}
	u := fast("cal")
	u.PartitionLimits = []leaky.Limit{{Rate: 1, Per: time.Second}}
	r := newRig(t, srv().Client(t), u, 100*time.Millisecond)
	r.add(job{id: "j1", tenant: "a", partition: "p1"}, job{id: "j2", tenant: "a", partition: "p1"})
	r.check("enqueue")
	if got := r.takeIDs(10); !slices.Equal(got, []string{"j1"}) {
		t.Fatalf("took %v, want [j1]: p1 can send once a second", got)
	}
	r.check("first take")
	tk := r.take(10)
	if len(tk.Jobs) != 0 {
		t.Fatalf("took %v while p1 is parked", ids(tk))
	}
	if !onCalendar(r, "default", "a") {
		t.Fatalf("lane default of a is not on the calendar with its only partition parked")
	}
	if r.exists(r.space.LanesKey("a")) {
		t.Errorf("a's lane set still exists with its only lane on the calendar")
	}
	r.check("lane calendared")

	// Another partition of the calendared lane goes at once.
	r.add(job{id: "j3", tenant: "a", partition: "p2"})
	if onCalendar(r, "default", "a") {
		t.Errorf("lane still on the calendar after an enqueue made it ready")
	}
	r.check("enqueue while calendared")
	if got := r.takeIDs(10); !slices.Equal(got, []string{"j3"}) {
		t.Fatalf("took %v, want [j3]: p2 is not parked", got)
	}
	r.check("take of the other partition")
	// One into the parked partition waits for it.
	r.add(job{id: "j4", tenant: "a", partition: "p1"})
	r.check("enqueue into the parked partition")
	tk = r.take(10)
	if len(tk.Jobs) != 0 {
		t.Fatalf("took %v before p1 came due", ids(tk))
	}
	r.check("take while p1 parked")
	// p1's next slot is 1s (+guard) after j1's; the lane is due then (a
	// partition's job is taken when its partition can send, not ahead).
	waitNext(t, tk, 500*time.Millisecond, 1100*time.Millisecond)
	if got := r.takeIDs(10); !slices.Equal(got, []string{"j2"}) {
		t.Fatalf("after p1 came due took %v, want [j2]", got)
	}
	r.check("take after due")
	tk = r.take(10)
	if len(tk.Jobs) != 0 {
		t.Fatalf("took %v: p1 and p2 each sent within the last second", ids(tk))
	}
	waitNext(t, tk, 500*time.Millisecond, 1100*time.Millisecond)
	if got := r.takeIDs(10); !slices.Equal(got, []string{"j4"}) {
		t.Fatalf("took %v, want [j4]", got)
	}
	r.check("last take")
}

// A lane whose partitions are all parked retires while the key's other
// lane goes on, and rejoins at the key's current lane time: no backlog of
// turns, no loss of its turn.
func TestLaneRetiresAndRejoins(t *testing.T) {
	u := fast("rejoin")
	u.Lanes = map[string]int{"a": 1, "b": 1}
	u.PartitionOverrides = map[string][]leaky.Limit{"slow": {{Rate: 1, Per: 500 * time.Millisecond}}}
	r := newRig(t, srv().Client(t), u, 50*time.Millisecond)
	for i := range 3 {
		r.add(job{id: fmt.Sprintf("s%d", i), lane: "a", tenant: "t", partition: "slow"})
	}
	for i := range 100 {
		r.add(job{id: fmt.Sprintf("b%03d", i), lane: "b", tenant: "t"})
	}
	var got []string
	for range 4 {
		got = append(got, r.takeIDs(1)...)
	}
	if want := []string{"s0", "b000", "b001", "b002"}; !slices.Equal(got, want) {
		t.Fatalf("took %v, want %v: lane a parks after s0", got, want)
	}
	if !onCalendar(r, "a", "t") {
		t.Fatalf("lane a is not on the calendar")
	}
	r.check("lane a calendared")
	// Lane b goes on alone until slow is due again.
	deadline := time.Now().Add(2 * time.Second)
	var order []string
	for time.Now().Before(deadline) && !slices.Contains(order, "s1") {
		order = append(order, r.takeIDs(1)...)
		time.Sleep(5 * time.Millisecond)
	}
	i := slices.Index(order, "s1")
	if i < 0 {
		t.Fatalf("s1 not taken within 2s of a 500ms partition limit")
	}
	if onCalendar(r, "a", "t") {
		t.Errorf("lane a still on the calendar after it rejoined")
	}
	r.check("lane a rejoined")
	// Rejoined at the key's lane time, it alternates with b again at once,
	// no catch-up burst for the time it was away: the next take is b's.
	if nx := r.takeIDs(1); len(nx) != 1 || nx[0][0] != 'b' {
		t.Errorf("after s1 took %v, want one of lane b", nx)
	}
	r.check("after rejoin")
}

// Cancel empties flows; the take that meets an emptied flow cleans it up.
// A scheduled and a retrying job cancel too; an active one does not.
func TestCancelEmptiesFlow(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, srv().Client(t), fast("cancelflow"), 100*time.Millisecond)
	r.add(job{id: "x1", tenant: "a", partition: "p"})
	if err := r.space.Cancel(ctx, r.rdb, "x1"); err != nil {
		t.Fatal(err)
	}
	r.check("cancel of the only job")
	tk := r.take(10)
	if len(tk.Jobs) != 0 || tk.Wait > 0 {
		t.Fatalf("take %+v after the only job was cancelled, want nothing and no wait", tk)
	}
	for _, k := range []string{r.space.ReadyKey("default", "a"), r.space.LanesKey("a"), r.store.Groups(),
		r.space.GroupKey("default", "a", "p"), r.space.FairKeysKey()} {
		if r.exists(k) {
			t.Errorf("%s left after a take met the emptied flow", k)
		}
	}
	r.check("take after cancel")

	r.add(job{id: "y1", tenant: "a", partition: "p"}, job{id: "y2", tenant: "a", partition: "q"},
		job{id: "y3", tenant: "b", partition: "p"})
	if err := r.space.Cancel(ctx, r.rdb, "y1"); err != nil {
		t.Fatal(err)
	}
	r.check("cancel of one of three")
	if got := r.takeIDs(10); !slices.Equal(got, []string{"y2", "y3"}) {
		t.Fatalf("took %v, want [y2 y3]", got)
	}
	r.check("take")
	if err := r.space.Cancel(ctx, r.rdb, "y2"); !errors.Is(err, jobstore.ErrNotWaiting) {
		t.Errorf("cancel of an active job: %v, want ErrNotWaiting", err)
	}

	r.add(job{id: "z1", tenant: "a", partition: "p", at: time.Now().Add(time.Hour)})
	r.finish(jobstore.Retry, time.Now().Add(time.Hour), "y2")
	r.check("scheduled and retrying")
	for _, id := range []string{"z1", "y2"} {
		if err := r.space.Cancel(ctx, r.rdb, id); err != nil {
			t.Fatalf("cancel %s: %v", id, err)
		}
		r.check("cancel of " + id)
	}
	if c := r.counts(); c["default"]["dead"] != 4 || c["default"]["active"] != 1 || len(c["default"]) != 2 {
		t.Errorf("counts %v, want 4 dead (x1 y1 y2 z1) and 1 active (y3)", c)
	}
}

// A limit that counts a named cost (tokens) books each job's cost on its
// partition: a job costing more than the partition has left parks it, one
// costing none of it passes.
func TestPartitionCostLimit(t *testing.T) {
	ctx := context.Background()
	tokens := leaky.Limit{Rate: 100, Per: time.Hour, Cost: "tokens", Burst: 10}
	u := fast("tokens")
	u.Limits = append(u.Limits, leaky.Limit{Rate: 1_000_000, Per: time.Second, Cost: "tokens", Burst: 1000})
	u.PartitionLimits = []leaky.Limit{tokens}
	r := newRig(t, srv().Client(t), u, 100*time.Millisecond)
	six := map[string]int64{"tokens": 6}
	r.add(job{id: "c1", tenant: "a", partition: "p1", costs: six}, job{id: "c2", tenant: "a", partition: "p1", costs: six},
		job{id: "c3", tenant: "a", partition: "p2", costs: six}, job{id: "c4", tenant: "a", partition: "p1", costs: map[string]int64{"tokens": 1}},
		job{id: "c5", tenant: "a", partition: "p2"})
	got := r.takeIDs(10)
	if want := []string{"c1", "c3", "c5"}; !slices.Equal(got, want) {
		t.Fatalf("took %v, want %v: c2 needs 6 tokens of p1's 4 left (c4 is behind it), c5 needs none", got, want)
	}
	r.check("take")
	r.finish(jobstore.Succeeded, time.Time{}, got...) // their leases would be what comes due next
	r.check("finish")
	// p1's TAT is 6 tokens' worth of intervals ahead.
	interval := time.Duration(tokens.Params(r.u.Guard).Interval) * time.Microsecond
	key := r.bucket.Layout().PartitionPrefix + "p1:" + leaky.LimitID(tokens)
	v, err := r.rdb.Get(ctx, key).Result()
	if err != nil {
		t.Fatalf("partition TAT %s: %v", key, err)
	}
	tat, _ := strconv.ParseInt(v, 10, 64)
	if ahead := time.Until(time.UnixMicro(tat)); ahead < 6*interval-time.Second || ahead > 6*interval+time.Second {
		t.Errorf("p1's tokens TAT is %v ahead, want 6 × %v", ahead, interval)
	}
	if ttl := r.rdb.PTTL(ctx, key).Val(); ttl < 6*interval+tokens.Per-2*time.Second || ttl > 6*interval+tokens.Per+time.Second {
		t.Errorf("p1's TAT expires in %v, want its level plus the window, %v", ttl, 6*interval+tokens.Per)
	}
	tk := r.take(10)
	if len(tk.Jobs) != 0 {
		t.Fatalf("took %v with p1 short of tokens", ids(tk))
	}
	// c2 can go when two more tokens have drained: 2 intervals, less the lookahead.
	if want := 2*interval - 100*time.Millisecond; tk.Next < want-time.Second || tk.Next > want+time.Second {
		t.Errorf("next %v, want about %v", tk.Next, want)
	}
	r.check("parked on tokens")
}

// A blocked upstream takes nothing and says until when; the jobs stay
// queued. The concurrency cap stops a take the same way.
func TestBlockedAndConcurrency(t *testing.T) {
	ctx := context.Background()
	t.Run("blocked", func(t *testing.T) {
		r := newRig(t, srv().Client(t), fast("blocked"), 100*time.Millisecond)
		r.add(job{id: "k1", tenant: "a"}, job{id: "k2", tenant: "b", partition: "p"})
		if _, err := r.bucket.Block(ctx, 5*time.Second, "test"); err != nil {
			t.Fatal(err)
		}
		tk := r.take(10)
		if len(tk.Jobs) != 0 || tk.Reason != leaky.ReasonBlocked || tk.Wait < 4*time.Second || tk.Wait > 5*time.Second {
			t.Fatalf("take while blocked: %d jobs, wait %v, reason %v; want none, ~4.9s, blocked", len(tk.Jobs), tk.Wait, tk.Reason)
		}
		if v, _ := r.rdb.HGet(ctx, r.space.VKey(), "sleep").Result(); v != "" {
			t.Errorf("sleep flag %q while blocked: the block's end, not an enqueue, should wake the worker", v)
		}
		r.check("take while blocked")
		if c := r.counts(); c["default"]["pending"] != 2 {
			t.Errorf("counts %v, want 2 pending", c)
		}
		if err := r.bucket.Unblock(ctx); err != nil {
			t.Fatal(err)
		}
		if got := r.takeIDs(10); len(got) != 2 {
			t.Fatalf("took %v after unblock, want both", got)
		}
		r.check("after unblock")
	})
	t.Run("concurrency", func(t *testing.T) {
		u := fast("conc")
		u.Concurrency = 2
		r := newRig(t, srv().Client(t), u, 100*time.Millisecond)
		for i := range 5 {
			r.add(job{id: fmt.Sprintf("n%d", i), tenant: "a"})
		}
		tk := r.take(10)
		if got := ids(tk); !slices.Equal(got, []string{"n0", "n1"}) {
			t.Fatalf("took %v under a cap of 2, want [n0 n1]", got)
		}
		if tk.Jobs[0].Slot.Lease != "n0" {
			t.Errorf("lease %q, want the job id", tk.Jobs[0].Slot.Lease)
		}
		if tk.Reason != leaky.ReasonConcurrency || tk.Wait <= 0 {
			t.Errorf("take filling the cap: reason %v wait %v, want concurrency and a wait", tk.Reason, tk.Wait)
		}
		r.check("take to the cap")
		tk = r.take(10)
		if len(tk.Jobs) != 0 || tk.Reason != leaky.ReasonConcurrency || tk.Wait <= 0 {
			t.Fatalf("take at the cap: %v, reason %v, wait %v; want nothing, concurrency, a wait", ids(tk), tk.Reason, tk.Wait)
		}
		if st, _ := r.bucket.State(ctx); st.InFlight != 2 {
			t.Errorf("in flight %d, want 2", st.InFlight)
		}
		if err := r.bucket.ReleaseLease(ctx, "n0"); err != nil {
			t.Fatal(err)
		}
		if got := r.takeIDs(10); !slices.Equal(got, []string{"n2"}) {
			t.Fatalf("took %v after one lease went, want [n2]", got)
		}
		// A requeued job gives its lease back and goes first again.
		if n, err := r.space.Requeue(ctx, r.rdb, r.bucket.Layout().Leases, "n1"); err != nil || n != 1 {
			t.Fatalf("requeue: %d, %v", n, err)
		}
		r.check("requeue")
		if got := r.takeIDs(10); !slices.Equal(got, []string{"n1"}) {
			t.Fatalf("took %v after the requeue, want [n1]", got)
		}
		r.check("last take")
	})
}

// Requeued jobs go back to their place in FIFO order, ahead of jobs
// enqueued after them, in every partition.
func TestRequeueRestoresOrder(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, srv().Client(t), fast("requeue"), 100*time.Millisecond)
	for i := range 6 {
		r.add(job{id: fmt.Sprintf("j%d", i), tenant: "a", partition: "p"})
	}
	if got := r.takeIDs(3); !slices.Equal(got, []string{"j0", "j1", "j2"}) {
		t.Fatalf("took %v", got)
	}
	r.check("take")
	if n, err := r.space.Requeue(ctx, r.rdb, r.bucket.Layout().Leases, "j2", "j0", "gone"); err != nil || n != 2 {
		t.Fatalf("requeue: %d, %v; want 2", n, err)
	}
	r.check("requeue")
	r.add(job{id: "j6", tenant: "a", partition: "p"})
	if got := r.takeIDs(10); !slices.Equal(got, []string{"j0", "j2", "j3", "j4", "j5", "j6"}) {
		t.Fatalf("took %v, want [j0 j2 j3 j4 j5 j6]", got)
	}
	r.check("take after requeue")
	// Requeueing a job twice moves it once.
	if n, _ := r.space.Requeue(ctx, r.rdb, r.bucket.Layout().Leases, "j3", "j3"); n != 1 {
		t.Errorf("requeue of the same job twice moved %d, want 1", n)
	}
	r.check("double requeue")
}

// Scheduled and retrying jobs come due into their flows in FIFO place;
// RunNow brings a retrying one at once. A job waiting after a failed
// attempt is counted retry, one handed back deferred, until it leaves.
func TestScheduledAndRetryComeDue(t *testing.T) {
	for _, tc := range []struct {
		name    string
		failure bool
		counter string
	}{
		{"failed attempt", true, "retry"},
		{"deferral", false, "deferred"},
	} {
		t.Run(tc.name, func(t *testing.T) { testScheduledAndRetryComeDue(t, tc.failure, tc.counter) })
	}
}

func testScheduledAndRetryComeDue(t *testing.T, failure bool, counter string) {
	ctx := context.Background()
	u := fast("due")
	u.Lanes = map[string]int{"default": 1, "bulk": 1}
	r := newRig(t, srv().Client(t), u, 50*time.Millisecond)
	r.add(job{id: "r1", lane: "bulk", tenant: "a", partition: "p"},
		job{id: "s1", lane: "bulk", tenant: "a", partition: "p", at: time.Now().Add(300 * time.Millisecond)})
	r.check("enqueue")
	if got := r.takeIDs(10); !slices.Equal(got, []string{"r1"}) {
		t.Fatalf("took %v, want [r1]", got)
	}
	r.end(jobstore.Retry, failure, time.Now().Add(200*time.Millisecond), "r1")
	r.check("retry")
	if c := r.counts(); c["bulk"][counter] != 1 || c["bulk"]["scheduled"] != 1 || len(c["bulk"]) != 2 {
		t.Errorf("counts %v, want 1 %s and 1 scheduled in bulk", c, counter)
	}
	tk := r.take(10)
	if len(tk.Jobs) != 0 {
		t.Fatalf("took %v before anything was due", ids(tk))
	}
	waitNext(t, tk, 100*time.Millisecond, 200*time.Millisecond)
	if got := r.takeIDs(10); !slices.Equal(got, []string{"r1"}) {
		t.Fatalf("took %v when r1 came due, want [r1]", got)
	}
	r.check("retry due")
	tk = r.take(10)
	got := ids(tk)
	if len(got) == 0 {
		waitNext(t, tk, 0, 150*time.Millisecond)
		got = r.takeIDs(10)
	} // else s1 came due already (a slow host): this take moved and took it.
	if !slices.Equal(got, []string{"s1"}) {
		t.Fatalf("took %v when s1 came due, want [s1]", got)
	}
	r.check("scheduled due")

	r.end(jobstore.Retry, failure, time.Now().Add(time.Hour), "s1")
	if c := r.counts(); c["bulk"][counter] != 1 {
		t.Errorf("counts %v, want 1 %s in bulk", c, counter)
	}
	if n, err := r.space.RunNow(ctx, r.rdb, "s1", "r1", "nope"); err != nil || n != 1 {
		t.Fatalf("run now: %d, %v; want 1 (r1 is active, nope unknown)", n, err)
	}
	r.check("run now")
	if got := r.takeIDs(10); !slices.Equal(got, []string{"s1"}) {
		t.Fatalf("took %v after run now, want [s1]", got)
	}
	r.finish(jobstore.Succeeded, time.Time{}, "s1", "r1")
	r.check("finish")
	if c := r.counts(); len(c) != 0 {
		t.Errorf("counts %v after every job finished without retention, want none", c)
	}
}

// A partition's next chance is reckoned with the costs of its next job:
// a job that carries none of a cost-named partition limit's cost is not
// held back because the job before it used up the partition's tokens,
// and a job that needs more than one token is parked until it can go.
func TestPartitionNextChanceUsesNextJobsCost(t *testing.T) {
	tokens := leaky.Limit{Rate: 100, Per: time.Hour, Cost: "tokens", Burst: 10}
	u := fast("nextcost")
	u.Limits = append(u.Limits, leaky.Limit{Rate: 1_000_000, Per: time.Second, Cost: "tokens", Burst: 1000})
	u.PartitionLimits = []leaky.Limit{tokens}
	r := newRig(t, srv().Client(t), u, 100*time.Millisecond)
	r.add(job{id: "c1", tenant: "a", partition: "p1", costs: map[string]int64{"tokens": 10}},
		job{id: "c2", tenant: "a", partition: "p1"},
		job{id: "c3", tenant: "a", partition: "p1", costs: map[string]int64{"tokens": 4}})
	got := r.takeIDs(10)
	if want := []string{"c1", "c2"}; !slices.Equal(got, want) {
		t.Fatalf("took %v, want %v: c2 costs no tokens, c3 needs 4 of none left", got, want)
	}
	r.finish(jobstore.Succeeded, time.Time{}, got...)
	r.check("take")
	tk := r.take(10)
	interval := time.Duration(tokens.Params(r.u.Guard).Interval) * time.Microsecond
	if want := 4*interval - 100*time.Millisecond; len(tk.Jobs) != 0 || tk.Next < want-time.Second || tk.Next > want+time.Second {
		t.Errorf("take: %v, next %v; want nothing until c3's 4 tokens (%v)", ids(tk), tk.Next, want)
	}
	r.check("parked")
}

// An enqueue publishes a wake-up only when a take found nothing to do
// since the last one: a busy upstream costs no PUBLISH per job. Requeue
// and RunNow wake a sleeping upstream too.
func TestWakeOnlyWhenAsleep(t *testing.T) {
	ctx := context.Background()
	rdb := srv().Client(t)
	r := newRig(t, rdb, fast("wake"), 100*time.Millisecond)
	sub := rdb.Subscribe(ctx, jobstore.WakeChannel(""))
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	ch := sub.Channel()
	wakes := func() (n int) {
		t.Helper()
		// PUBLISH is delivered before the script's reply; a PING round
		// trip on the subscription flushes anything still in flight.
		if err := sub.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		for {
			select {
			case m := <-ch:
				if m.Payload != r.u.Name {
					continue // another test's upstream
				}
				n++
			case <-time.After(50 * time.Millisecond):
				return n
			}
		}
	}
	r.add(job{id: "w1", tenant: "a"})
	if n := wakes(); n != 0 {
		t.Errorf("%d wakes for an enqueue before any take slept", n)
	}
	if got := r.takeIDs(10); len(got) != 1 {
		t.Fatalf("took %v", got)
	}
	if tk := r.take(10); len(tk.Jobs) != 0 {
		t.Fatalf("took %v", ids(tk))
	}
	r.add(job{id: "w2", tenant: "a"}, job{id: "w3", tenant: "b"})
	if n := wakes(); n != 1 {
		t.Errorf("%d wakes for two enqueues after a take slept, want 1", n)
	}
	r.takeIDs(10)
	r.take(10) // sleeps
	if n, err := r.space.Requeue(ctx, rdb, r.bucket.Layout().Leases, "w2"); err != nil || n != 1 {
		t.Fatalf("requeue: %d %v", n, err)
	}
	if n := wakes(); n != 1 {
		t.Errorf("%d wakes for a requeue while asleep, want 1", n)
	}
	r.takeIDs(10)
	r.finish(jobstore.Retry, time.Now().Add(time.Hour), "w2")
	r.take(10) // sleeps
	if n, err := r.space.RunNow(ctx, rdb, "w2"); err != nil || n != 1 {
		t.Fatalf("run now: %d %v", n, err)
	}
	if n := wakes(); n != 1 {
		t.Errorf("%d wakes for run now while asleep, want 1", n)
	}
	r.check("end")
}
