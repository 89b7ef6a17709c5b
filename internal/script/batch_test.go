package script

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

var srv *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &srv) }

func noLeaks(t *testing.T) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
}

// gate is a batch function that records batch sizes. With started set,
// each batch announces itself and waits for a token on release.
type gate struct {
	mu      sync.Mutex
	sizes   []int
	started chan struct{}
	release chan struct{}
}

func (g *gate) run(ctx context.Context, calls []*Call[int, int]) {
	g.mu.Lock()
	g.sizes = append(g.sizes, len(calls))
	g.mu.Unlock()
	if g.started != nil {
		g.started <- struct{}{}
		<-g.release
	}
	for _, c := range calls {
		c.Res = c.Req * 2
	}
}

func (b *Batcher[Q, R]) pendingLen() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, c := range b.pending {
		if c.state == waiting {
			n++
		}
	}
	return n
}

// waitPending blocks until n callers are queued. It polls a condition that
// must become true, so it asserts nothing about time.
func waitPending[Q, R any](b *Batcher[Q, R], n int) {
	for b.pendingLen() < n {
		runtime.Gosched()
	}
}

func TestLoneCallerRunsAlone(t *testing.T) {
	noLeaks(t)
	g := &gate{}
	b := NewBatcher(BatchOptions{}, g.run)
	for i := 1; i <= 3; i++ {
		got, err := b.Do(context.Background(), i)
		if err != nil || got != 2*i {
			t.Fatalf("Do(%d): got %d, %v; want %d", i, got, err, 2*i)
		}
	}
	if fmt.Sprint(g.sizes) != "[1 1 1]" {
		t.Fatalf("got batch sizes %v, want [1 1 1]: a lone caller must never wait for company", g.sizes)
	}
}

