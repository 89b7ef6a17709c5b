package httplimit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/tokenbucket"
)

var srv *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &srv) }

// RedisAddr lets the external examples reach the test server.
func RedisAddr() string { return srv.Addr }

func noLeaks(t *testing.T) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
}

func prefixes(s ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(s))
	for i, p := range s {
		out[i] = netip.MustParsePrefix(p)
	}
	return out
}

func TestKey(t *testing.T) {
	secretKey := "key:" + hashSecret("sk_live_123")
	trusted := prefixes("10.0.0.0/8", "fd00::/8")
	for _, tc := range []struct {
		name    string
		remote  string
		headers map[string][]string
		trusted []netip.Prefix
		custom  func(*http.Request) string
		want    string
	}{
		{name: "bearer", remote: "203.0.113.9:5555", headers: map[string][]string{"Authorization": {"Bearer sk_live_123"}}, want: secretKey},
		{name: "bearer scheme is case-insensitive", remote: "203.0.113.9:5555", headers: map[string][]string{"Authorization": {"bearer  sk_live_123 "}}, want: secretKey},
		{name: "x-api-key", remote: "203.0.113.9:5555", headers: map[string][]string{"X-Api-Key": {"sk_live_123"}}, want: secretKey},
		{name: "bearer wins over x-api-key", remote: "203.0.113.9:5555", headers: map[string][]string{"Authorization": {"Bearer sk_live_123"}, "X-Api-Key": {"other"}}, want: secretKey},
		{name: "basic auth is not an api key", remote: "203.0.113.9:5555", headers: map[string][]string{"Authorization": {"Basic dXNlcjpwdw=="}}, want: "ip:203.0.113.9"},
		{name: "peer ip", remote: "203.0.113.9:5555", want: "ip:203.0.113.9"},
		{name: "xff ignored without trusted proxies", remote: "203.0.113.9:5555", headers: map[string][]string{"X-Forwarded-For": {"198.51.100.1"}}, want: "ip:203.0.113.9"},
		{name: "xff ignored from an untrusted peer", remote: "203.0.113.9:5555", headers: map[string][]string{"X-Forwarded-For": {"198.51.100.1"}}, trusted: trusted, want: "ip:203.0.113.9"},
		{name: "xff from a trusted proxy", remote: "10.0.0.1:5555", headers: map[string][]string{"X-Forwarded-For": {"198.51.100.1"}}, trusted: trusted, want: "ip:198.51.100.1"},
		{name: "xff through two trusted proxies", remote: "10.0.0.1:5555", headers: map[string][]string{"X-Forwarded-For": {"198.51.100.1, 10.0.0.2"}}, trusted: trusted, want: "ip:198.51.100.1"},
		{name: "spoofed xff: right-most untrusted wins", remote: "10.0.0.1:5555", headers: map[string][]string{"X-Forwarded-For": {"1.1.1.1, 10.9.9.9, 198.51.100.1"}}, trusted: trusted, want: "ip:198.51.100.1"},
		{name: "spoofed xff split over header lines", remote: "10.0.0.1:5555", headers: map[string][]string{"X-Forwarded-For": {"1.1.1.1", "198.51.100.1, 10.0.0.2"}}, trusted: trusted, want: "ip:198.51.100.1"},
		{name: "garbage in xff stops at the last trusted hop", remote: "10.0.0.1:5555", headers: map[string][]string{"X-Forwarded-For": {"1.1.1.1, not-an-ip, 10.0.0.2"}}, trusted: trusted, want: "ip:10.0.0.2"},
		{name: "all hops trusted: left-most", remote: "10.0.0.1:5555", headers: map[string][]string{"X-Forwarded-For": {"10.1.1.1, 10.0.0.2"}}, trusted: trusted, want: "ip:10.1.1.1"},
		{name: "xff with port", remote: "10.0.0.1:5555", headers: map[string][]string{"X-Forwarded-For": {"198.51.100.1:4444"}}, trusted: trusted, want: "ip:198.51.100.1"},
		{name: "x-real-ip from a trusted proxy", remote: "10.0.0.1:5555", headers: map[string][]string{"X-Real-Ip": {"198.51.100.7"}}, trusted: trusted, want: "ip:198.51.100.7"},
		{name: "x-real-ip from an untrusted peer", remote: "203.0.113.9:5555", headers: map[string][]string{"X-Real-Ip": {"198.51.100.7"}}, trusted: trusted, want: "ip:203.0.113.9"},
		{name: "ipv6 keyed by /64", remote: "[2001:db8:1:2:aaaa::1]:443", want: "ip:2001:db8:1:2::/64"},
		{name: "ipv6 xff from an ipv6 proxy", remote: "[fd00::1]:443", headers: map[string][]string{"X-Forwarded-For": {"2001:db8:9::5"}}, trusted: trusted, want: "ip:2001:db8:9::/64"},
		{name: "4-in-6 peer is ipv4", remote: "[::ffff:10.0.0.1]:5555", headers: map[string][]string{"X-Forwarded-For": {"198.51.100.1"}}, trusted: trusted, want: "ip:198.51.100.1"},
		{name: "unreadable peer", remote: "@", want: "ip:unknown"},
		{name: "custom key", remote: "203.0.113.9:5555", custom: func(r *http.Request) string { return "tenant:" + r.Header.Get("X-Tenant") }, headers: map[string][]string{"X-Tenant": {"acme"}}, want: "tenant:acme"},
		{name: "custom key falls back", remote: "203.0.113.9:5555", custom: func(r *http.Request) string { return "" }, want: "ip:203.0.113.9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New(tokenbucket.NewLocal(tokenbucket.PerSecond(1, 1), nil), Config{TrustedProxies: tc.trusted, Key: tc.custom})
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tc.remote
			for k, vs := range tc.headers {
				for _, v := range vs {
					r.Header.Add(k, v)
				}
			}
			if got := m.Key(r); got != tc.want {
				t.Fatalf("got key %q, want %q", got, tc.want)
			}
		})
	}
}

