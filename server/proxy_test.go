package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/metrics"
	"github.com/shaperhq/shaper/queue"
	"github.com/shaperhq/shaper/status"
	"github.com/shaperhq/shaper/tokenbucket"
)

// seen is one request as the test upstream received it.
type seen struct {
	at     time.Time
	method string
	uri    string
	header http.Header
	body   string
}

// recorder is a test upstream: it records every request and answers
// with answer (200 {"ok":true} when nil).
type recorder struct {
	mu     sync.Mutex
	got    []seen
	answer func(w http.ResponseWriter, r *http.Request, n int)
}

func (u *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.got = append(u.got, seen{at: time.Now(), method: r.Method, uri: r.RequestURI, header: r.Header.Clone(), body: string(b)})
	n := len(u.got)
	answer := u.answer
	u.mu.Unlock()
	if answer != nil {
		answer(w, r, n)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write([]byte(`{"ok":true}`))
}

func (u *recorder) requests() []seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seen(nil), u.got...)
}

type proxyFixture struct {
	t   *testing.T
	rdb redis.UniversalClient
	up  *recorder
	s   *Server
	hs  *httptest.Server
	reg *prometheus.Registry
}

// newProxyFixture serves the API with upstream "api" (tune adjusts it)
// at a local recorder.
func newProxyFixture(t *testing.T, tune func(*shaper.Upstream)) *proxyFixture {
	t.Helper()
	rdb := srv.Client(t)
	rdb.FlushAll(context.Background())
	return newProxyFixtureOn(t, rdb, &recorder{}, tune)
}