// TestLoneCallerRunsOnItsOwnContext: a caller who finds nobody waiting
// runs its batch on its own context, so its cancellation reaches the round
// trip.
func TestLoneCallerRunsOnItsOwnContext(t *testing.T) {
	noLeaks(t)
	type key struct{}
	var cancelled []bool
	b := NewBatcher(BatchOptions{MaxInFlight: 1}, func(ctx context.Context, calls []*Call[int, int]) {
		if calls[0].Req == 1 {
			cancel := ctx.Value(key{}).(context.CancelFunc)
			cancel()
		}
		cancelled = append(cancelled, ctx.Err() != nil)
		for _, c := range calls {
			c.Res = c.Req
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ctx = context.WithValue(ctx, key{}, cancel)
	if got, err := b.Do(ctx, 1); err != nil || got != 1 {
		t.Fatalf("Do: got %d, %v; want 1", got, err)
	}
	if len(cancelled) != 1 || !cancelled[0] {
		t.Fatalf("lone caller's batch saw its cancellation: %v, want [true]", cancelled)
	}
	if b.inFlight != 0 || len(b.pending) != 0 {
		t.Fatalf("after a lone call: %d in flight, %d pending; want none", b.inFlight, len(b.pending))
	}
}

func TestWaitingCallersShareOneBatch(t *testing.T) {
	noLeaks(t)
	g := &gate{started: make(chan struct{}, 16), release: make(chan struct{})}
	b := NewBatcher(BatchOptions{MaxInFlight: 1, MaxBatch: 4}, g.run)
	var wg sync.WaitGroup
	results := make([]int, 10)
	do := func(i int) {
		wg.Go(func() {
			r, err := b.Do(context.Background(), i)
			if err != nil {
				t.Error(err)
			}
			results[i] = r
		})
	}
	do(0)
	<-g.started // the first caller leads alone and holds the only slot
	for i := 1; i < 10; i++ {
		do(i)
	}
	waitPending(b, 9)
	for i := 0; i < 3; i++ {
		g.release <- struct{}{}
		<-g.started
	}
	g.release <- struct{}{}
	wg.Wait()
	if fmt.Sprint(g.sizes) != "[1 4 4 1]" {
		t.Fatalf("got batch sizes %v, want [1 4 4 1]", g.sizes)
	}
	for i, r := range results {
		if r != 2*i {
			t.Fatalf("caller %d got %d, want %d", i, r, 2*i)
		}
	}
}

// TestWaitSentGivesTheResultToACallerWhoLeft: with WaitSent, a caller
// whose context ends while its call is in a running batch gets that
// batch's result (so it can undo what the call did), not ctx.Err().
func TestWaitSentGivesTheResultToACallerWhoLeft(t *testing.T) {
	noLeaks(t)
	for _, wait := range []bool{false, true} {
		g := &gate{started: make(chan struct{}, 16), release: make(chan struct{})}
		b := NewBatcher(BatchOptions{MaxInFlight: 1, WaitSent: wait}, g.run)
		var wg sync.WaitGroup
		wg.Go(func() { b.Do(context.Background(), 1) })
		<-g.started // the first caller leads alone
		ctx, cancel := context.WithCancel(context.Background())
		type out struct {
			r   int
			err error
		}
		outc := make(chan out, 1)
		wg.Go(func() { b.Do(context.Background(), 3) }) // leads the next batch
		waitPending(b, 1)
		go func() { r, err := b.Do(ctx, 2); outc <- out{r, err} }()
		waitPending(b, 2)
		g.release <- struct{}{}
		<-g.started // calls 3 and 2 are now in one running batch, 3 leading
		cancel()
		if !wait {
			if o := <-outc; !errors.Is(o.err, context.Canceled) {
				t.Fatalf("without WaitSent: got %v, %v, want context.Canceled at once", o.r, o.err)
			}
			g.release <- struct{}{}
		} else {
			select {
			case o := <-outc:
				t.Fatalf("with WaitSent: the caller who left got %v, %v before its batch ended", o.r, o.err)
			case <-time.After(20 * time.Millisecond):
			}
			g.release <- struct{}{}
			if o := <-outc; o.err != nil || o.r != 4 {
				t.Fatalf("with WaitSent: got %v, %v, want the batch's result 4", o.r, o.err)
			}
		}
		wg.Wait()
	}
}

func TestCancelledWaiterIsSkipped(t *testing.T) {
	noLeaks(t)
	g := &gate{started: make(chan struct{}, 16), release: make(chan struct{})}
	b := NewBatcher(BatchOptions{MaxInFlight: 1}, g.run)
	var wg sync.WaitGroup
	wg.Go(func() { b.Do(context.Background(), 1) })
	<-g.started
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := b.Do(ctx, 2); errc <- err }()
	waitPending(b, 1)
	var third int
	wg.Go(func() { third, _ = b.Do(context.Background(), 3) })
	waitPending(b, 2)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: got %v, want context.Canceled", err)
	}
	g.release <- struct{}{}
	<-g.started
	g.release <- struct{}{}
	wg.Wait()
	if fmt.Sprint(g.sizes) != "[1 1]" || third != 6 {
		t.Fatalf("got batch sizes %v and third result %d, want [1 1] and 6: the cancelled call must not run", g.sizes, third)
	}
}

func TestPanickingBatchReleasesWaiters(t *testing.T) {
	noLeaks(t)
	started := make(chan struct{})
	release := make(chan struct{})
	b := NewBatcher(BatchOptions{MaxInFlight: 1}, func(ctx context.Context, calls []*Call[int, int]) {
		if calls[0].Req == 1 {
			close(started)
			<-release
			panic("boom")
		}
		for _, c := range calls {
			c.Res = c.Req
		}
	})
	panicked := make(chan any, 1)
	go func() {
		defer func() { panicked <- recover() }()
		b.Do(context.Background(), 1)
	}()
	<-started
	errc := make(chan error, 1)
	go func() { _, err := b.Do(context.Background(), 2); errc <- err }()
	waitPending(b, 1)
	// Caller 2 is queued behind the batch that will panic, so it leads the
	// next batch and must succeed; a caller taken into the panicking batch
	// would get ErrBatchPanicked instead.
	close(release)
	if p := <-panicked; p != "boom" {
		t.Fatalf("got panic %v, want boom in the leader's goroutine", p)
	}
	if err := <-errc; err != nil {
		t.Fatalf("waiter after a panicked batch: got %v, want its own batch to run", err)
	}
	if got, err := b.Do(context.Background(), 5); err != nil || got != 5 {
		t.Fatalf("after a panic: got %d, %v; want 5", got, err)
	}
}

func TestSlot(t *testing.T) {
	for _, tc := range []struct {
		key  string
		want uint16
	}{
		{"123456789", 12739}, // CRC16/XMODEM check value 0x31C3
		{"foo", 12182},
		{"{user1000}.following", 3443},
		{"x{user1000}y", 3443},
		{"{}user1000", Slot("{}user1000")},
		{"", 0},
	} {
		if got := Slot(tc.key); got != tc.want {
			t.Errorf("Slot(%q): got %d, want %d", tc.key, got, tc.want)
		}
	}
	if Slot("a{}b") == Slot("") {
		t.Error(`Slot("a{}b") hashed the empty tag, want the whole key hashed`)
	}
}

func TestRunPipelinedAfterScriptFlush(t *testing.T) {
	noLeaks(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	s := New(`return redis.call('INCRBY', KEYS[1], ARGV[1])`)
	run := time.Now().UnixNano() // fresh keys on every -count
	a, b := fmt.Sprintf("p:%d:a", run), fmt.Sprintf("p:%d:b", run)
	for round := 0; round < 2; round++ {
		if round == 0 {
			if err := rdb.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		invs := []Invocation{{Keys: []string{a}, Args: []any{1}}, {Keys: []string{b}, Args: []any{2}}, {Keys: []string{a}, Args: []any{3}}}
		vals, errs := RunPipelined(ctx, rdb, "incr", s, invs)
		want := []int64{1, 2, 4}
		if round == 1 {
			want = []int64{5, 4, 8}
		}
		for i := range invs {
			if errs[i] != nil || vals[i] != want[i] {
				t.Fatalf("round %d invocation %d: got %v, %v; want %d", round, i, vals[i], errs[i], want[i])
			}
		}
	}
	exists, err := rdb.ScriptExists(ctx, s.Hash()).Result()
	if err != nil || !exists[0] {
		t.Fatalf("got script cached %v (%v) after NOSCRIPT recovery, want it loaded", exists, err)
	}
	bad := New(`return redis.call('NOSUCHCOMMAND')`)
	_, errs := RunPipelined(ctx, rdb, "bad", bad, []Invocation{{Keys: []string{"p:c"}}})
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "script bad") {
		t.Fatalf("got %v, want an error naming the script", errs[0])
	}
}

func TestShardingOf(t *testing.T) {
	rdb := srv.Client(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": srv.Addr}})
	defer ring.Close()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr}})
	defer cc.Close()
	for _, tc := range []struct {
		rdb  redis.UniversalClient
		want Sharding
	}{{rdb, OneNode}, {cc, BySlot}, {ring, ByKey}} {
		if got := ShardingOf(tc.rdb); got != tc.want {
			t.Errorf("ShardingOf(%T): got %v, want %v", tc.rdb, got, tc.want)
		}
	}
}

