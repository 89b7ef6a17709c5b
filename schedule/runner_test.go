package schedule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

var srv *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &srv) }

// clock is a test's fixed clock, moved by hand.
type clock struct{ us atomic.Int64 }

func newClock(t time.Time) *clock    { c := &clock{}; c.set(t); return c }
func (c *clock) set(t time.Time)     { c.us.Store(t.UnixMicro()) }
func (c *clock) add(d time.Duration) { c.us.Add(d.Microseconds()) }
func (c *clock) now() time.Time      { return time.UnixMicro(c.us.Load()).UTC() }

// ledger stands in for the job store's idempotent enqueue: a repeated key
// returns the job it made. crash makes the next n enqueues store their job
// and then fail, as a replica killed between the enqueue and the advance.
type ledger struct {
	mu     sync.Mutex
	jobs   map[string]string
	keys   []string
	crash  int
	refuse string
}

func newLedger() *ledger { return &ledger{jobs: map[string]string{}} }

func (l *ledger) Enqueue(ctx context.Context, sch *Schedule, key string) (Run, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.refuse != "" {
		return Run{Refused: l.refuse}, nil
	}
	if id, ok := l.jobs[key]; ok {
		return Run{JobID: id}, nil
	}
	id := fmt.Sprintf("job-%d", len(l.jobs)+1)
	l.jobs[key] = id
	l.keys = append(l.keys, key)
	if l.crash > 0 {
		l.crash--
		return Run{}, errors.New("replica killed")
	}
	return Run{JobID: id, Created: true}, nil
}

func (l *ledger) sortedKeys() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Sorted(slices.Values(l.keys))
}

type rig struct {
	rdb *redis.Client
	clk *clock
	st  *Store
}

func newRig(t *testing.T, start time.Time) *rig {
	t.Helper()
	rdb := srv.Client(t)
	clk := newClock(start)
	return &rig{rdb: rdb, clk: clk, st: NewStore(rdb, Config{Prefix: "t-" + t.Name(), Now: clk.now})}
}

func (r *rig) runner(jobs Jobs) *Runner {
	return NewRunner(r.st, jobs, RunnerConfig{})
}

func (r *rig) create(t *testing.T, s Schedule) View {
	t.Helper()
	if s.Tenant == "" {
		s.Tenant = "acme"
	}
	if s.Job == nil {
		s.Job = json.RawMessage(`{"upstream":"reports","method":"POST","path":"/run"}`)
	}
	v, err := r.st.Create(context.Background(), &s)
	if err != nil {
		t.Fatalf("create %s: %v", s.Name, err)
	}
	return v
}

func keysOf(name string, ticks ...time.Time) []string {
	var out []string
	for _, tk := range ticks {
		out = append(out, "schedule:"+name+":"+fmt.Sprint(tk.Unix()))
	}
	return slices.Sorted(slices.Values(out))
}

// walk moves the clock from its time to until by step, with a pass of
// each runner (in turn) at each step.
func (r *rig) walk(until time.Time, step time.Duration, runners ...*Runner) {
	ctx := context.Background()
	for i := 0; !r.clk.now().After(until); i++ {
		runners[i%len(runners)].Pass(ctx)
		r.clk.add(step)
	}
}

func TestDailyRunsOnceOnDaylightSavingDays(t *testing.T) {
	loc := berlin(t)
	cases := []struct {
		name        string
		from, until time.Time
		want        []time.Time
	}{
		{"fall back", time.Date(2026, 10, 24, 12, 0, 0, 0, loc), time.Date(2026, 10, 26, 12, 0, 0, 0, loc),
			// 02:30 CEST only; 02:30 CET an hour later is not run.
			[]time.Time{time.Unix(1792888200, 0), time.Date(2026, 10, 26, 2, 30, 0, 0, loc)}},
		{"spring forward", time.Date(2026, 3, 28, 12, 0, 0, 0, loc), time.Date(2026, 3, 30, 12, 0, 0, 0, loc),
			// No 02:30 on the 29th.
			[]time.Time{time.Date(2026, 3, 30, 2, 30, 0, 0, loc)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, c.from)
			r.create(t, Schedule{Name: "nightly", Cron: "30 2 * * *", Timezone: "Europe/Berlin"})
			l := newLedger()
			// Two replicas, a pass each every 30 s.
			r.walk(c.until, 30*time.Second, r.runner(l), r.runner(l))
			if got, want := l.sortedKeys(), keysOf("nightly", c.want...); !slices.Equal(got, want) {
				t.Errorf("got runs %v, want %v", got, want)
			}
		})
	}
}