func newProxyFixtureOn(t *testing.T, rdb redis.UniversalClient, rec *recorder, tune func(*shaper.Upstream), tuneAPI ...func(*Config)) *proxyFixture {
	t.Helper()
	ups := httptest.NewServer(rec)
	t.Cleanup(ups.Close)
	u := shaper.Upstream{Name: "api", BaseURL: ups.URL + "/base", Limits: []leaky.Limit{leaky.PerSecond(1000)},
		Headers: map[string]string{"Authorization": "Bearer upstream-secret", "X-Vendor": "v"},
		Lanes:   map[string]int{"default": 1, "bulk": 1}}
	if tune != nil {
		tune(&u)
	}
	q, err := queue.New(rdb, queue.Config{Upstreams: []shaper.Upstream{u,
		{Name: "handled", Limits: []leaky.Limit{leaky.PerSecond(10)}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	st, err := status.NewReader(rdb, q, "")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg := Config{
		Keys:         []Key{{Name: "billing", Tenant: "billing", Secret: "billing-secret"}},
		Admission:    tokenbucket.Limit{Capacity: 1000, Refill: 1000, Per: time.Second},
		MaxBodyBytes: 4096,
		Logger:       quiet(),
		Metrics:      metrics.New(reg),
		Registry:     reg,
	}
	for _, tune := range tuneAPI {
		tune(&cfg)
	}
	s, err := New(rdb, q, st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	return &proxyFixture{t: t, rdb: rdb, up: rec, s: s, hs: hs, reg: reg}
}

// settled waits until serve has finished n calls to upstream api: a
// call's answer reaches the caller before its handler has given its
// slot's lease back, and a test that holds Redis next must not hold that
// (nor the connection the handler still has).
func (f *proxyFixture) settled(n int) {
	f.t.Helper()
	done := func() float64 {
		var sum float64
		for _, code := range []string{"200", "429", "503", "502"} {
			sum += testutil.ToFloat64(f.s.m.ProxyCalls.WithLabelValues("api", code))
		}
		return sum
	}
	for end := time.Now().Add(10 * time.Second); done() < float64(n); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			f.t.Fatalf("serve finished %v of %d calls in 10 s", done(), n)
		}
	}
}

// call sends a proxied call with the shaper key unless headers carry
// another Authorization; headers are name, value pairs.
func (f *proxyFixture) call(method, path, body string, headers ...string) (*http.Response, string) {
	f.t.Helper()
	resp, err := f.send(context.Background(), method, path, body, headers...)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func (f *proxyFixture) send(ctx context.Context, method, path, body string, headers ...string) (*http.Response, error) {
	req, _ := http.NewRequestWithContext(ctx, method, f.hs.URL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer billing-secret")
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "" {
			req.Header.Del(headers[i])
			continue
		}
		req.Header.Add(headers[i], headers[i+1])
	}
	return http.DefaultClient.Do(req)
}

// TestProxyHeaders: the upstream gets the caller's request with the
// upstream's configured headers, never the shaper key, a Shaper-* header
// or a hop-by-hop one; Shaper-Upstream-Authorization becomes
// Authorization; the path's encoding and the query arrive as sent.
func TestProxyHeaders(t *testing.T) {
	f := newProxyFixture(t, nil)
	resp, body := f.call("POST", "/proxy/api/v1/a%2Fb/c?x=1&y=%20", `{"n":1}`,
		"Content-Type", "application/json",
		"Idempotency-Key", "idem-1", "OpenAI-Organization", "org-1", "Stripe-Version", "2024-06-20",
		"Shaper-Partition", "p1", "Shaper-Lane", "bulk", "Shaper-Max-Wait", "5", "Shaper-Other", "x",
		"Connection", "X-Hop", "X-Hop", "secret-hop", "Keep-Alive", "timeout=5", "Proxy-Authorization", "Basic eA==",
		"X-API-Key", "billing-secret")
	if resp.StatusCode != 200 || body != `{"ok":true}` {
		t.Fatalf("got %d %q, want 200 {\"ok\":true}", resp.StatusCode, body)
	}
	if resp.Header.Get("Shaper-Queue-Time") == "" {
		t.Errorf("got no Shaper-Queue-Time on the answer")
	}
	got := f.up.requests()
	if len(got) != 1 {
		t.Fatalf("upstream got %d requests, want 1", len(got))
	}
	r := got[0]
	if r.method != "POST" || r.uri != "/base/v1/a%2Fb/c?x=1&y=%20" || r.body != `{"n":1}` {
		t.Errorf("upstream got %s %s %q, want POST /base/v1/a%%2Fb/c?x=1&y=%%20 {\"n\":1}", r.method, r.uri, r.body)
	}
	for k, want := range map[string]string{"Authorization": "Bearer upstream-secret", "X-Vendor": "v", "Idempotency-Key": "idem-1",
		"Openai-Organization": "org-1", "Stripe-Version": "2024-06-20", "Content-Type": "application/json"} {
		if g := r.header.Get(k); g != want {
			t.Errorf("upstream got %s %q, want %q", k, g, want)
		}
	}
	for k, vs := range r.header {
		if strings.HasPrefix(k, "Shaper-") || k == "X-Api-Key" || k == "X-Hop" || k == "Keep-Alive" || k == "Proxy-Authorization" {
			t.Errorf("upstream got header %s: %q, want none", k, vs)
		}
		for _, v := range vs {
			if strings.Contains(v, "billing-secret") {
				t.Errorf("upstream got the shaper key in %s", k)
			}
		}
	}

	// The caller's own credential goes as Authorization.
	resp, _ = f.call("GET", "/proxy/api/v1/me", "", "Shaper-Upstream-Authorization", "Bearer sk-customer")
	if resp.StatusCode != 200 {
		t.Fatalf("got %d, want 200", resp.StatusCode)
	}
	got = f.up.requests()
	if a := got[len(got)-1].header.Get("Authorization"); a != "Bearer sk-customer" {
		t.Errorf("upstream got Authorization %q, want the caller's own Bearer sk-customer", a)
	}
}

// TestProxyRefusals: what is refused is answered as problem+json and
// never sent.
func TestProxyRefusals(t *testing.T) {
	f := newProxyFixture(t, nil)
	big := strings.Repeat("x", 5000)
	for _, c := range []struct {
		name, method, path, body string
		headers                  []string
		want                     int
	}{
		{"no key", "GET", "/proxy/api/v1/x", "", []string{"Authorization", ""}, 401},
		{"unknown key", "GET", "/proxy/api/v1/x", "", []string{"Authorization", "", "Authorization", "Bearer nope"}, 401},
		{"unknown upstream", "GET", "/proxy/nope/v1/x", "", nil, 404},
		{"handler upstream", "GET", "/proxy/handled/v1/x", "", nil, 404},
		{"dot segment", "GET", "/proxy/api/v1/%2e%2e/x", "", nil, 400},
		{"raw dot segment", "GET", "/proxy/api/v1/../../x", "", nil, 400},
		{"empty segment", "GET", "/proxy/api/v1//x", "", nil, 400},
		{"bad lane", "GET", "/proxy/api/v1/x", "", []string{"Shaper-Lane", "nope"}, 400},
		{"bad cost", "GET", "/proxy/api/v1/x", "", []string{"Shaper-Cost", "tokens=5"}, 400},
		{"bad cost syntax", "GET", "/proxy/api/v1/x", "", []string{"Shaper-Cost", "tokens=="}, 400},
		{"bad max wait", "GET", "/proxy/api/v1/x", "", []string{"Shaper-Max-Wait", "soon"}, 400},
		{"too large", "POST", "/proxy/api/v1/x", big, nil, 413},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, body := f.call(c.method, c.path, c.body, c.headers...)
			if resp.StatusCode != c.want {
				t.Fatalf("got %d %s, want %d", resp.StatusCode, body, c.want)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("got Content-Type %q, want application/problem+json", ct)
			}
			var p map[string]any
			if err := json.Unmarshal([]byte(body), &p); err != nil || p["detail"] == "" {
				t.Errorf("got body %q, want a problem with a detail", body)
			}
		})
	}
	if n := len(f.up.requests()); n != 0 {
		t.Errorf("upstream got %d requests, want none", n)
	}
}

// TestProxyStreams: an answer the upstream sends in parts reaches the
// caller part by part, as it is sent, not at the end.
func TestProxyStreams(t *testing.T) {
	f := newProxyFixture(t, nil)
	const parts, gap = 4, 150 * time.Millisecond
	f.up.answer = func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for i := range parts {
			io.WriteString(w, "data: part\n\n")
			rc.Flush()
			if i < parts-1 {
				time.Sleep(gap)
			}
		}
	}
	resp, err := f.send(context.Background(), "POST", "/proxy/api/v1/chat", `{"stream":true}`)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("got Content-Type %q, want text/event-stream", ct)
	}
	start := time.Now()
	var arrivals []time.Duration
	buf := make([]byte, 64)
	got := ""
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			got += string(buf[:n])
			arrivals = append(arrivals, time.Since(start))
		}
		if err != nil {
			break
		}
	}
	if got != strings.Repeat("data: part\n\n", parts) {
		t.Fatalf("got %q, want %d parts", got, parts)
	}
	// The first part came long before the last was sent.
	if len(arrivals) < parts || arrivals[0] > gap {
		t.Errorf("got the parts at %v, want %d reads, the first within %v", arrivals, parts, gap)
	}
}

