package dispatcher

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/fakeupstream"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// finishSpy wraps an upstream's finish: it records each call's jobs and
// can hold calls until let go.
type finishSpy struct {
	mu    sync.Mutex
	calls [][]string
	hold  func(call int) <-chan struct{} // nil: none held
}

func (s *finishSpy) wrap(u *upstream) {
	next := u.finish
	u.finish = func(ctx context.Context, items []jobstore.Finished) ([]error, error) {
		ids := make([]string, len(items))
		for i, it := range items {
			ids[i] = it.ID
		}
		s.mu.Lock()
		s.calls = append(s.calls, ids)
		n := len(s.calls)
		s.mu.Unlock()
		if s.hold != nil {
			if gate := s.hold(n); gate != nil {
				<-gate
			}
		}
		return next(ctx, items)
	}
}

func (s *finishSpy) got() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]string(nil), s.calls...)
}

// queued is how many outcomes u's finisher has not yet stored.
func queued(u *upstream) int {
	u.ends.mu.Lock()
	defer u.ends.mu.Unlock()
	return u.ends.unstored
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

func noop(ran *atomic.Int64) map[string]Handler {
	return map[string]Handler{"mail": HandlerFunc(func(context.Context, *queue.Job) error {
		ran.Add(1)
		return nil
	})}
}

// spied starts a dispatcher of one upstream, mail, with workers workers
// and a no-op handler that counts its runs; its finish is wrapped by spy,
// then by wrap when not nil. It enqueues jobs jobs and returns their ids.
func spied(t *testing.T, workers, jobs int, spy *finishSpy, wrap func(*upstream)) (*harness, *upstream, *atomic.Int64, []string) {
	t.Helper()
	h := newHarness(t, fakeupstream.Config{}, shaper.Upstream{Name: "mail"}, 1)
	ran := new(atomic.Int64)
	var u *upstream
	h.startWith(Config{Upstreams: []shaper.Upstream{{Name: "mail", Workers: workers, Limits: []leaky.Limit{leaky.PerSecond(100000)}}}},
		noop(ran), func(d *Dispatcher) {
			u = d.ups["mail"]
			spy.wrap(u)
			if wrap != nil {
				wrap(u)
			}
		})
	var ids []string
	for range jobs {
		ids = append(ids, h.enqueue(&queue.Job{Upstream: "mail", Task: "t"}).ID)
	}
	return h, u, ran, ids
}

// holdFirst holds a finishSpy's first call until gate is closed.
func holdFirst(gate chan struct{}) func(int) <-chan struct{} {
	return func(call int) <-chan struct{} {
		if call == 1 {
			return gate
		}
		return nil
	}
}

// A worker goes on to its next job while its last job's outcome is being
// stored; the job stays active (held) until then, and the outcomes that
// came meanwhile are stored together.
func TestWorkersGoOnWhileOutcomesAreStored(t *testing.T) {
	gate := make(chan struct{})
	spy := &finishSpy{hold: holdFirst(gate)}
	h, u, ran, ids := spied(t, 2, 6, spy, nil)
	// Two workers run all six jobs while the first finish is held.
	waitUntil(t, "six outcomes decided with the first finish held", func() bool { return queued(u) == 6 })
	if n := ran.Load(); n != 6 {
		t.Fatalf("%d jobs ran, want 6", n)
	}
	first := spy.got()[0]
	for _, id := range first {
		if info, err := h.q.Get(context.Background(), id, ""); err != nil || info.State != queue.StateActive {
			t.Errorf("job %s while its outcome is being stored: %v (%v), want active", id, info.State, err)
		}
	}
	close(gate)
	for id, info := range h.waitFor(ids, queue.StateSucceeded, queue.StateDead) {
		if info.State != queue.StateSucceeded {
			t.Errorf("job %s: %s, want succeeded", id, info.State)
		}
	}
	calls := spy.got()
	if len(calls) != 2 || len(calls[0])+len(calls[1]) != 6 {
		t.Errorf("finish calls %v, want two: the held one, then one with the outcomes that came meanwhile", calls)
	}
}

// Run returns only once every job's outcome is stored.
func TestRunWaitsForOutcomes(t *testing.T) {
	gate := make(chan struct{})
	spy := &finishSpy{hold: func(int) <-chan struct{} { return gate }}
	h, u, _, ids := spied(t, 4, 4, spy, nil)
	waitUntil(t, "four outcomes decided", func() bool { return queued(u) == 4 })
	h.cancel()
	h.cancel = nil
	select {
	case err := <-h.done:
		t.Fatalf("Run returned (%v) with outcomes not yet stored", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(gate)
	if err := <-h.done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, id := range ids {
		info, err := h.q.Get(context.Background(), id, "")
		if err != nil || info.State != queue.StateSucceeded {
			t.Errorf("job %s after Run returned: %v (%v), want succeeded", id, info.State, err)
		}
	}
}

// While Redis cannot take outcomes, the finisher holds the jobs and tries
// again; nothing is sent twice.
func TestOutcomesHeldWhileStoreUnreachable(t *testing.T) {
	h := newHarness(t, fakeupstream.Config{}, shaper.Upstream{Name: "mail"}, 1)
	var failures atomic.Int64
	var ran atomic.Int64
	var d *Dispatcher
	d = h.startWith(Config{Upstreams: []shaper.Upstream{{Name: "mail", Workers: 3, Limits: []leaky.Limit{leaky.PerSecond(100000)}}}},
		noop(&ran), func(d *Dispatcher) {
			u := d.ups["mail"]
			next := u.finish
			u.finish = func(ctx context.Context, items []jobstore.Finished) ([]error, error) {
				if failures.Add(1) <= 3 {
					return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
				}
				return next(ctx, items)
			}
		})
	var ids []string
	for range 3 {
		ids = append(ids, h.enqueue(&queue.Job{Upstream: "mail", Task: "t"}).ID)
	}
	for id, info := range h.waitFor(ids, queue.StateSucceeded, queue.StateDead) {
		if info.State != queue.StateSucceeded || info.Attempts != 1 {
			t.Errorf("job %s: %s after %d attempts, want succeeded after 1", id, info.State, info.Attempts)
		}
	}
	if n := ran.Load(); n != 3 {
		t.Errorf("the handler ran %d times for 3 jobs, want 3", n)
	}
	if n := counterValue(d.m.RedisErrors.WithLabelValues("results")); n != 3 {
		t.Errorf("%v results errors counted, want 3", n)
	}
}

// An outcome the store refuses (here one whose message names another
// queue, in a finish of several) does not take the others of its finish
// with it: they are stored each on its own, and none is sent again.
func TestOneRefusedOutcomeSparesTheOthers(t *testing.T) {
	gate := make(chan struct{})
	spy := &finishSpy{hold: holdFirst(gate)}
	var refused atomic.Int64
	h, u, ran, ids := spied(t, 2, 6, spy, func(u *upstream) {
		next := u.finish
		u.finish = func(ctx context.Context, items []jobstore.Finished) ([]error, error) {
			if len(items) > 1 && refused.Add(1) == 1 {
				items = append([]jobstore.Finished(nil), items...)
				msg := *items[len(items)-1].Msg
				msg.Queue = "elsewhere"
				items[len(items)-1].Msg = &msg
			}
			return next(ctx, items)
		}
	})
	waitUntil(t, "six outcomes decided with the first finish held", func() bool { return queued(u) == 6 })
	close(gate)
	for id, info := range h.waitFor(ids, queue.StateSucceeded, queue.StateDead) {
		if info.State != queue.StateSucceeded || info.Attempts != 1 {
			t.Errorf("job %s: %s after %d attempts, want succeeded after 1", id, info.State, info.Attempts)
		}
	}
	if n := ran.Load(); n != 6 {
		t.Errorf("the handler ran %d times for 6 jobs, want 6", n)
	}
	calls := spy.got()
	bad := -1
	for i, c := range calls {
		if len(c) > 1 {
			bad = i
			break
		}
	}
	if bad < 0 || len(calls) < bad+1+len(calls[bad]) {
		t.Fatalf("finish calls %v: want a refused finish of several, then one call for each of its outcomes", calls)
	}
	for i, id := range calls[bad] {
		if c := calls[bad+1+i]; len(c) != 1 || c[0] != id {
			t.Errorf("finish calls %v: after the refused %v, want %s on its own", calls, calls[bad], id)
		}
	}
}

// With jobs that run shorter than a take's round trip and a limit too
// high to space them, a take is for all the workers and a finish for all
// their outcomes, not one call per worker as each frees. (Bounds are loose:
// a loaded machine may split a few.)
func TestCallsCarryEveryWorker(t *testing.T) {
	const workers, jobs = 8, 400
	h := newHarness(t, fakeupstream.Config{}, shaper.Upstream{Name: "mail"}, 1)
	var batch []*queue.Job
	for i := range jobs {
		batch = append(batch, &queue.Job{Upstream: "mail", Task: "t", Body: []byte(strconv.Itoa(i))})
	}
	for _, r := range h.q.EnqueueBatch(context.Background(), batch) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	before := commandCalls(t, h, "time")
	spy := &finishSpy{}
	var ran atomic.Int64
	h.startWith(Config{Upstreams: []shaper.Upstream{{Name: "mail", Workers: workers, Limits: []leaky.Limit{leaky.PerSecond(1000000)}}}},
		noop(&ran), func(d *Dispatcher) { spy.wrap(d.ups["mail"]) })
	waitUntil(t, "every outcome stored", func() bool {
		n := 0
		for _, c := range spy.got() {
			n += len(c)
		}
		return n == jobs
	})
	takes := commandCalls(t, h, "time") - before
	finishes := len(spy.got())
	t.Logf("%d jobs, %d workers: %d takes, %d finishes", jobs, workers, takes, finishes)
	// Taking and finishing for each worker as it frees, as the
	// dispatcher once did, makes about a call for every 3 jobs.
	if takes > jobs/4 {
		t.Errorf("%d takes for %d jobs with %d workers, want at most %d", takes, jobs, workers, jobs/4)
	}
	if finishes > jobs/4 {
		t.Errorf("%d finishes for %d jobs with %d workers, want at most %d", finishes, jobs, workers, jobs/4)
	}
}

// commandCalls is how many times Redis has run command (from INFO
// commandstats, scripts' commands included).
func commandCalls(t *testing.T, h *harness, command string) int {
	t.Helper()
	info, err := h.rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+command+":calls=")
		if !ok {
			continue
		}
		n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
		return n
	}
	return 0
}
