package server

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/leaky"
)

// slow is an upstream allowing one request per period.
func slow(period time.Duration) func(*shaper.Upstream) {
	return func(u *shaper.Upstream) { u.Limits = []leaky.Limit{{Rate: 1, Per: period}} }
}

// elsewhere is the upstream's bucket as another process (a worker)
// books it: its own pacer on its own connection.
func elsewhere(t *testing.T, rdb redis.UniversalClient, u shaper.Upstream) *leaky.Bucket {
	t.Helper()
	b, err := jobstore.Bucket(leaky.New(rdb, leaky.Config{}), u.WithDefaults(), time.Minute, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (f *proxyFixture) upstream() shaper.Upstream { return f.s.proxies["api"].up }

// TestProxySlotBeyondWait: a call whose slot lies beyond its wait is
// answered 429 at once, with Retry-After and retry-after-ms, and never
// sent, then or later.
func TestProxySlotBeyondWait(t *testing.T) {
	f := newProxyFixture(t, slow(10*time.Second))
	if resp, body := f.call("GET", "/proxy/api/v1/x", ""); resp.StatusCode != 200 {
		t.Fatalf("first call: got %d %s, want 200", resp.StatusCode, body)
	}
	start := time.Now()
	resp, body := f.call("GET", "/proxy/api/v1/x", "", "Shaper-Max-Wait", "1")
	took := time.Since(start)
	if resp.StatusCode != 429 || !strings.Contains(body, "nothing was sent") {
		t.Fatalf("second call: got %d %s, want 429 saying nothing was sent", resp.StatusCode, body)
	}
	if took > 500*time.Millisecond {
		t.Errorf("the 429 took %v, want it at once", took)
	}
	ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	ms, _ := strconv.Atoi(resp.Header.Get("Retry-After-Ms"))
	// The slot is 10s after the first send; a call waiting 1s can have
	// it in about 9s.
	if ra < 8 || ra > 10 || ms < 8000 || ms > 10000 || (ms+999)/1000 != ra {
		t.Errorf("got Retry-After %q and retry-after-ms %q, want about 9 s in both", resp.Header.Get("Retry-After"), resp.Header.Get("Retry-After-Ms"))
	}
	if n := len(f.up.requests()); n != 1 {
		t.Errorf("upstream got %d requests, want 1", n)
	}
	// Nothing was booked for it: the next slot is still the first's next.
	r, err := elsewhere(t, f.rdb, f.upstream()).Reserve(context.Background(), nil, leaky.MaxWait(time.Minute))
	if err != nil || !r.OK || r.Delay > 10500*time.Millisecond || r.Delay < 8*time.Second {
		t.Errorf("a reservation after the refusal: got %+v %v, want the slot 10s after the first send", r, err)
	}
}

// TestProxyHangUp: a caller that hangs up before its slot is never sent,
// and its slot goes to the next.
func TestProxyHangUp(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out real slots: runs in make test")
	}
	const period = 1500 * time.Millisecond
	f := newProxyFixture(t, slow(period))
	if resp, _ := f.call("GET", "/proxy/api/v1/x", ""); resp.StatusCode != 200 {
		t.Fatalf("first call: got %d, want 200", resp.StatusCode)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		resp, err := f.send(ctx, "GET", "/proxy/api/v1/hung-up", "", "Shaper-Max-Wait", "10")
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	// The call waits (it is counted as waiting), then its caller leaves.
	st := f.s.proxies["api"].space
	deadline := time.Now().Add(time.Second)
	for {
		n, _ := st.CountWaiting(context.Background(), f.rdb, time.Now())
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("got %d calls waiting, want 1", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the hung-up call was answered")
	}
	// Its slot was given back: a reservation now gets it, not the one
	// after.
	time.Sleep(100 * time.Millisecond)
	r, err := elsewhere(t, f.rdb, f.upstream()).Reserve(context.Background(), nil, leaky.MaxWait(time.Minute))
	if err != nil || !r.OK || r.Delay > period {
		t.Fatalf("a reservation after the hang-up: got %+v %v, want the hung-up call's slot, within %v", r, err, period)
	}
	time.Sleep(r.Delay + 300*time.Millisecond)
	for _, s := range f.up.requests() {
		if strings.Contains(s.uri, "hung-up") {
			t.Errorf("upstream got the hung-up call at %v", s.at)
		}
	}
	if n, _ := st.CountWaiting(context.Background(), f.rdb, time.Now()); n != 0 {
		t.Errorf("got %d calls waiting after the hang-up, want 0", n)
	}
}

// TestProxyRetriesUpstream429: a 429 from the upstream pauses the fleet
// and the call is sent again within its wait: the caller sees the success.
// Past its wait, the upstream's 429 is relayed.
func TestProxyRetriesUpstream429(t *testing.T) {
	f := newProxyFixture(t, nil)
	f.up.answer = func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 || strings.Contains(r.RequestURI, "always") {
			w.Header().Set("Retry-After", "0.4")
			w.WriteHeader(429)
			w.Write([]byte(`{"error":"slow down"}`))
			return
		}
		w.Write([]byte(`{"ok":true}`))
	}
	resp, body := f.call("POST", "/proxy/api/v1/x", `{}`)
	if resp.StatusCode != 200 || body != `{"ok":true}` {
		t.Fatalf("got %d %s, want the retry's 200", resp.StatusCode, body)
	}
	got := f.up.requests()
	if len(got) != 2 || got[1].at.Sub(got[0].at) < 400*time.Millisecond || got[1].body != `{}` {
		t.Fatalf("upstream got %d requests (%v), want 2, the second with the body at least 0.4s after the first", len(got), got)
	}
	if q, _ := strconv.ParseFloat(resp.Header.Get("Shaper-Queue-Time"), 64); q < 0.4 {
		t.Errorf("got Shaper-Queue-Time %q, want at least the 0.4s pause", resp.Header.Get("Shaper-Queue-Time"))
	}
	// The pause held the fleet: a job's reservation booked during it
	// waited for it too (the block outlives nothing now, so look at what
	// the refusal placed).
	st, err := f.s.proxies["api"].bucket.State(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.BlockReason != "" && st.BlockedUntil.After(time.Now()) {
		t.Errorf("the upstream is still blocked until %v", st.BlockedUntil)
	}

	resp, body = f.call("POST", "/proxy/api/v1/always", `{}`, "Shaper-Max-Wait", "0.2")
	if resp.StatusCode != 429 || body != `{"error":"slow down"}` {
		t.Fatalf("past the wait: got %d %s, want the upstream's 429 relayed", resp.StatusCode, body)
	}
}

// TestProxyRedisDown: with Redis unreachable a call is answered 503 at
// once, and nothing is sent.
func TestProxyRedisDown(t *testing.T) {
	if testing.Short() {
		t.Skip("a Redis of its own stopped: runs in make test")
	}
	own := redistest.New(t)
	f := newProxyFixtureOn(t, serveClient(t, own), &recorder{}, nil)
	if resp, _ := f.call("GET", "/proxy/api/v1/x", ""); resp.StatusCode != 200 {
		t.Fatalf("with Redis: got %d, want 200", resp.StatusCode)
	}
	if err := own.Stop(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	resp, body := f.call("GET", "/proxy/api/v1/x", "")
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("without Redis: got %d %s, want 503 with Retry-After", resp.StatusCode, body)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the 503 took %v, want it at once", took)
	}
	if n := len(f.up.requests()); n != 1 {
		t.Errorf("upstream got %d requests, want only the one made with Redis", n)
	}
}

// TestProxySharesTheLimit: calls book the very state jobs book. A slot
// taken elsewhere (as a worker takes it) holds a call back, and a call's
// slot holds back a reservation made elsewhere; a partition's limits are
// the jobs' partition limits.
func TestProxySharesTheLimit(t *testing.T) {
	f := newProxyFixture(t, func(u *shaper.Upstream) {
		u.Limits = []leaky.Limit{{Rate: 1, Per: 10 * time.Second}}
	})
	other := elsewhere(t, f.rdb, f.upstream())
	r, err := other.Reserve(context.Background(), nil, leaky.MaxWait(0))
	if err != nil || !r.OK {
		t.Fatalf("reserve elsewhere: got %+v %v, want a slot now", r, err)
	}
	if resp, body := f.call("GET", "/proxy/api/v1/x", "", "Shaper-Max-Wait", "1"); resp.StatusCode != 429 {
		t.Fatalf("a call after a slot taken elsewhere: got %d %s, want 429", resp.StatusCode, body)
	}
	// A pause placed elsewhere (an operator's, or a job's 429) that lasts
	// past the wait refuses a call at once too.
	if _, err := other.Block(context.Background(), time.Minute, "operator"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if resp, body := f.call("GET", "/proxy/api/v1/x", "", "Shaper-Max-Wait", "5"); resp.StatusCode != 429 || time.Since(start) > time.Second {
		t.Fatalf("a call while paused for a minute: got %d %s after %v, want 429 at once", resp.StatusCode, body, time.Since(start))
	}
	if n := len(f.up.requests()); n != 0 {
		t.Errorf("upstream got %d requests, want none", n)
	}
}

// TestProxyPartitions: a call's partition (Shaper-Partition, or a digest
// of its own credential) has the upstream's partition limits: a
// saturated partition refuses its calls and not another's.
func TestProxyPartitions(t *testing.T) {
	f := newProxyFixture(t, func(u *shaper.Upstream) {
		u.PartitionLimits = []leaky.Limit{{Rate: 1, Per: 10 * time.Second}}
	})
	for _, c := range []struct {
		name    string
		headers []string
		want    int
	}{
		{"a first", []string{"Shaper-Partition", "a"}, 200},
		{"a again", []string{"Shaper-Partition", "a", "Shaper-Max-Wait", "1"}, 429},
		{"b", []string{"Shaper-Partition", "b"}, 200},
		{"own key", []string{"Shaper-Upstream-Authorization", "Bearer sk-1"}, 200},
		{"own key again", []string{"Shaper-Upstream-Authorization", "Bearer sk-1", "Shaper-Max-Wait", "1"}, 429},
		{"another key", []string{"Shaper-Upstream-Authorization", "Bearer sk-2"}, 200},
		{"no partition", nil, 200},
		{"no partition again", nil, 200},
	} {
		resp, body := f.call("GET", "/proxy/api/v1/x", "", c.headers...)
		if resp.StatusCode != c.want {
			t.Errorf("%s: got %d %s, want %d", c.name, resp.StatusCode, body, c.want)
		}
	}
	if n := len(f.up.requests()); n != 6 {
		t.Errorf("upstream got %d requests, want the 6 answered 200", n)
	}
}

// TestProxyCosts: a call's cost comes from Shaper-Cost, else from its
// request JSON by proxy.cost, and counts in the limits that count it.
func TestProxyCosts(t *testing.T) {
	f := newProxyFixture(t, func(u *shaper.Upstream) {
		u.Limits = []leaky.Limit{leaky.PerSecond(1000), {Rate: 1000, Per: 10 * time.Second, Cost: "tokens", Burst: 1000}}
		u.Proxy.Cost = map[string]shaper.Settle{"tokens": {JSON: "/max_tokens"}}
	})
	if resp, body := f.call("POST", "/proxy/api/v1/chat", `{"max_tokens": 600}`); resp.StatusCode != 200 {
		t.Fatalf("600 tokens estimated: got %d %s, want 200", resp.StatusCode, body)
	}
	// 400 are left: a call costing 500 must wait about 1s.
	if resp, body := f.call("POST", "/proxy/api/v1/chat", `{}`, "Shaper-Cost", "tokens=500", "Shaper-Max-Wait", "0.2"); resp.StatusCode != 429 {
		t.Fatalf("500 tokens given: got %d %s, want 429", resp.StatusCode, body)
	}
	if resp, body := f.call("POST", "/proxy/api/v1/chat", `{"max_tokens": 300}`, "Shaper-Max-Wait", "0"); resp.StatusCode != 200 {
		t.Fatalf("300 tokens estimated: got %d %s, want 200", resp.StatusCode, body)
	}
	if n := len(f.up.requests()); n != 2 {
		t.Errorf("upstream got %d requests, want 2", n)
	}
}

// TestProxySettles: a small JSON answer settles the call's estimated cost
// by the upstream's settle, giving unused units back to the limit.
func TestProxySettles(t *testing.T) {
	f := newProxyFixture(t, func(u *shaper.Upstream) {
		u.Limits = []leaky.Limit{leaky.PerSecond(1000), {Rate: 1000, Per: 10 * time.Second, Cost: "tokens", Burst: 1000}}
		u.Proxy.Cost = map[string]shaper.Settle{"tokens": {JSON: "/max_tokens"}}
		u.Settle = map[string]shaper.Settle{"tokens": {JSON: "/usage/total_tokens"}}
	})
	f.up.answer = func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"usage": {"total_tokens": 100}}`))
	}
	if resp, body := f.call("POST", "/proxy/api/v1/chat", `{"max_tokens": 900}`); resp.StatusCode != 200 || body != `{"usage": {"total_tokens": 100}}` {
		t.Fatalf("900 estimated: got %d %s, want 200 and the body", resp.StatusCode, body)
	}
	// Settled to 100: 900 are free again, where the estimate left 100.
	if resp, body := f.call("POST", "/proxy/api/v1/chat", `{"max_tokens": 800}`, "Shaper-Max-Wait", "0"); resp.StatusCode != 200 {
		t.Fatalf("800 after settling: got %d %s, want 200", resp.StatusCode, body)
	}
}

// TestProxyLearnsStatedLimits: a limit the upstream states in its answer
// to a call becomes the fleet's, as one stated to a job does.
func TestProxyLearnsStatedLimits(t *testing.T) {
	f := newProxyFixture(t, nil)
	f.up.answer = func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("RateLimit-Policy", `"default";q=50;w=1`)
		w.Write([]byte(`{}`))
	}
	if resp, _ := f.call("GET", "/proxy/api/v1/x", ""); resp.StatusCode != 200 {
		t.Fatalf("got %d, want 200", resp.StatusCode)
	}
	st, err := elsewhere(t, f.rdb, f.upstream()).State(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, l := range st.Limits {
		if l.Source == leaky.SourceStated && l.Limit.Rate == 50 && l.Limit.Per == time.Second {
			found = true
		}
	}
	if !found {
		t.Errorf("got limits %+v, want the stated 50 per 1s among them", st.Limits)
	}
}

// TestProxyFollowsOperatorLimits: limits an operator sets (PUT
// /v1/upstreams/{name}/limits, here from another process's bucket) pace
// proxied calls within a second, as they pace the workers, and so does an
// operator's override of a partition on an upstream with no configured
// partition limits.
func TestProxyFollowsOperatorLimits(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a replica to hear a change: runs in make test")
	}
	f := newProxyFixture(t, func(u *shaper.Upstream) { u.Limits = []leaky.Limit{{Rate: 1000, Per: time.Second}} })
	other := elsewhere(t, f.rdb, f.upstream())
	ctx := context.Background()
	if err := other.PutPartitionLimits(ctx, "p1", []leaky.Limit{{Rate: 1, Per: 10 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	if _, err := other.PutLimits(ctx, []leaky.Limit{{Rate: 1, Per: 10 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	// Every replica applies a change within leaky.ApplyWithin.
	time.Sleep(leaky.ApplyWithin + 300*time.Millisecond)
	codes := func(n int, hdr ...string) []int {
		var out []int
		for i := 0; i < n; i++ {
			resp, _ := f.call("GET", "/proxy/api/v1/x", "", append([]string{"Shaper-Max-Wait", "1"}, hdr...)...)
			out = append(out, resp.StatusCode)
		}
		return out
	}
	if got := codes(2, "Shaper-Partition", "p1"); got[0] != 200 || got[1] != 429 {
		t.Errorf("two calls in partition p1 (overridden to 1 per 10s): got %v, want [200 429]", got)
	}
	// The upstream's operator limit (1 per 10s, the configured 1,000/s
	// no longer) was used by p1's call.
	if got := codes(1); got[0] != 429 {
		t.Errorf("a call outside p1 (operator's limit 1 per 10s, used): got %v, want [429]", got)
	}
	if n := len(f.up.requests()); n != 1 {
		t.Errorf("upstream got %d requests, want 1", n)
	}
}