// TestBatchKeepsTheLatestDeadline: the batch runs detached from the
// leader's cancellation, but not from every deadline: it gets the latest of
// its callers' (so a hung Redis cannot hold the leader past them), and
// none when any caller has none.
func TestBatchKeepsTheLatestDeadline(t *testing.T) {
	noLeaks(t)
	var got []time.Time
	b := NewBatcher(BatchOptions{}, func(ctx context.Context, calls []*Call[int, int]) {
		dl, _ := ctx.Deadline()
		got = append(got, dl)
	})
	soon := time.Now().Add(time.Hour)
	ctx, cancel := context.WithDeadline(context.Background(), soon)
	defer cancel()
	b.Do(ctx, 1)
	b.Do(context.Background(), 2)
	if len(got) != 2 || !got[0].Equal(soon) || !got[1].IsZero() {
		t.Fatalf("batch deadlines %v, want [%v, none]", got, soon)
	}

	calls := []*Call[int, int]{{deadline: soon}, {deadline: soon.Add(time.Minute)}}
	if dl, ok := latestDeadline(calls); !ok || !dl.Equal(soon.Add(time.Minute)) {
		t.Errorf("latestDeadline: got %v, %v; want %v, true", dl, ok, soon.Add(time.Minute))
	}
	calls = append(calls, &Call[int, int]{})
	if _, ok := latestDeadline(calls); ok {
		t.Error("latestDeadline with a caller without one: got ok, want none")
	}
}

