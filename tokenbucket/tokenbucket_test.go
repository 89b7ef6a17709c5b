package tokenbucket

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/gcra"
	"github.com/shaperhq/shaper/internal/script"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

// seq keeps the key spaces of separate limiters apart, also across
// repeated runs (-count) against the same server.
var seq atomic.Int64

// hourly is a bucket whose refill is negligible over a test.
func hourly(capacity int64) Limit { return Limit{Capacity: capacity, Refill: 1, Per: time.Hour} }

func newLimiter(t *testing.T, rdb redis.UniversalClient, l Limit, cfg Config) *Limiter {
	t.Helper()
	cfg.Prefix = fmt.Sprintf("t:%d:%s", seq.Add(1), strings.ReplaceAll(t.Name(), "/", ":"))
	lim, err := New(rdb, l, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return lim
}

func TestAllowSequence(t *testing.T) {
	noLeaks(t)
	clock := newFakeClock()
	lim := newLimiter(t, srv.Client(t), PerSecond(10, 3), Config{Now: clock.Now})
	ctx := context.Background()
	ms := time.Millisecond
	steps := []struct {
		advance time.Duration
		cost    int64
		want    shaper.Result
	}{
		{0, 1, shaper.Result{Allowed: true, Limit: 3, Remaining: 2, ResetAfter: 100 * ms}},
		{0, 2, shaper.Result{Allowed: true, Limit: 3, Remaining: 0, ResetAfter: 300 * ms}},
		{0, 1, shaper.Result{Allowed: false, Limit: 3, Remaining: 0, RetryAfter: 100 * ms, ResetAfter: 300 * ms}},
		{50 * ms, 1, shaper.Result{Allowed: false, Limit: 3, Remaining: 0, RetryAfter: 50 * ms, ResetAfter: 250 * ms}},
		{50 * ms, 1, shaper.Result{Allowed: true, Limit: 3, Remaining: 0, ResetAfter: 300 * ms}},
		{0, 3, shaper.Result{Allowed: false, Limit: 3, Remaining: 0, RetryAfter: 300 * ms, ResetAfter: 300 * ms}},
		{time.Second, 3, shaper.Result{Allowed: true, Limit: 3, Remaining: 0, ResetAfter: 300 * ms}},
	}
	for i, s := range steps {
		clock.Advance(s.advance)
		got, err := lim.Allow(ctx, "k", s.cost)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if got != s.want {
			t.Fatalf("step %d (cost %d): got %+v, want %+v", i, s.cost, got, s.want)
		}
	}
}

func TestReset(t *testing.T) {
	noLeaks(t)
	lim := newLimiter(t, srv.Client(t), hourly(2), Config{})
	ctx := context.Background()
	for i, want := range []bool{true, false, true} {
		if i == 2 {
			if err := lim.Reset(ctx, "k"); err != nil {
				t.Fatal(err)
			}
		}
		res, err := lim.Allow(ctx, "k", 2)
		if err != nil || res.Allowed != want {
			t.Fatalf("call %d: got %v, %v; want allowed=%v", i, res, err, want)
		}
	}
	if err := lim.Reset(ctx, "a{b}"); !errors.Is(err, shaper.ErrInvalid) {
		t.Fatalf("Reset of a bad key: got %v, want ErrInvalid", err)
	}
}

func TestInvalidArguments(t *testing.T) {
	noLeaks(t)
	lim := newLimiter(t, srv.Client(t), PerSecond(1, 5), Config{})
	loc := NewLocal(PerSecond(1, 5), nil)
	for _, tc := range []struct {
		key  string
		cost int64
	}{
		{"", 1}, {"a{b", 1}, {"a}b", 1}, {strings.Repeat("k", 513), 1}, {"k", 0}, {"k", -1}, {"k", 6},
	} {
		for name, l := range map[string]shaper.Limiter{"redis": lim, "local": loc} {
			_, err := l.Allow(context.Background(), tc.key, tc.cost)
			if !errors.Is(err, shaper.ErrInvalid) {
				t.Errorf("%s: Allow(%q, %d): got %v, want an error wrapping ErrInvalid", name, tc.key, tc.cost, err)
			}
		}
	}
	n, err := srv.Client(t).Keys(context.Background(), lim.prefix+"*").Result()
	if err != nil || len(n) != 0 {
		t.Fatalf("got keys %v (%v) after invalid requests, want none", n, err)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	rdb := srv.Client(t)
	if _, err := New(rdb, Limit{}, Config{}); err == nil {
		t.Error("got no error for a zero limit, want one")
	}
	if _, err := New(rdb, PerSecond(1, 1), Config{Prefix: "a{b}:"}); err == nil {
		t.Error("got no error for a prefix with a hash tag, want one")
	}
}

// burst sends callers requests for one fresh key at once and returns how
// many were allowed. The requests come through separate clients, each with
// its own limiter; all wait on one start signal.
func burst(t *testing.T, rdb []redis.UniversalClient, capacity int64, callers int, cfg Config) int {
	t.Helper()
	key := fmt.Sprintf("burst-%d", rand.Int64())
	lims := make([]*Limiter, len(rdb))
	cfg.Prefix = fmt.Sprintf("t:%d:burst", seq.Add(1))
	for i, c := range rdb {
		var err error
		if lims[i], err = New(c, hourly(capacity), cfg); err != nil {
			t.Fatal(err)
		}
		if err := allowScript.Load(context.Background(), c).Err(); err != nil {
			t.Fatal(err)
		}
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	allowed := 0
	for i := 0; i < callers; i++ {
		lim := lims[i%len(lims)]
		wg.Go(func() {
			<-start
			res, err := lim.Allow(context.Background(), key, 1)
			if err != nil {
				t.Error(err)
				return
			}
			if res.Allowed {
				mu.Lock()
				allowed++
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	return allowed
}

// TestBurstExact is the design's own check inside one test process: a burst
// over three separate clients admits exactly the capacity, with decisions
// coalesced and one by one.
func TestBurstExact(t *testing.T) {
	noLeaks(t)
	clients := []redis.UniversalClient{srv.Client(t), srv.Client(t), srv.Client(t)}
	for _, tc := range []struct {
		capacity int64
		callers  int
	}{{10, 20}, {100, 1000}} {
		for _, batch := range []int{0, 1} {
			t.Run(fmt.Sprintf("capacity%d/callers%d/maxbatch%d", tc.capacity, tc.callers, batch), func(t *testing.T) {
				got := burst(t, clients, tc.capacity, tc.callers, Config{MaxBatch: batch})
				if got != int(tc.capacity) {
					t.Fatalf("got %d allowed of %d, want exactly %d", got, tc.callers, tc.capacity)
				}
			})
		}
	}
}

// TestBurstAcrossProcesses is the design's own check as it happens in
// production: separate OS processes (this test binary re-executed), each
// with its own client and limiter, released at the same moment.
func TestBurstAcrossProcesses(t *testing.T) {
	noLeaks(t)
	const procs = 4
	for _, tc := range []struct {
		capacity int64
		callers  int
	}{{10, 20}, {100, 1000}} {
		for _, batch := range []int{0, 1} {
			t.Run(fmt.Sprintf("capacity%d/callers%d/maxbatch%d", tc.capacity, tc.callers, batch), func(t *testing.T) {
				key := fmt.Sprintf("procs-%d", rand.Int64())
				type child struct {
					cmd   *exec.Cmd
					stdin io.WriteCloser
					out   *bufio.Reader
				}
				var children []child
				for p := 0; p < procs; p++ {
					n := tc.callers / procs
					if p < tc.callers%procs {
						n++
					}
					cmd := exec.Command(os.Args[0], "-test.run=^$")
					cmd.Env = append(os.Environ(),
						childEnv+"="+srv.Addr,
						childEnv+"_KEY="+key,
						childEnv+"_CAPACITY="+strconv.FormatInt(tc.capacity, 10),
						childEnv+"_CALLERS="+strconv.Itoa(n),
						childEnv+"_BATCH="+strconv.Itoa(batch),
					)
					cmd.Stderr = os.Stderr
					stdin, err := cmd.StdinPipe()
					if err != nil {
						t.Fatal(err)
					}
					stdout, err := cmd.StdoutPipe()
					if err != nil {
						t.Fatal(err)
					}
					if err := cmd.Start(); err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
					children = append(children, child{cmd, stdin, bufio.NewReader(stdout)})
				}
				for i, c := range children {
					if line, err := c.out.ReadString('\n'); err != nil || line != "ready\n" {
						t.Fatalf("child %d: got %q (%v), want ready", i, line, err)
					}
				}
				for _, c := range children {
					io.WriteString(c.stdin, "go\n")
				}
				total := 0
				for i, c := range children {
					line, err := c.out.ReadString('\n')
					var n int
					if _, serr := fmt.Sscanf(line, "allowed %d", &n); err != nil || serr != nil {
						t.Fatalf("child %d: got %q (%v), want its allowed count", i, line, err)
					}
					if err := c.cmd.Wait(); err != nil {
						t.Fatalf("child %d: %v", i, err)
					}
					total += n
				}
				if total != int(tc.capacity) {
					t.Fatalf("got %d allowed of %d across %d processes, want exactly %d", total, tc.callers, procs, tc.capacity)
				}
			})
		}
	}
}

// op is one step of a random sequence: at the same instant, a batch of
// requests decided together.
type op struct {
	advance time.Duration
	reqs    []request
}

func randomOps(r *rand.Rand, l Limit, n int) []op {
	span := l.Window()
	keys := []string{"a", "b", "c", "d", "e"}
	ops := make([]op, n)
	for i := range ops {
		switch r.IntN(4) {
		case 0:
		case 1:
			ops[i].advance = time.Duration(r.Int64N(int64(l.Per)/l.Refill*2 + 1))
		case 2:
			ops[i].advance = time.Duration(r.Int64N(int64(span) + 1))
		default:
			ops[i].advance = time.Duration(r.Int64N(int64(time.Second)))
		}
		batch := 1
		if r.IntN(3) == 0 {
			batch = 1 + r.IntN(8)
		}
		// Some batches cost 1 a request throughout, which the script is
		// sent in a shorter form.
		units := r.IntN(3) == 0
		for j := 0; j < batch; j++ {
			cost := int64(1)
			if !units {
				cost += r.Int64N(l.Capacity)
			}
			ops[i].reqs = append(ops[i].reqs, request{key: keys[r.IntN(len(keys))], cost: cost})
		}
	}
	return ops
}

// checkAgainstModel plays random sequences through the Redis script (in
// batches, as coalescing sends them) and through Local, and requires
// identical results.
func checkAgainstModel(t *testing.T, rdb redis.UniversalClient, rounds, steps int) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(uint64(seed), 0))
	for round := 0; round < rounds; round++ {
		// Intervals of at least a minute: the keys' real TTLs must outlast
		// the test, since Redis expires them by its own clock.
		l := Limit{Capacity: 1 + r.Int64N(20), Refill: 1 + r.Int64N(60), Per: time.Hour * time.Duration(1+r.IntN(3))}
		clock := newFakeClock()
		lim := newLimiter(t, rdb, l, Config{Now: clock.Now})
		loc := NewLocal(l, clock.Now)
		for i, o := range randomOps(r, l, steps) {
			clock.Advance(o.advance)
			calls := make([]*script.Call[request, shaper.Result], len(o.reqs))
			for j, q := range o.reqs {
				calls[j] = &script.Call[request, shaper.Result]{Req: request{key: lim.key(q.key), cost: q.cost}}
			}
			lim.run(context.Background(), calls)
			for j, q := range o.reqs {
				want, err := loc.Allow(context.Background(), q.key, q.cost)
				if err != nil {
					t.Fatal(err)
				}
				if calls[j].Err != nil {
					t.Fatalf("round %d (%v) step %d request %d: %v", round, l, i, j, calls[j].Err)
				}
				if got := calls[j].Res; got != want {
					t.Fatalf("round %d (%v) step %d request %d (%s, cost %d): got %+v from Redis, want %+v from the model",
						round, l, i, j, q.key, q.cost, got, want)
				}
			}
		}
	}
}

func TestMatchesModel(t *testing.T) {
	noLeaks(t)
	checkAgainstModel(t, srv.Client(t), 20, 200)
}

// TestBatchTouchesEachBucketOnce: a batch with a hot key among others
// reads every bucket in one MGET and writes each at most once, and still
// decides every request as the model does, in order within each bucket.
func TestBatchTouchesEachBucketOnce(t *testing.T) {
	noLeaks(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	clock := newFakeClock()
	l := hourly(10)
	lim := newLimiter(t, rdb, l, Config{Now: clock.Now})
	loc := NewLocal(l, clock.Now)
	// 30 requests: "hot" every other one (costs 1, 2, 3, ... so it runs
	// out part-way), "warm" every third, "cold" once and denied at its
	// second: it costs more than is left.
	var reqs []request
	for i := 0; i < 30; i++ {
		switch {
		case i%2 == 0:
			reqs = append(reqs, request{key: "hot", cost: 1 + int64(i/2)%4})
		case i%3 == 0:
			reqs = append(reqs, request{key: "warm", cost: 1})
		case i == 1:
			reqs = append(reqs, request{key: "cold", cost: 7})
		default:
			reqs = append(reqs, request{key: "cold", cost: 5})
		}
	}
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	calls := make([]*script.Call[request, shaper.Result], len(reqs))
	for i, q := range reqs {
		calls[i] = &script.Call[request, shaper.Result]{Req: request{key: lim.key(q.key), cost: q.cost}}
	}
	lim.run(ctx, calls)
	for i, q := range reqs {
		want, err := loc.Allow(ctx, q.key, q.cost)
		if err != nil {
			t.Fatal(err)
		}
		if calls[i].Err != nil || calls[i].Res != want {
			t.Fatalf("request %d (%s, cost %d): got %+v, %v; want %+v", i, q.key, q.cost, calls[i].Res, calls[i].Err, want)
		}
	}
	stats, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for cmd, want := range map[string]int{"mget": 1, "set": 3, "get": 0} {
		got := 0
		for _, line := range strings.Split(stats, "\n") {
			if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
				got, _ = strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			}
		}
		if got != want {
			t.Errorf("%s calls in the batch: got %d, want %d", strings.ToUpper(cmd), got, want)
		}
	}
	// The written buckets hold what the model holds, as plain integers of
	// sixteen digits, and the next request on each agrees too.
	for _, k := range []string{"hot", "warm", "cold"} {
		raw, err := rdb.Get(ctx, lim.key(k)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if tat, err := strconv.ParseInt(raw, 10, 64); err != nil || tat != loc.tats[k] {
			t.Fatalf("bucket %s holds %q, want the model's TAT %d", k, raw, loc.tats[k])
		}
	}
	for _, k := range []string{"hot", "warm", "cold"} {
		got, err := lim.Allow(ctx, k, 1)
		want, _ := loc.Allow(ctx, k, 1)
		if err != nil || got != want {
			t.Fatalf("after the batch, Allow(%s): got %+v, %v; want %+v", k, got, err, want)
		}
	}
}

// TestPlainBucketsMatchModel: buckets with one request of cost 1 in a
// batch (the script's short way, nearly every bucket over a large key
// space) are decided as the model decides them whatever state they are
// in: absent, full again, part spent, with one token left, empty; and written as the model
// writes them, each with its TTL, while an empty one is left alone.
func TestPlainBucketsMatchModel(t *testing.T) {
	noLeaks(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	clock := newFakeClock()
	l := hourly(3)
	lim := newLimiter(t, rdb, l, Config{Now: clock.Now})
	loc := NewLocal(l, clock.Now)
	take := func(key string, cost int64) {
		t.Helper()
		got, err := lim.Allow(ctx, key, cost)
		want, _ := loc.Allow(ctx, key, cost)
		if err != nil || got != want || !got.Allowed {
			t.Fatalf("setting up %s: got %+v, %v; want %+v, allowed", key, got, err, want)
		}
	}
	take("refilled", 1)
	take("half", 1)
	clock.Advance(90 * time.Minute) // "refilled" is full again, its key still there
	take("half", 1)
	take("empty", 3)
	take("last", 2) // one token left
	keys := []string{"absent", "refilled", "half", "empty", "last", "absent2", "hot", "hot"}
	calls := make([]*script.Call[request, shaper.Result], len(keys))
	for i, k := range keys {
		calls[i] = &script.Call[request, shaper.Result]{Req: request{key: lim.key(k), cost: 1}}
	}
	if invs, _ := lim.plan(calls, ""); len(invs[0].Args) != 4 {
		t.Fatalf("plan: got ARGV %v, want the shape, the clock and one entry (the bucket with two requests)", invs[0].Args)
	}
	before, err := rdb.Get(ctx, lim.key("empty")).Result()
	if err != nil {
		t.Fatal(err)
	}
	lim.run(ctx, calls)
	for i, k := range keys {
		want, _ := loc.Allow(ctx, k, 1)
		if calls[i].Err != nil || calls[i].Res != want {
			t.Fatalf("request %d (%s): got %+v, %v; want %+v", i, k, calls[i].Res, calls[i].Err, want)
		}
	}
	if calls[3].Res.Allowed {
		t.Fatalf("empty bucket: got allowed, want denied")
	}
	p := l.params()
	for _, k := range []string{"absent", "refilled", "half", "empty", "last", "absent2", "hot"} {
		raw, err := rdb.Get(ctx, lim.key(k)).Result()
		if err != nil {
			t.Fatalf("bucket %s: %v", k, err)
		}
		if tat, err := strconv.ParseInt(raw, 10, 64); err != nil || tat != loc.tats[k] {
			t.Fatalf("bucket %s holds %q, want the model's TAT %d", k, raw, loc.tats[k])
		}
		ttl, err := rdb.PTTL(ctx, lim.key(k)).Result()
		level := loc.tats[k] - clock.Now().UnixMicro()
		if err != nil || ttl <= 0 || ttl.Milliseconds() > gcra.CeilDiv(level+p.Interval, 1000) {
			t.Fatalf("bucket %s: PTTL %v, %v; want in (0, %dms]", k, ttl, err, gcra.CeilDiv(level+p.Interval, 1000))
		}
	}
	if after, _ := rdb.Get(ctx, lim.key("empty")).Result(); after != before {
		t.Fatalf("denied bucket: holds %q after, %q before; a denial writes nothing", after, before)
	}
}

// TestBatchOfManyBuckets: a batch naming more buckets than one script call
// takes (MaxBatch is the user's to raise) is split, and decided in full.
func TestBatchOfManyBuckets(t *testing.T) {
	noLeaks(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	lim := newLimiter(t, rdb, hourly(1), Config{})
	n := 2*maxScriptKeys + 500
	calls := make([]*script.Call[request, shaper.Result], 2*n)
	for i := range calls {
		// Every bucket twice: allowed, then denied.
		calls[i] = &script.Call[request, shaper.Result]{Req: request{key: lim.key(strconv.Itoa(i % n)), cost: 1}}
	}
	if invs, _ := lim.plan(calls, ""); len(invs) != 3 {
		t.Fatalf("got %d script calls for %d buckets, want 3", len(invs), n)
	}
	lim.run(ctx, calls)
	for i, c := range calls {
		if c.Err != nil || c.Res.Allowed != (i < n) {
			t.Fatalf("call %d of %d: got %+v, %v; want allowed=%v", i, len(calls), c.Res, c.Err, i < n)
		}
	}
}

// TestEveryKeyHasTTL checks after each kind of decision that every key the
// limiter wrote expires, no later than the bucket's full span plus one
// interval (rounded up to milliseconds).
func TestEveryKeyHasTTL(t *testing.T) {
	noLeaks(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	// Intervals of a second or more: a key's TTL must outlast the check.
	for _, l := range []Limit{PerSecond(1, 5), PerMinute(30, 3), {Capacity: 2, Refill: 1, Per: time.Hour}} {
		for _, batch := range []int{0, 1} {
			lim := newLimiter(t, rdb, l, Config{MaxBatch: batch})
			p := l.params()
			bound := gcra.CeilDiv(p.Span()+p.Interval, 1000)
			check := func(what string) {
				t.Helper()
				keys, err := rdb.Keys(ctx, lim.prefix+"*").Result()
				if err != nil {
					t.Fatal(err)
				}
				if len(keys) == 0 {
					t.Fatalf("%v after %s: got no keys, want some", l, what)
				}
				for _, k := range keys {
					ttl, err := rdb.PTTL(ctx, k).Result()
					if err != nil {
						t.Fatal(err)
					}
					if ttl <= 0 || ttl.Milliseconds() > bound {
						t.Fatalf("%v after %s: key %s has PTTL %v, want in (0, %dms]", l, what, k, ttl, bound)
					}
				}
			}
			mustAllow := func(key string, cost int64, want bool) {
				t.Helper()
				res, err := lim.Allow(ctx, key, cost)
				if err != nil {
					t.Fatal(err)
				}
				if res.Allowed != want {
					t.Fatalf("%v: Allow(%s, %d) got %v, want allowed=%v", l, key, cost, res, want)
				}
			}
			mustAllow("new", 1, true)
			check("allowing a new key")
			mustAllow("new", 1, true)
			check("allowing an existing key")
			mustAllow("full", l.Capacity, true)
			mustAllow("full", l.Capacity, false)
			check("denying")
			var wg sync.WaitGroup
			for i := 0; i < 50; i++ {
				wg.Go(func() { lim.Allow(ctx, fmt.Sprintf("many%d", i%7), 1) })
			}
			wg.Wait()
			check("coalesced decisions")
		}
	}
}

func TestLocalForgetsFullBuckets(t *testing.T) {
	clock := newFakeClock()
	loc := NewLocal(PerSecond(10, 10), clock.Now)
	ctx := context.Background()
	for i := 0; i < 5000; i++ {
		if _, err := loc.Allow(ctx, strconv.Itoa(i), 1); err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Millisecond)
	}
	// Keys older than a full refill (100ms here) are gone at each sweep;
	// a sweep happens at the latest when the table doubles.
	if n := loc.Len(); n > 2*minSweep {
		t.Fatalf("got %d keys remembered, want at most %d", n, 2*minSweep)
	}
	if _, err := NewLocal(Limit{}, nil).Allow(ctx, "k", 1); err == nil {
		t.Fatal("got no error from a Local with an invalid limit, want one")
	}
}

// TestScriptCacheFlushed: a node that lost its script cache (restart,
// failover) answers NOSCRIPT; single and pipelined batches both recover.
func TestScriptCacheFlushed(t *testing.T) {
	noLeaks(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	lim := newLimiter(t, rdb, hourly(5), Config{})
	for _, n := range []int{1, 3} {
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		calls := make([]*script.Call[request, shaper.Result], n)
		for i := range calls {
			calls[i] = &script.Call[request, shaper.Result]{Req: request{key: lim.key(fmt.Sprintf("k%d", n)), cost: 1}}
		}
		lim.run(ctx, calls)
		for i, c := range calls {
			if c.Err != nil || !c.Res.Allowed {
				t.Fatalf("batch of %d after SCRIPT FLUSH, call %d: got %v, %v; want allowed", n, i, c.Res, c.Err)
			}
		}
	}
}

// TestCluster runs on a real 3-master Redis Cluster: exact bursts on a hot
// key, coalesced decisions over keys on every node (grouped by slot, with
// no CROSSSLOT error), agreement with the model, and NOSCRIPT recovery.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-master Redis Cluster takes seconds to start: runs in make test")
	}
	noLeaks(t)
	cl := redistest.NewCluster(t)
	cc := cl.Client(t)
	ctx := context.Background()

	clients := []redis.UniversalClient{cc, cl.Client(t), cl.Client(t)}
	if got := burst(t, clients, 100, 1000, Config{}); got != 100 {
		t.Fatalf("cluster burst: got %d allowed, want exactly 100", got)
	}

	lim := newLimiter(t, cc, hourly(1000), Config{})
	var wg sync.WaitGroup
	for i := 0; i < 64; i++ {
		wg.Go(func() {
			for j := 0; j < 20; j++ {
				if _, err := lim.Allow(ctx, fmt.Sprintf("key%d", (i*20+j)%300), 1); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	perNode := map[string]int64{}
	var mu sync.Mutex
	err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		keys, err := m.Keys(ctx, lim.prefix+"*").Result()
		mu.Lock()
		perNode[m.Options().Addr] = int64(len(keys))
		mu.Unlock()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for addr, n := range perNode {
		if n == 0 {
			t.Fatalf("got key counts per node %v, want keys on every node (%s has none)", perNode, addr)
		}
	}

	checkAgainstModel(t, cc, 3, 100)

	if err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		return m.ScriptFlush(ctx).Err()
	}); err != nil {
		t.Fatal(err)
	}
	// Distinct keys that share a slot go into one script call; the rest
	// are spread over the nodes.
	keys := []string{"flushed", ""}
	for i := 0; keys[1] == ""; i++ {
		if k := fmt.Sprintf("same-slot-%d", i); script.Slot(lim.key(k)) == script.Slot(lim.key(keys[0])) {
			keys[1] = k
		}
	}
	for i := 0; i < 20; i++ {
		keys = append(keys, fmt.Sprintf("flushed%d", i))
	}
	calls := make([]*script.Call[request, shaper.Result], len(keys))
	for i, k := range keys {
		calls[i] = &script.Call[request, shaper.Result]{Req: request{key: lim.key(k), cost: 1}}
	}
	if invs, _ := lim.plan(calls, ""); len(invs) >= len(calls) || len(invs[0].Keys) != 2 {
		t.Fatalf("got %d script calls for %d requests, first of %d keys; want the two same-slot keys together", len(invs), len(calls), len(invs[0].Keys))
	}
	lim.run(ctx, calls)
	for i, c := range calls {
		if c.Err != nil || !c.Res.Allowed {
			t.Fatalf("cluster after SCRIPT FLUSH, call %d: got %v, %v; want allowed", i, c.Res, c.Err)
		}
	}
}

// TestFailurePolicies stops Redis and checks that shaper.Fallible around the
// limiter applies each policy, logs at ERROR and reports the failure, and
// that invalid arguments still come back as errors under every policy.
func TestFailurePolicies(t *testing.T) {
	noLeaks(t)
	dead := redistest.New(t)
	rdb := clientFor(t, dead.Addr)
	lim := newLimiter(t, rdb, hourly(2), Config{})
	if err := dead.Kill(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		policy shaper.OnRedisError
		want   []bool
	}{
		{shaper.FailOpen, []bool{true, true, true}},
		{shaper.FailClosed, []bool{false, false, false}},
		{shaper.FailLocal, []bool{true, true, false}},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			var logs bytes.Buffer
			var observed []shaper.OnRedisError
			f := &shaper.Fallible{
				Limiter: lim,
				Policy:  tc.policy,
				Local:   NewLocal(hourly(2), nil),
				Name:    "admission",
				Logger:  slog.New(slog.NewTextHandler(&logs, nil)),
				Observe: func(p shaper.OnRedisError, err error) { observed = append(observed, p) },
			}
			for i, want := range tc.want {
				res, err := f.Allow(ctx, "k", 1)
				if err != nil {
					t.Fatalf("call %d: got error %v, want a decision by policy", i, err)
				}
				if res.Allowed != want {
					t.Fatalf("call %d: got %v, want allowed=%v", i, res, want)
				}
				if !want && res.RetryAfter <= 0 {
					t.Fatalf("call %d: got %v, want a positive RetryAfter on denial", i, res)
				}
			}
			if len(observed) != len(tc.want) || observed[0] != tc.policy {
				t.Fatalf("got Observe calls %v, want %d with %v", observed, len(tc.want), tc.policy)
			}
			if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "policy="+tc.policy.String()) {
				t.Fatalf("got log %q, want an ERROR record naming the policy", logs.String())
			}
			if _, err := f.Allow(ctx, "k", 3); !errors.Is(err, shaper.ErrInvalid) {
				t.Fatalf("cost above capacity under %v: got %v, want ErrInvalid", tc.policy, err)
			}
		})
	}
}

func TestLimitValidateAndString(t *testing.T) {
	for _, tc := range []struct {
		l       Limit
		str     string
		wantErr string
	}{
		{PerSecond(10, 100), "10/s refill, capacity 100", ""},
		{PerMinute(5, 5), "5/m refill, capacity 5", ""},
		{Limit{Capacity: 1, Refill: 1, Per: time.Hour}, "1/h refill, capacity 1", ""},
		{Limit{Capacity: 3, Refill: 2, Per: 1500 * time.Millisecond}, "2/1.5s refill, capacity 3", ""},
		{Limit{Capacity: 0, Refill: 1, Per: time.Second}, "", "capacity 0"},
		{Limit{Capacity: 1, Refill: 0, Per: time.Second}, "", "refill 0"},
		{Limit{Capacity: 1, Refill: 1, Per: time.Microsecond}, "", "per 1µs"},
		{Limit{Capacity: 1, Refill: 1, Per: 400 * 24 * time.Hour}, "", "at most a year"},
		{Limit{Capacity: 1, Refill: 2000, Per: time.Millisecond}, "", "more than one token per microsecond"},
		{Limit{Capacity: 1 << 40, Refill: 1, Per: time.Hour}, "", "too large"},
	} {
		err := tc.l.Validate()
		if tc.wantErr == "" {
			if err != nil {
				t.Errorf("%+v: got %v, want valid", tc.l, err)
			}
			if got := tc.l.String(); got != tc.str {
				t.Errorf("%+v: String got %q, want %q", tc.l, got, tc.str)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%+v: got %v, want an error containing %q", tc.l, err, tc.wantErr)
		}
	}
	if got, want := PerSecond(10, 100).Window(), 10*time.Second; got != want {
		t.Errorf("Window: got %v, want %v", got, want)
	}
}