// TestProxyAdmission: a call pays its key's admission as an enqueue does;
// refused, it is shaper's 429 with the rate-limit headers, naming
// admission, and nothing is sent.
func TestProxyAdmission(t *testing.T) {
	rdb := srv.Client(t)
	rdb.FlushAll(context.Background())
	f := newProxyFixtureOn(t, rdb, &recorder{}, nil, func(c *Config) {
		c.Admission = tokenbucket.Limit{Capacity: 1, Refill: 1, Per: time.Hour}
	})
	if resp, body := f.call("GET", "/proxy/api/v1/x", ""); resp.StatusCode != 200 || resp.Header.Get("RateLimit") != "" {
		t.Fatalf("first call: got %d %s (RateLimit %q), want 200 without admission's headers, which would pass for the upstream's", resp.StatusCode, body, resp.Header.Get("RateLimit"))
	}
	resp, body := f.call("GET", "/proxy/api/v1/x", "")
	if resp.StatusCode != 429 || !strings.Contains(body, "admission") || resp.Header.Get("RateLimit-Policy") == "" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("second call: got %d %s, want shaper's 429 naming admission, with RateLimit-Policy and Retry-After", resp.StatusCode, body)
	}
	if n := len(f.up.requests()); n != 1 {
		t.Errorf("upstream got %d requests, want 1", n)
	}
}

// TestProxyListener: ProxyHandler serves the upstream at the root of a
// listener of its own (proxy.listen), for SDKs that set host and port.
func TestProxyListener(t *testing.T) {
	f := newProxyFixture(t, nil)
	hs := httptest.NewServer(f.s.ProxyHandler("api"))
	defer hs.Close()
	req, _ := http.NewRequest("POST", hs.URL+"/v1/customers?expand[]=x", strings.NewReader("email=a%40b.c"))
	req.Header.Set("Authorization", "Bearer billing-secret")
	req.Header.Set("Stripe-Version", "2024-06-20")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("got %d, want 200", resp.StatusCode)
	}
	got := f.up.requests()
	if len(got) != 1 || got[0].uri != "/base/v1/customers?expand[]=x" || got[0].body != "email=a%40b.c" || got[0].header.Get("Authorization") != "Bearer upstream-secret" {
		t.Errorf("upstream got %+v, want POST /base/v1/customers?expand[]=x with the form and the upstream's key", got)
	}
	if f.s.ProxyHandler("handled") != nil || f.s.ProxyHandler("nope") != nil {
		t.Errorf("got a proxy handler for an upstream that is not proxied")
	}
}