// heldBatches is a batch function that holds every batch until the test
// releases it by name (its first request), so that several batches can
// run at once and end in the order the test chooses.
type heldBatches struct {
	mu       sync.Mutex
	sizes    []int
	release  map[int]chan struct{}
	started  chan []int
	finished chan int
}

func newHeldBatches() *heldBatches {
	return &heldBatches{release: map[int]chan struct{}{}, started: make(chan []int, 64), finished: make(chan int, 64)}
}

func (h *heldBatches) run(ctx context.Context, calls []*Call[int, int]) {
	reqs := make([]int, len(calls))
	for i, c := range calls {
		reqs[i] = c.Req
		c.Res = c.Req * 2
	}
	release := make(chan struct{})
	h.mu.Lock()
	h.sizes = append(h.sizes, len(calls))
	h.release[reqs[0]] = release
	h.mu.Unlock()
	h.started <- reqs
	<-release
	h.finished <- reqs[0]
}

// end releases the batch led by first and waits until it has returned.
func (h *heldBatches) end(t *testing.T, first int) {
	t.Helper()
	h.mu.Lock()
	release := h.release[first]
	h.mu.Unlock()
	if release == nil {
		t.Fatalf("no batch led by %d is running", first)
	}
	close(release)
	if got := <-h.finished; got != first {
		t.Fatalf("batch led by %d finished, want %d", got, first)
	}
}

// waitPending blocks until n callers are queued, and fails if they are
// not within seconds (a batch started that should not have, say).
func (h *heldBatches) waitPending(t *testing.T, b *Batcher[int, int], n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); b.pendingLen() < n; runtime.Gosched() {
		if time.Now().After(deadline) {
			h.mu.Lock()
			sizes := slices.Clone(h.sizes)
			h.mu.Unlock()
			t.Fatalf("got %d callers queued, want %d (batch sizes so far %v)", b.pendingLen(), n, sizes)
		}
	}
}

// noneStarted fails if a batch starts within a short while.
func (h *heldBatches) noneStarted(t *testing.T, why string) {
	t.Helper()
	select {
	case reqs := <-h.started:
		t.Fatalf("a batch of %v started; want none yet: %s", reqs, why)
	case <-time.After(20 * time.Millisecond):
	}
}