func TestEachTickOnceAcrossReplicas(t *testing.T) {
	start := time.Unix(1_800_000_000, 0).UTC()
	r := newRig(t, start)
	v := r.create(t, Schedule{Name: "often", Cron: "@every 1s"})
	if want := start.Add(time.Second); !v.NextRunAt.Equal(want) {
		t.Fatalf("next_run_at: got %v, want %v", v.NextRunAt, want)
	}
	l := newLedger()
	// Three replicas on one store, and three on stores of their own over
	// the same keys, all passing at the same instants.
	runners := []*Runner{r.runner(l), r.runner(l), r.runner(l)}
	for range 3 {
		runners = append(runners, NewRunner(NewStore(r.rdb, Config{Prefix: "t-" + t.Name(), Now: r.clk.now}), l, RunnerConfig{}))
	}
	ctx := context.Background()
	for r.clk.now().Before(start.Add(30 * time.Second)) {
		r.clk.add(100 * time.Millisecond)
		var wg sync.WaitGroup
		for _, rn := range runners {
			wg.Go(func() { rn.Pass(ctx) })
		}
		wg.Wait()
	}
	var want []time.Time
	for s := 1; s <= 30; s++ {
		want = append(want, start.Add(time.Duration(s)*time.Second))
	}
	if got, w := l.sortedKeys(), keysOf("often", want...); !slices.Equal(got, w) {
		t.Errorf("got %d runs %v, want %d %v", len(got), got, len(w), w)
	}
}

func TestCrashBetweenEnqueueAndAdvanceMakesOneJob(t *testing.T) {
	start := time.Unix(1_800_000_000, 0).UTC()
	r := newRig(t, start)
	r.create(t, Schedule{Name: "report", Cron: "@every 1m"})
	l := newLedger()
	l.crash = 1
	a, b := r.runner(l), r.runner(l)
	ctx := context.Background()
	r.clk.add(time.Minute)
	a.Pass(ctx) // enqueues, then "dies": the tick stays due
	v, err := r.st.Get(ctx, "acme", "report")
	if err != nil {
		t.Fatal(err)
	}
	if want := start.Add(time.Minute); !v.NextRunAt.Equal(want) {
		t.Fatalf("after the crash next_run_at: got %v, want %v (still due)", v.NextRunAt, want)
	}
	r.clk.add(time.Second)
	b.Pass(ctx) // enqueues again: the same job
	if got, want := l.sortedKeys(), keysOf("report", start.Add(time.Minute)); !slices.Equal(got, want) {
		t.Errorf("got runs %v, want %v", got, want)
	}
	v, _ = r.st.Get(ctx, "acme", "report")
	if v.LastJobID != "job-1" || !v.LastRunAt.Equal(start.Add(time.Minute)) || !v.NextRunAt.Equal(start.Add(2*time.Minute)) {
		t.Errorf("got last_job_id %q last_run_at %v next_run_at %v, want job-1, %v, %v",
			v.LastJobID, v.LastRunAt, v.NextRunAt, start.Add(time.Minute), start.Add(2*time.Minute))
	}
}

func TestMissedTicksFollowCatchUp(t *testing.T) {
	start := time.Unix(1_800_000_000, 0).UTC()
	for _, c := range []struct {
		catchUp CatchUp
		want    []time.Duration
	}{
		// Down from before the first tick to 10m5s: ticks 1m…10m were due.
		// last runs 9m (the most recent missed: 10m is within Grace and on
		// time), none runs only 10m.
		{CatchUpLast, []time.Duration{9 * time.Minute, 10 * time.Minute}},
		{"", []time.Duration{9 * time.Minute, 10 * time.Minute}},
		{CatchUpNone, []time.Duration{10 * time.Minute}},
	} {
		t.Run(string(c.catchUp), func(t *testing.T) {
			r := newRig(t, start)
			r.create(t, Schedule{Name: "digest", Cron: "@every 1m", CatchUp: c.catchUp})
			l := newLedger()
			r.clk.add(10*time.Minute + 5*time.Second)
			r.runner(l).Pass(context.Background())
			var want []time.Time
			for _, d := range c.want {
				want = append(want, start.Add(d))
			}
			if got, w := l.sortedKeys(), keysOf("digest", want...); !slices.Equal(got, w) {
				t.Errorf("got runs %v, want %v", got, w)
			}
			v, _ := r.st.Get(context.Background(), "acme", "digest")
			if want := start.Add(11 * time.Minute); !v.NextRunAt.Equal(want) {
				t.Errorf("next_run_at: got %v, want %v", v.NextRunAt, want)
			}
		})
	}
}

