package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/fakeupstream"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

var srv *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &srv) }

// harness is one upstream served by a fake third-party API, a queue and a
// running dispatcher, all on a fresh Redis database.
type harness struct {
	t      *testing.T
	rdb    *redis.Client
	q      *queue.Queue
	fake   *fakeupstream.Server
	url    string
	cancel context.CancelFunc
	done   chan error
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(discard{}, &slog.HandlerOptions{Level: slog.LevelError + 100}))
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func newHarness(t *testing.T, fakeCfg fakeupstream.Config, up shaper.Upstream, maxAttempts int) *harness {
	t.Helper()
	rdb := srv.Client(t)
	rdb.FlushAll(context.Background())
	fake, err := fakeupstream.New(fakeCfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(fake)
	t.Cleanup(hs.Close)
	if up.Name == "" {
		up.Name = "api"
	}
	q, err := queue.New(rdb, queue.Config{Upstreams: []shaper.Upstream{
		{Name: up.Name, Limits: []leaky.Limit{leaky.PerSecond(1000)}, MaxPending: 100000, Retry: shaper.Retry{MaxAttempts: maxAttempts}, ResultRetention: time.Hour, DeadRetention: time.Hour},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return &harness{t: t, rdb: rdb, q: q, fake: fake, url: hs.URL}
}

func (h *harness) start(cfg Config, handlers map[string]Handler) *Dispatcher {
	h.t.Helper()
	return h.startWith(cfg, handlers, nil)
}

// startWith is start with prepare run on the dispatcher before it runs.
func (h *harness) startWith(cfg Config, handlers map[string]Handler, prepare func(*Dispatcher)) *Dispatcher {
	h.t.Helper()
	cfg.Logger = quietLogger()
	for i := range cfg.Upstreams {
		if cfg.Upstreams[i].BaseURL == "" && cfg.Upstreams[i].Name != "mail" {
			cfg.Upstreams[i].BaseURL = h.url
		}
	}
	d, err := New(h.rdb, cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	for name, fn := range handlers {
		if err := d.Handle(name, fn); err != nil {
			h.t.Fatal(err)
		}
	}
	if prepare != nil {
		prepare(d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done = cancel, make(chan error, 1)
	go func() { h.done <- d.Run(ctx) }()
	h.t.Cleanup(h.stop)
	return d
}

func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	h.cancel = nil
	if err := <-h.done; err != nil {
		h.t.Errorf("Run: %v", err)
	}
}

func (h *harness) enqueue(job *queue.Job) *queue.Info {
	h.t.Helper()
	info, _, err := h.q.Enqueue(context.Background(), job)
	if err != nil {
		h.t.Fatal(err)
	}
	return info
}

// waitFor polls until every job reaches a final state or the deadline,
// which only bounds a hang: the tests assert on outcomes, not on time.
func (h *harness) waitFor(ids []string, final ...queue.State) map[string]*queue.Info {
	h.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	out := map[string]*queue.Info{}
	for len(out) < len(ids) {
		for _, id := range ids {
			if out[id] != nil {
				continue
			}
			info, err := h.q.Get(context.Background(), id, "")
			if err != nil {
				h.t.Fatal(err)
			}
			for _, s := range final {
				if info.State == s {
					out[id] = info
				}
			}
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("only %d of %d jobs reached %v", len(out), len(ids), final)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return out
}

func TestHTTPJobSucceedsWithItsHeaders(t *testing.T) {
	var mu sync.Mutex
	var seen []http.Header
	h := newHarness(t, fakeupstream.Config{Style: fakeupstream.StyleOpenAI}, shaper.Upstream{}, 3)
	// Wrap the fake to see the headers exactly as sent.
	rec := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Clone())
		mu.Unlock()
		h.fake.ServeHTTP(w, r)
	}))
	defer rec.Close()
	h.start(Config{Upstreams: []shaper.Upstream{{
		Name: "api", BaseURL: rec.URL, Limits: []leaky.Limit{leaky.PerSecond(100)},
		Headers: map[string]string{"Authorization": "Bearer worker-secret"},
	}}}, nil)
	info := h.enqueue(&queue.Job{Upstream: "api", Method: "POST", Path: "/v1/chat?x=1", Body: []byte(`{"max_tokens":5}`),
		Headers:        map[string]string{"Authorization": "Bearer producer-tries", "X-Trace": "t1"},
		IdempotencyKey: "order-9"})
	got := h.waitFor([]string{info.ID}, queue.StateSucceeded, queue.StateDead)[info.ID]
	if got.State != queue.StateSucceeded || got.Attempts != 1 {
		t.Fatalf("got %s after %d attempts (%s), want succeeded after 1", got.State, got.Attempts, got.LastError)
	}
	if got.Response == nil || got.Response.Status != 200 || !strings.Contains(string(got.Response.Body), "order-9") {
		t.Fatalf("stored response: %+v", got.Response)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 {
		t.Fatalf("upstream saw %d requests, want 1", len(seen))
	}
	if a := seen[0].Get("Authorization"); a != "Bearer worker-secret" {
		t.Errorf("Authorization %q: the worker's configured header must win", a)
	}
	if k := seen[0].Get("Idempotency-Key"); k != "order-9" {
		t.Errorf("Idempotency-Key %q, want the job's key", k)
	}
	if x := seen[0].Get("X-Trace"); x != "t1" {
		t.Errorf("X-Trace %q, want the job's header passed on", x)
	}
}

func TestFailuresRetryThenDie(t *testing.T) {
	h := newHarness(t, fakeupstream.Config{FailRate: 1, Seed: 1}, shaper.Upstream{}, 3)
	h.start(Config{Upstreams: []shaper.Upstream{{
		Name: "api", Limits: []leaky.Limit{leaky.PerSecond(1000)},
		Retry: shaper.Retry{MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond},
	}}}, nil)
	info := h.enqueue(&queue.Job{Upstream: "api", Path: "/boom"})
	got := h.waitFor([]string{info.ID}, queue.StateDead)[info.ID]
	if got.Attempts != 3 || !strings.Contains(got.LastError, "gave up after 3 attempts") {
		t.Fatalf("got %d attempts, error %q; want dead after 3", got.Attempts, got.LastError)
	}
	if n := h.fake.Report().Total; n != 3 {
		t.Fatalf("upstream saw %d requests, want 3", n)
	}
}

func TestClientErrorIsDeadAtOnce(t *testing.T) {
	h := newHarness(t, fakeupstream.Config{CostLimit: &fakeupstream.CostLimit{Name: "tokens", Rate: 1e6, Per: time.Minute}}, shaper.Upstream{}, 5)
	h.start(Config{Upstreams: []shaper.Upstream{{Name: "api", Limits: []leaky.Limit{leaky.PerSecond(1000)}}}}, nil)
	// A malformed cost header makes the fake answer 400.
	info := h.enqueue(&queue.Job{Upstream: "api", Path: "/x", Headers: map[string]string{"X-Cost-Tokens": "lots"}})
	got := h.waitFor([]string{info.ID}, queue.StateDead)[info.ID]
	if got.Attempts != 1 || !strings.Contains(got.LastError, "400") || got.Response == nil || got.Response.Status != 400 {
		t.Fatalf("got %+v, want dead after one attempt with the 400 stored", got)
	}
}

// TestPushbackSpendsNoAttempt runs jobs at twice what the upstream allows:
// its 429s must pause the upstream, and every job still succeeds on its
// first counted attempt.
func TestPushbackSpendsNoAttempt(t *testing.T) {
	if testing.Short() {
		t.Skip("seconds at a real limit: runs in make test")
	}
	h := newHarness(t, fakeupstream.Config{Rate: 5, Per: time.Second, Style: fakeupstream.StylePlain}, shaper.Upstream{}, 1)
	d := h.start(Config{Upstreams: []shaper.Upstream{{Name: "api", Limits: []leaky.Limit{leaky.PerSecond(10)}}}}, nil)
	var ids []string
	for i := 0; i < 15; i++ {
		ids = append(ids, h.enqueue(&queue.Job{Upstream: "api", Path: fmt.Sprintf("/j/%d", i)}).ID)
	}
	for id, info := range h.waitFor(ids, queue.StateSucceeded, queue.StateDead) {
		if info.State != queue.StateSucceeded || info.Attempts != 1 {
			t.Fatalf("job %s: %s after %d attempts (%s); want succeeded with max_attempts 1", id, info.State, info.Attempts, info.LastError)
		}
	}
	rep := h.fake.Report()
	if rep.Rejected == 0 {
		t.Fatalf("the upstream rejected nothing; the test did not exercise pushback")
	}
	if got := testMetric(t, d, "deferred"); got == 0 {
		t.Fatalf("no deferrals counted")
	}
}

func testMetric(t *testing.T, d *Dispatcher, outcome string) float64 {
	t.Helper()
	return counterValue(d.m.Dispatches.WithLabelValues("api", outcome))
}

func TestGoHandler(t *testing.T) {
	h := newHarness(t, fakeupstream.Config{}, shaper.Upstream{Name: "mail"}, 4)
	var mu sync.Mutex
	calls := map[string]int{}
	h.start(Config{Upstreams: []shaper.Upstream{{Name: "mail", Limits: []leaky.Limit{leaky.PerSecond(1000)},
		Retry: shaper.Retry{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}, PushbackDefault: 10 * time.Millisecond}}},
		map[string]Handler{"mail": func(ctx context.Context, job *queue.Job) (*queue.Response, error) {
			mu.Lock()
			calls[job.Task]++
			n := calls[job.Task]
			mu.Unlock()
			switch job.Task {
			case "flaky":
				if n < 3 {
					return nil, errors.New("smtp: try later")
				}
			case "bounce":
				return nil, Permanent(errors.New("550 no such user"))
			case "slow-down":
				if n < 3 {
					return nil, Pushback(0, errors.New("421 too many"))
				}
			}
			return &queue.Response{Status: 250, Body: []byte("queued as " + job.Task)}, nil
		}})
	flaky := h.enqueue(&queue.Job{Upstream: "mail", Task: "flaky"}).ID
	bounce := h.enqueue(&queue.Job{Upstream: "mail", Task: "bounce"}).ID
	slow := h.enqueue(&queue.Job{Upstream: "mail", Task: "slow-down", MaxAttempts: 1}).ID
	got := h.waitFor([]string{flaky, bounce, slow}, queue.StateSucceeded, queue.StateDead)
	if g := got[flaky]; g.State != queue.StateSucceeded || g.Attempts != 3 || string(g.Response.Body) != "queued as flaky" {
		t.Errorf("flaky: %+v", g)
	}
	if g := got[bounce]; g.State != queue.StateDead || g.Attempts != 1 || !strings.Contains(g.LastError, "550") {
		t.Errorf("bounce: %+v", g)
	}
	if g := got[slow]; g.State != queue.StateSucceeded || g.Attempts != 1 {
		t.Errorf("slow-down: got %s after %d attempts, want succeeded without spending attempts on pushback", g.State, g.Attempts)
	}
}

// TestShutdownHandsBackWaitingJobs blocks the upstream for a moment, so
// the workers take jobs and wait for the slots after the block; shutting
// down must return them to the queue at once, with no attempt spent.
func TestShutdownHandsBackWaitingJobs(t *testing.T) {
	h := newHarness(t, fakeupstream.Config{}, shaper.Upstream{}, 2)
	d := h.start(Config{Upstreams: []shaper.Upstream{{Name: "api", Limits: []leaky.Limit{leaky.PerSecond(100)}, Workers: 3}},
		Horizon: 5 * time.Second, ShutdownTimeout: 5 * time.Second}, nil)
	b := d.ups["api"].bucket
	if _, err := b.Block(context.Background(), 4*time.Second, "test pause"); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := 0; i < 5; i++ {
		ids = append(ids, h.enqueue(&queue.Job{Upstream: "api", Path: "/x"}).ID)
	}
	// Wait until workers hold three of them.
	for deadline := time.Now().Add(3 * time.Second); ; {
		c, _ := h.q.Counts(context.Background(), "api")
		if c["default"].Active == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("workers never held 3 jobs: %+v", c)
		}
		time.Sleep(10 * time.Millisecond)
	}
	h.stop()
	for _, id := range ids {
		info, err := h.q.Get(context.Background(), id, "")
		if err != nil {
			t.Fatal(err)
		}
		// Back in their flows, untaken, which the block still holds.
		if info.State != queue.StateScheduled || info.WaitingFor != queue.WaitingPause || info.Attempts != 0 {
			t.Errorf("job %s after shutdown: %s waiting for %q with %d attempts; want scheduled, waiting for the pause, with none spent",
				id, info.State, info.WaitingFor, info.Attempts)
		}
	}
	if n := h.fake.Report().Total; n != 0 {
		t.Fatalf("the blocked upstream received %d requests", n)
	}
}

func counterValue(c prometheus.Metric) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// TestLongBlockHoldsNoJob: while an upstream is blocked far beyond the
// horizon no worker takes its jobs, so none is held or spends anything;
// lifting the block wakes the workers at once.
func TestLongBlockHoldsNoJob(t *testing.T) {
	h := newHarness(t, fakeupstream.Config{}, shaper.Upstream{}, 2)
	d := h.start(Config{Upstreams: []shaper.Upstream{{Name: "api", Limits: []leaky.Limit{leaky.PerSecond(100)}, Workers: 2}}}, nil)
	b := d.ups["api"].bucket
	if _, err := b.Block(context.Background(), time.Minute, "test pause"); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := 0; i < 20; i++ {
		ids = append(ids, h.enqueue(&queue.Job{Upstream: "api", Path: "/x"}).ID)
	}
	time.Sleep(time.Second)
	for _, id := range ids {
		info, err := h.q.Get(context.Background(), id, "")
		if err != nil {
			t.Fatal(err)
		}
		if info.State != queue.StateScheduled || info.WaitingFor != queue.WaitingPause || info.Attempts != 0 {
			t.Fatalf("job %s after a second of a long block: %s waiting for %q with %d attempts; want scheduled, waiting for the pause, with none spent",
				id, info.State, info.WaitingFor, info.Attempts)
		}
	}
	start := time.Now()
	if err := b.Unblock(context.Background()); err != nil {
		t.Fatal(err)
	}
	h.waitFor(ids, queue.StateSucceeded)
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("after the block was lifted the jobs took %v, want well under 2s (the lift wakes the workers)", took)
	}
}

// TestPathsAreSentAsGiven sends jobs to a server that records the request
// line's target: the path must arrive byte for byte, percent-encoding and
// query included, below the base URL's own path.
func TestPathsAreSentAsGiven(t *testing.T) {
	h := newHarness(t, fakeupstream.Config{}, shaper.Upstream{}, 1)
	var mu sync.Mutex
	seen := map[string]string{}
	rec := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.Header.Get("X-Case")] = r.RequestURI
		mu.Unlock()
	}))
	defer rec.Close()
	h.start(Config{Upstreams: []shaper.Upstream{{Name: "api", BaseURL: rec.URL + "/api/v4", Limits: []leaky.Limit{leaky.PerSecond(1000)}}}}, nil)
	paths := []string{
		"/projects/group%2Fsub%2Fproj/issues",
		"/projects/a%2fb",
		"/%2F",
		"/files/a%20b.txt?ref=main&path=x%2Fy",
		"/charges?expand[]=customer&limit=3",
		"/search?q=a+b%26c",
		"/users/me@example.com;v=1",
		"/trailing/",
		"/x?",
	}
	var ids []string
	for i, p := range paths {
		ids = append(ids, h.enqueue(&queue.Job{Upstream: "api", Path: p, Headers: map[string]string{"X-Case": fmt.Sprint(i)}}).ID)
	}
	for id, info := range h.waitFor(ids, queue.StateSucceeded, queue.StateDead) {
		if info.State != queue.StateSucceeded {
			t.Errorf("job %s (%s): got %s (%s), want succeeded", id, info.Path, info.State, info.LastError)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for i, p := range paths {
		if got, want := seen[fmt.Sprint(i)], "/api/v4"+p; got != want {
			t.Errorf("path %q: upstream got request target %q, want %q", p, got, want)
		}
	}
}

// TestConcurrencyCapAcrossDispatchers: two dispatchers on separate
// connections share an upstream capped at 3 in flight whose answers take
// 100ms; the upstream never sees more than 3 at once, and the backlog
// still drains at about the cap's pace.
func TestConcurrencyCapAcrossDispatchers(t *testing.T) {
	h := newHarness(t, fakeupstream.Config{Latency: 100 * time.Millisecond}, shaper.Upstream{}, 2)
	cfg := Config{Upstreams: []shaper.Upstream{{Name: "api", Limits: []leaky.Limit{leaky.PerSecond(1000)}, Concurrency: 3, Workers: 5}}}
	h.start(cfg, nil)
	other := &harness{t: t, rdb: srv.Client(t), q: h.q, fake: h.fake, url: h.url}
	other.start(cfg, nil)
	var ids []string
	for range 30 {
		ids = append(ids, h.enqueue(&queue.Job{Upstream: "api", Path: "/x"}).ID)
	}
	start := time.Now()
	for id, info := range h.waitFor(ids, queue.StateSucceeded, queue.StateDead) {
		if info.State != queue.StateSucceeded {
			t.Errorf("job %s: %s (%s)", id, info.State, info.LastError)
		}
	}
	took := time.Since(start)
	if r := h.fake.Report(); r.MaxInFlight > 3 {
		t.Errorf("the upstream had %d requests in flight at once, want at most 3", r.MaxInFlight)
	}
	// 30 jobs, 3 at a time, 100ms each: 1s at best.
	if took > 3*time.Second {
		t.Errorf("30 jobs at 3 in flight of 100ms took %v, want about 1s", took)
	}
	t.Logf("30 jobs at 3 in flight of 100ms took %v", took)
}

// TestFinishedJobsGoAtTheirRetention: a succeeded and a dead job are
// deleted once their retention passes, though nothing else happens on the
// upstream after them.
func TestFinishedJobsGoAtTheirRetention(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a sweep (5s)")
	}
	h := newHarness(t, fakeupstream.Config{}, shaper.Upstream{}, 1)
	srv400 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/bad" {
			w.WriteHeader(http.StatusBadRequest)
		}
	}))
	defer srv400.Close()
	up := shaper.Upstream{Name: "api", BaseURL: srv400.URL, Limits: []leaky.Limit{leaky.PerSecond(100)}, ResultRetention: time.Second, DeadRetention: time.Second}
	q, err := queue.New(h.rdb, queue.Config{Upstreams: []shaper.Upstream{up}})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	h.q = q
	h.start(Config{Upstreams: []shaper.Upstream{up}}, nil)
	ok := h.enqueue(&queue.Job{Upstream: "api", Path: "/x"})
	bad := h.enqueue(&queue.Job{Upstream: "api", Path: "/bad"})
	h.waitFor([]string{ok.ID, bad.ID}, queue.StateSucceeded, queue.StateDead)
	deadline := time.Now().Add(15 * time.Second)
	for _, id := range []string{ok.ID, bad.ID} {
		for {
			_, err := q.Get(context.Background(), id, "")
			if errors.Is(err, queue.ErrNotFound) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %s still there 15s after it finished with a retention of 1s (%v)", id, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	c, _ := q.Counts(context.Background(), "api")
	if c["default"].Succeeded != 0 || c["default"].Dead != 0 {
		t.Errorf("counts after the sweep %+v, want none succeeded or dead", c["default"])
	}
}

// TestLeaseRenewedWhileSending: a job whose send outlasts a renewal keeps
// its lease moving ahead, so no other replica recovers it mid-send.
func TestLeaseRenewedWhileSending(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a lease renewal (5s)")
	}
	h := newHarness(t, fakeupstream.Config{}, shaper.Upstream{Name: "mail"}, 1)
	started, release := make(chan string, 1), make(chan struct{})
	h.start(Config{Upstreams: []shaper.Upstream{{Name: "mail", Limits: []leaky.Limit{leaky.PerSecond(100)}, Timeout: time.Minute}}},
		map[string]Handler{"mail": func(ctx context.Context, job *queue.Job) (*queue.Response, error) {
			started <- job.ID
			<-release
			return nil, nil
		}})
	info := h.enqueue(&queue.Job{Upstream: "mail", Task: "long"})
	id := <-started
	leaseKey := "asynq:{" + jobstore.QueueName("mail") + "}:lease"
	first := h.rdb.ZScore(context.Background(), leaseKey, id).Val()
	time.Sleep(leaseRenewEvery + time.Second)
	later := h.rdb.ZScore(context.Background(), leaseKey, id).Val()
	close(release)
	if later <= first {
		t.Errorf("lease of a job in flight for %v: %.3f, then %.3f; want it renewed ahead", leaseRenewEvery+time.Second, first, later)
	}
	if got := h.waitFor([]string{info.ID}, queue.StateSucceeded, queue.StateDead)[info.ID]; got.State != queue.StateSucceeded {
		t.Errorf("job %s, want succeeded", got.State)
	}
}