// fakeClock is a settable clock for the token bucket under test.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

var okHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })

func serve(h http.Handler, remote string, headers ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", "/v1/jobs", nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Set(headers[i], headers[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func wantHeaders(t *testing.T, w *httptest.ResponseRecorder, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got := w.Header().Get(k); got != v {
			t.Errorf("header %s: got %q, want %q", k, got, v)
		}
	}
}

func TestHeadersAndRefusal(t *testing.T) {
	noLeaks(t)
	rdb := srv.Client(t)
	clock := &fakeClock{t: time.UnixMicro(1_800_000_000_000_000)}
	limit := tokenbucket.PerSecond(1, 10)
	prefix := fmt.Sprintf("t:headers:%d", time.Now().UnixNano())
	lim, err := tokenbucket.New(rdb, limit, tokenbucket.Config{Prefix: prefix, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(lim, Config{Policy: Policy{Name: "enqueue", Quota: limit.Capacity, Window: limit.Window()}})
	if err != nil {
		t.Fatal(err)
	}
	h := m.Wrap(okHandler)

	w := serve(h, "203.0.113.9:1", "Authorization", "Bearer secret-1")
	if w.Code != 200 || w.Body.String() != "ok" {
		t.Fatalf("first request: got %d %q, want 200 ok", w.Code, w.Body)
	}
	wantHeaders(t, w, map[string]string{
		"RateLimit-Policy":      `"enqueue";q=10;w=10`,
		"RateLimit":             `"enqueue";r=9;t=1`,
		"X-RateLimit-Limit":     "10",
		"X-RateLimit-Remaining": "9",
		"X-RateLimit-Reset":     "1",
		"Retry-After":           "",
	})
	for i := 0; i < 9; i++ {
		if w = serve(h, "203.0.113.9:1", "Authorization", "Bearer secret-1"); w.Code != 200 {
			t.Fatalf("request %d: got %d, want 200", i+2, w.Code)
		}
	}
	wantHeaders(t, w, map[string]string{"RateLimit": `"enqueue";r=0;t=10`, "X-RateLimit-Reset": "10"})

	clock.Advance(300 * time.Millisecond)
	w = serve(h, "203.0.113.9:1", "Authorization", "Bearer secret-1")
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("11th request: got %d, want 429", w.Code)
	}
	wantHeaders(t, w, map[string]string{
		"Content-Type":          "application/problem+json",
		"RateLimit-Policy":      `"enqueue";q=10;w=10`,
		"RateLimit":             `"enqueue";r=0;t=10`, // 9.7s, rounded up
		"X-RateLimit-Remaining": "0",
		"X-RateLimit-Reset":     "10",
		"Retry-After":           "1", // 0.7s, rounded up
	})
	var body map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatalf("429 body %q: %v", w.Body, err)
	}
	want := map[string]any{"type": ProblemRateLimited, "title": "Rate limit exceeded", "status": 429.0,
		"detail": `Rate limit "enqueue" exceeded; retry in 1 second.`, "retry_after": 1.0}
	if len(body) != len(want) {
		t.Fatalf("429 body: got %v, want %v", body, want)
	}
	for k, v := range want {
		if body[k] != v {
			t.Fatalf("429 body %s: got %v, want %v", k, body[k], v)
		}
	}

	// Another API key and an anonymous client have buckets of their own.
	if w = serve(h, "203.0.113.9:1", "X-API-Key", "secret-2"); w.Code != 200 {
		t.Fatalf("other key: got %d, want 200", w.Code)
	}
	if w = serve(h, "203.0.113.9:1"); w.Code != 200 {
		t.Fatalf("anonymous: got %d, want 200", w.Code)
	}
	keys, err := rdb.Keys(context.Background(), prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 3 {
		t.Fatalf("got keys %v, want 3 buckets", keys)
	}
	for _, k := range keys {
		if strings.Contains(k, "secret") {
			t.Fatalf("key %q holds an API key in the clear", k)
		}
	}
}

func TestCostAboveCapacity(t *testing.T) {
	m, err := New(tokenbucket.NewLocal(tokenbucket.PerSecond(1, 5), nil), Config{Cost: func(*http.Request) int64 { return 6 }})
	if err != nil {
		t.Fatal(err)
	}
	w := serve(m.Wrap(okHandler), "203.0.113.9:1")
	if w.Code != http.StatusBadRequest || w.Header().Get("Content-Type") != "application/problem+json" || !strings.Contains(w.Body.String(), "exceeds capacity") {
		t.Fatalf("got %d %q %q, want 400 problem+json naming the capacity", w.Code, w.Header().Get("Content-Type"), w.Body)
	}
}

func TestWriteHeadersRounding(t *testing.T) {
	for _, tc := range []struct {
		policy Policy
		res    shaper.Result
		want   map[string]string
	}{
		{Policy{}, shaper.Result{Allowed: true, Limit: 5, Remaining: 4, ResetAfter: 1200 * time.Millisecond},
			map[string]string{"RateLimit-Policy": `"default";q=5;w=1`, "RateLimit": `"default";r=4;t=2`, "X-RateLimit-Limit": "5", "X-RateLimit-Reset": "2", "Retry-After": ""}},
		{Policy{Name: `a"b\c`, Quota: 100, Window: 90 * time.Second}, shaper.Result{Limit: 100, RetryAfter: 10 * time.Millisecond, ResetAfter: 0},
			map[string]string{"RateLimit-Policy": `"a\"b\\c";q=100;w=90`, "RateLimit": `"a\"b\\c";r=0;t=0`, "Retry-After": "1", "X-RateLimit-Reset": "0"}},
		{Policy{Name: "enqueue", Quota: 10, Window: 10 * time.Second}, shaper.Result{Limit: 10, RetryAfter: 2001 * time.Millisecond, ResetAfter: 5 * time.Second},
			map[string]string{"Retry-After": "3", "X-RateLimit-Reset": "5", "RateLimit": `"enqueue";r=0;t=5`}},
	} {
		w := httptest.NewRecorder()
		WriteHeaders(w.Header(), tc.policy, tc.res)
		wantHeaders(t, w, tc.want)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	loc := tokenbucket.NewLocal(tokenbucket.PerSecond(1, 1), nil)
	for _, tc := range []struct {
		l   shaper.Limiter
		cfg Config
	}{
		{nil, Config{}},
		{loc, Config{OnRedisError: shaper.FailLocal}},
		{loc, Config{Policy: Policy{Name: "é"}}},
		{loc, Config{Policy: Policy{Quota: -1}}},
		{loc, Config{TrustedProxies: []netip.Prefix{{}}}},
	} {
		if _, err := New(tc.l, tc.cfg); err == nil {
			t.Errorf("New(%v, %+v): got no error, want one", tc.l, tc.cfg)
		}
	}
}

// TestFailurePolicies stops Redis and checks what each policy does to
// requests, that it logs at ERROR and that Observe counts every decision.
func TestFailurePolicies(t *testing.T) {
	noLeaks(t)
	dead := redistest.New(t)
	rdb := redis.NewClient(&redis.Options{Addr: dead.Addr, MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second})
	t.Cleanup(func() { rdb.Close() })
	limit := tokenbucket.Limit{Capacity: 2, Refill: 1, Per: time.Hour}
	lim, err := tokenbucket.New(rdb, limit, tokenbucket.Config{Prefix: "t:policy"})
	if err != nil {
		t.Fatal(err)
	}
	if err := dead.Kill(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		policy shaper.OnRedisError
		want   []int
	}{
		{shaper.FailOpen, []int{200, 200, 200}},
		{shaper.FailClosed, []int{429, 429, 429}},
		{shaper.FailLocal, []int{200, 200, 429}},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			var logs bytes.Buffer
			var mu sync.Mutex
			observed := 0
			m, err := New(lim, Config{
				Policy:       Policy{Name: "enqueue", Quota: limit.Capacity, Window: limit.Window()},
				OnRedisError: tc.policy,
				Local:        tokenbucket.NewLocal(limit, nil),
				Logger:       slog.New(slog.NewTextHandler(&logs, nil)),
				Observe: func(p shaper.OnRedisError, err error) {
					mu.Lock()
					defer mu.Unlock()
					if p != tc.policy || err == nil {
						t.Errorf("Observe(%v, %v): want %v and the Redis error", p, err, tc.policy)
					}
					observed++
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			h := m.Wrap(okHandler)
			for i, code := range tc.want {
				w := serve(h, "203.0.113.9:1", "Authorization", "Bearer k")
				if w.Code != code {
					t.Fatalf("request %d: got %d %q, want %d", i, w.Code, w.Body, code)
				}
				if code == 429 && w.Header().Get("Retry-After") == "" {
					t.Fatalf("request %d: 429 without Retry-After", i)
				}
				if w.Header().Get("RateLimit-Policy") != `"enqueue";q=2;w=7200` {
					t.Fatalf("request %d: got RateLimit-Policy %q, want the configured policy", i, w.Header().Get("RateLimit-Policy"))
				}
			}
			if observed != len(tc.want) {
				t.Fatalf("got %d Observe calls, want %d", observed, len(tc.want))
			}
			if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "policy="+tc.policy.String()) {
				t.Fatalf("got log %q, want an ERROR record naming the policy", logs.String())
			}
		})
	}
}