func TestRefusedRunSaysSoAndKeepsItsPlace(t *testing.T) {
	start := time.Unix(1_800_000_000, 0).UTC()
	r := newRig(t, start)
	r.create(t, Schedule{Name: "sync", Cron: "@every 1m"})
	l := newLedger()
	rn := r.runner(l)
	ctx := context.Background()
	r.clk.add(time.Minute)
	rn.Pass(ctx)
	l.refuse = "backlog full: upstream reports has 100 pending jobs (max_pending 100)"
	r.clk.add(time.Minute)
	rn.Pass(ctx)
	v, _ := r.st.Get(ctx, "acme", "sync")
	if v.LastError != l.refuse || v.LastJobID != "job-1" || !v.LastRunAt.Equal(start.Add(2*time.Minute)) || !v.NextRunAt.Equal(start.Add(3*time.Minute)) {
		t.Errorf("got %+v, want last_error %q, last_job_id job-1, last_run_at %v, next_run_at %v",
			v.State, l.refuse, start.Add(2*time.Minute), start.Add(3*time.Minute))
	}
	l.refuse = ""
	r.clk.add(time.Minute)
	rn.Pass(ctx)
	v, _ = r.st.Get(ctx, "acme", "sync")
	if v.LastError != "" || v.LastJobID != "job-2" {
		t.Errorf("after an accepted run: got %+v, want no last_error and job-2", v.State)
	}
}

// An idle pass costs one command whatever the number of schedules.
func TestIdlePassIsOneCommand(t *testing.T) {
	start := time.Unix(1_800_000_000, 0).UTC()
	r := newRig(t, start)
	for i := range 500 {
		r.create(t, Schedule{Name: fmt.Sprintf("s%d", i), Cron: "0 3 * * *"})
	}
	var n atomic.Int64
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	rdb.AddHook(counter{&n})
	rn := NewRunner(NewStore(rdb, Config{Prefix: "t-" + t.Name(), Now: r.clk.now}), newLedger(), RunnerConfig{})
	rn.Pass(context.Background()) // loads the script
	n.Store(0)
	for range 10 {
		r.clk.add(time.Second)
		rn.Pass(context.Background())
	}
	if got := n.Load(); got != 10 {
		t.Errorf("10 idle passes over 500 schedules sent %d commands, want 10", got)
	}
}

type counter struct{ n *atomic.Int64 }

func (c counter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}
func (c counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// A runner sleeps until the next tick, never longer than its Interval.
func TestPassSaysWhenToLookAgain(t *testing.T) {
	start := time.Unix(1_800_000_000, 0).UTC()
	r := newRig(t, start)
	rn := NewRunner(r.st, newLedger(), RunnerConfig{Interval: 5 * time.Second})
	ctx := context.Background()
	if got := rn.Pass(ctx); got != 5*time.Second {
		t.Errorf("no schedules: got %v, want the interval 5s", got)
	}
	r.create(t, Schedule{Name: "soon", Cron: "@every 3s"})
	r.clk.add(500 * time.Millisecond)
	if got := rn.Pass(ctx); got < 2500*time.Millisecond || got >= 2500*time.Millisecond+wakeJitter {
		t.Errorf("a tick in 2.5s: got %v, want 2.5s and a jitter under %v", got, wakeJitter)
	}
	r.clk.add(2500 * time.Millisecond) // the tick: run it, then wait for the next
	if got := rn.Pass(ctx); got < 3*time.Second || got >= 3*time.Second+wakeJitter {
		t.Errorf("after running a tick: got %v, want 3s to the next", got)
	}
}
