package dispatcher

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/fakeupstream"
	"github.com/shaperhq/shaper/internal/testsupport"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// recorder is an upstream that answers by a function of the request's
// ordinal and records when each arrived.
type recorder struct {
	mu     sync.Mutex
	at     []time.Time
	answer func(n int, w http.ResponseWriter)
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	r.mu.Lock()
	n := len(r.at)
	r.at = append(r.at, time.Now())
	r.mu.Unlock()
	r.answer(n, w)
}

func (r *recorder) arrivals() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.at)
}

// TestBare429sPauseForLongerWhileRepeated: 429s with no time pause the
// upstream for 25ms, then 50ms, then 100ms, instead of pushback_default
// (here 10s) each.
func TestBare429sPauseForLongerWhileRepeated(t *testing.T) {
	h := newHarness(t, fakeupstream.Config{}, shaper.Upstream{}, 3)
	rec := &recorder{answer: func(n int, w http.ResponseWriter) {
		if n < 4 {
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.Write([]byte("ok"))
	}}
	up := httptest.NewServer(rec)
	defer up.Close()
	h.start(Config{Upstreams: []shaper.Upstream{{Name: "api", BaseURL: up.URL,
		Limits: []leaky.Limit{leaky.PerSecond(1000)}, PushbackDefault: 10 * time.Second}}}, nil)
	info := h.enqueue(&queue.Job{Upstream: "api", Path: "/x"})
	got := h.waitFor([]string{info.ID}, queue.StateSucceeded, queue.StateDead)[info.ID]
	if got.State != queue.StateSucceeded || got.Attempts != 1 {
		t.Fatalf("got %s after %d attempts (%s), want succeeded on its first attempt: pushback spends none", got.State, got.Attempts, got.LastError)
	}
	// The hand-backs' words stay in asynq's message; their mark says they
	// were no failure.
	if got.LastError != "" {
		t.Errorf("last error %q after pushbacks alone, want none", got.LastError)
	}
	at := rec.arrivals()
	if len(at) != 5 {
		t.Fatalf("got %d requests, want 4 refused and 1 accepted", len(at))
	}
	for i, want := range []time.Duration{25, 50, 100, 200} {
		gap := at[i+1].Sub(at[i])
		if gap < want*time.Millisecond || gap > want*time.Millisecond+2*time.Second {
			t.Errorf("gap after 429 #%d: got %v, want at least %vms (and far below pushback_default)", i+1, gap, want)
		}
	}
}

// TestStatedLimitIsLearnedAndShown: an upstream stating 5 per second
// (draft-10 RateLimit-Policy) caps shaper's configured 50/s, and the
// gauge says so.
func TestStatedLimitIsLearnedAndShown(t *testing.T) {
	if testing.Short() {
		t.Skip("seconds at a real limit: runs in make test")
	}
	h := newHarness(t, fakeupstream.Config{Rate: 5, Per: time.Second, Style: fakeupstream.StyleIETF}, shaper.Upstream{}, 5)
	d := h.start(Config{Upstreams: []shaper.Upstream{{Name: "api", Limits: []leaky.Limit{leaky.PerSecond(50)}}}}, nil)
	var ids []string
	for i := 0; i < 12; i++ {
		ids = append(ids, h.enqueue(&queue.Job{Upstream: "api", Path: fmt.Sprintf("/j/%d", i)}).ID)
	}
	for id, info := range h.waitFor(ids, queue.StateSucceeded, queue.StateDead) {
		if info.State != queue.StateSucceeded {
			t.Fatalf("job %s: %s (%s)", id, info.State, info.LastError)
		}
	}
	st, err := d.ups["api"].bucket.State(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := leaky.LimitState{Limit: leaky.PerSecond(5), Rate: 5, Source: leaky.SourceStated}
	if len(st.Limits) != 2 || st.Limits[1] != want {
		t.Fatalf("got limits %+v, want the configured one and %+v", st.Limits, want)
	}
	var m dto.Metric
	if err := d.m.UpstreamLimitRate.WithLabelValues("api", "requests/1s", "stated").Write(&m); err != nil || m.GetGauge().GetValue() != 5 {
		t.Errorf("gauge for the stated limit: got %v (%v), want 5", m.GetGauge().GetValue(), err)
	}
	// Once learned, nothing more is refused: the last 6 requests.
	recs := h.fake.Records()
	for _, r := range recs[len(recs)-6:] {
		if r.Status == http.StatusTooManyRequests {
			t.Errorf("a request at %v was refused after the limit was learned", r.At)
		}
	}
}

// TestSettledCostsPaceByWhatWasUsed: jobs estimate 50 tokens against 100
// tokens/s but use 10; settling from the answer's usage lets them go
// every ~200ms instead of every ~1s.
func TestSettledCostsPaceByWhatWasUsed(t *testing.T) {
	h := newHarness(t, fakeupstream.Config{}, shaper.Upstream{}, 3)
	rec := &recorder{answer: func(n int, w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"usage": {"prompt_tokens": 4, "total_tokens": 10}}`))
	}}
	up := httptest.NewServer(rec)
	defer up.Close()
	h.start(Config{Upstreams: []shaper.Upstream{{Name: "api", BaseURL: up.URL, Workers: 1,
		Limits: []leaky.Limit{leaky.PerSecond(1000), {Rate: 100, Per: time.Second, Cost: "tokens", Burst: 50}},
		Settle: map[string]shaper.Settle{"tokens": {JSON: "/usage/total_tokens"}}}}}, nil)
	var ids []string
	for i := 0; i < 8; i++ {
		ids = append(ids, h.enqueue(&queue.Job{Upstream: "api", Path: "/x", Cost: map[string]int64{"tokens": 50}}).ID)
	}
	h.waitFor(ids, queue.StateSucceeded)
	at := rec.arrivals()
	var gaps []time.Duration
	for i := 1; i < len(at); i++ {
		gaps = append(gaps, at[i].Sub(at[i-1]))
	}
	slices.Sort(gaps)
	// Unsettled, 50 tokens at ⌈1.02s/51⌉ per token ≈ 1s per job.
	if med := gaps[len(gaps)/2]; med > 400*time.Millisecond {
		t.Errorf("got median gap %v between jobs (all %v), want about 200ms: 10 tokens each, not 50", med, gaps)
	}
}

// TestStatedLimitsSurviveAnswersThatStateNothing: a proxy's 502 or a CDN's
// 429 states no policy; that must not drop the upstream's stated limit
// fleet-wide, nor make the next answer that states it again warn and
// block anew.
func TestStatedLimitsSurviveAnswersThatStateNothing(t *testing.T) {
	rdb := srv.Client(t)
	rdb.FlushAll(t.Context())
	var logs testsupport.LockedBuffer
	d, err := New(rdb, Config{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Upstreams: []shaper.Upstream{
		{Name: "api", BaseURL: "http://127.0.0.1:1", Limits: []leaky.Limit{leaky.PerSecond(100)}}}})
	if err != nil {
		t.Fatal(err)
	}
	u := d.ups["api"]
	ctx := t.Context()
	for _, stated := range [][]leaky.Limit{{leaky.PerSecond(40)}, nil, nil, {leaky.PerSecond(40)}, nil, {leaky.PerSecond(40)}} {
		d.learn(ctx, u, stated)
	}
	st, err := u.bucket.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Limits) != 2 || st.Limits[1].Source != leaky.SourceStated || st.Limits[1].Limit.Rate != 40 {
		t.Errorf("got limits %+v, want the configured one and a stated 40 per 1s", st.Limits)
	}
	if n := strings.Count(logs.String(), "states a lower limit"); n != 1 {
		t.Errorf("got %d warnings, want 1:\n%s", n, logs.String())
	}
	if n := strings.Count(logs.String(), "stated_limit"); n != 1 {
		t.Errorf("got %d blocks for the stated limit, want 1:\n%s", n, logs.String())
	}
	if got, want := u.spacing(), 25500*time.Microsecond; got != want {
		t.Errorf("got spacing %v, want the stated limit's %v", got, want)
	}
}