// TestEvenBatchesWaitForTheirShare: with EvenBatches, a caller who finds
// a batch running and a round trip free waits until the calls waiting
// with it are their share of all the calls (half, with two in flight),
// where without it the first such caller runs nearly alone.
func TestEvenBatchesWaitForTheirShare(t *testing.T) {
	noLeaks(t)
	for _, even := range []bool{false, true} {
		h := newHeldBatches()
		b := NewBatcher(BatchOptions{MaxInFlight: 2, EvenBatches: even}, h.run)
		var wg sync.WaitGroup
		results := make([]int, 40)
		do := func(i int) {
			wg.Go(func() {
				r, err := b.Do(context.Background(), i)
				if err != nil {
					t.Error(err)
				}
				results[i] = r
			})
		}
		// Two callers alone take both round trips; eight queue behind them.
		do(0)
		<-h.started
		do(1)
		<-h.started
		for i := 10; i < 18; i++ {
			do(i)
		}
		h.waitPending(t, b, 8)
		h.end(t, 0) // the eight go together beside caller 1's batch
		eight := <-h.started
		if len(eight) != 8 {
			t.Fatalf("even=%v: got a batch of %v after the first ended, want the eight waiting", even, eight)
		}
		h.end(t, 1)
		// Eight calls run in one batch, and a round trip is free.
		if !even {
			do(20)
			if reqs := <-h.started; len(reqs) != 1 {
				t.Fatalf("even=false: got a batch of %v, want caller 20 alone at once", reqs)
			}
			h.end(t, 20)
			h.end(t, eight[0])
			wg.Wait()
			continue
		}
		for i := 20; i < 27; i++ {
			do(i)
		}
		h.waitPending(t, b, 7)
		h.noneStarted(t, "seven waiting beside a batch of eight are less than half of fifteen")
		do(27)
		reqs := <-h.started
		if len(reqs) != 8 || reqs[0] < 20 {
			t.Fatalf("even=true: got a batch of %v, want the eight callers 20 to 27", reqs)
		}
		// Three wait beside two batches of eight; when both end, nothing
		// runs, so the three go at once however few they are.
		for i := 30; i < 33; i++ {
			do(i)
		}
		h.waitPending(t, b, 3)
		h.end(t, eight[0])
		h.noneStarted(t, "three waiting beside a batch of eight are less than half of eleven")
		h.end(t, reqs[0])
		three := <-h.started
		if len(three) != 3 {
			t.Fatalf("even=true: got a batch of %v once nothing ran, want the three waiting", three)
		}
		h.end(t, three[0])
		wg.Wait()
		if fmt.Sprint(h.sizes) != "[1 1 8 8 3]" {
			t.Fatalf("even=true: got batch sizes %v, want [1 1 8 8 3]", h.sizes)
		}
		for _, i := range []int{0, 1, 10, 17, 20, 27, 30, 32} {
			if results[i] != 2*i {
				t.Fatalf("even=true: caller %d got %d, want %d", i, results[i], 2*i)
			}
		}
		if b.waiting != 0 || b.running != 0 || b.inFlight != 0 {
			t.Fatalf("after the calls: %d waiting, %d running, %d in flight; want none", b.waiting, b.running, b.inFlight)
		}
	}
}

// TestEvenBatchesForgetCallersWhoLeft: a waiting caller whose context
// ends no longer counts toward a batch's share, so the callers still
// waiting are not held back for it and not sent early because of it.
func TestEvenBatchesForgetCallersWhoLeft(t *testing.T) {
	noLeaks(t)
	h := newHeldBatches()
	b := NewBatcher(BatchOptions{MaxInFlight: 2, EvenBatches: true}, h.run)
	var wg sync.WaitGroup
	do := func(ctx context.Context, i int) {
		wg.Go(func() { b.Do(ctx, i) })
	}
	// A batch of four runs: callers 0 and 1 hold both round trips, four
	// queue and go together when 0 ends, then 1 ends.
	do(context.Background(), 0)
	<-h.started
	do(context.Background(), 1)
	<-h.started
	for i := 10; i < 14; i++ {
		do(context.Background(), i)
	}
	h.waitPending(t, b, 4)
	h.end(t, 0)
	four := <-h.started
	h.end(t, 1)
	// Three callers wait (their share would be four) and leave.
	ctx, cancel := context.WithCancel(context.Background())
	for i := 20; i < 23; i++ {
		do(ctx, i)
	}
	h.waitPending(t, b, 3)
	cancel()
	for b.pendingLen() > 0 {
		runtime.Gosched()
	}
	// Three more must again wait for a fourth.
	for i := 30; i < 33; i++ {
		do(context.Background(), i)
	}
	h.waitPending(t, b, 3)
	h.noneStarted(t, "three waiting beside a batch of four are less than half of seven; the three who left must not count")
	do(context.Background(), 33)
	reqs := <-h.started
	if got := slices.Sorted(slices.Values(reqs)); fmt.Sprint(got) != "[30 31 32 33]" {
		t.Fatalf("got a batch of %v, want callers 30 to 33 without those who left", reqs)
	}
	h.end(t, four[0])
	h.end(t, reqs[0])
	wg.Wait()
	if b.waiting != 0 || b.running != 0 || b.inFlight != 0 {
		t.Fatalf("after the calls: %d waiting, %d running, %d in flight; want none", b.waiting, b.running, b.inFlight)
	}
}
