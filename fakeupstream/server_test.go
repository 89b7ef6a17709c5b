package fakeupstream

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock is a clock tests move by hand.
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
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newTestServer(t *testing.T, cfg Config) (*Server, *fakeClock) {
	t.Helper()
	clock := &fakeClock{t: epoch}
	cfg.Now = clock.Now
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s, clock
}

// req describes one request to send.
type req struct {
	method, path string
	key          string // sent as a bearer token when not empty
	idem         string
	cost         string // X-Cost-Tokens when not empty
	body         string
	advance      time.Duration // clock moves this much before sending
}

func send(s *Server, clock *fakeClock, r req) *httptest.ResponseRecorder {
	if clock != nil {
		clock.Advance(r.advance)
	}
	method, path := r.method, r.path
	if method == "" {
		method = http.MethodPost
	}
	if path == "" {
		path = "/v1/things"
	}
	hr := httptest.NewRequest(method, path, strings.NewReader(r.body))
	if r.key != "" {
		hr.Header.Set("Authorization", "Bearer "+r.key)
	}
	if r.idem != "" {
		hr.Header.Set("Idempotency-Key", r.idem)
	}
	if r.cost != "" {
		hr.Header.Set("X-Cost-Tokens", r.cost)
	}
	w := httptest.NewRecorder()
	s.ServeHTTP(w, hr)
	return w
}

// absent marks a header that must not be sent.
const absent = "<absent>"

func checkAnswer(t *testing.T, w *httptest.ResponseRecorder, status int, headers map[string]string, body string) {
	t.Helper()
	if w.Code != status {
		t.Errorf("status %d, want %d (body %q)", w.Code, status, w.Body.String())
	}
	for name, want := range headers {
		got, ok := w.Header()[http.CanonicalHeaderKey(name)]
		switch {
		case want == absent && ok:
			t.Errorf("header %s: %q, want none", name, got)
		case want != absent && (len(got) != 1 || got[0] != want):
			t.Errorf("header %s: %q, want %q", name, got, want)
		}
	}
	if body != "" && w.Body.String() != body {
		t.Errorf("body:\n got %s\nwant %s", w.Body.String(), body)
	}
}

// TestRefusals pins every style's 429: status, headers and body, byte for
// byte, since clients (shaper's dispatcher among them) parse them.
func TestRefusals(t *testing.T) {
	twoAtOnce := []req{{key: "k"}, {key: "k"}}
	for _, tc := range []struct {
		name    string
		cfg     Config
		before  []req
		last    req
		headers map[string]string
		body    string
	}{
		{
			name:   "plain rate",
			cfg:    Config{Rate: 2, Per: time.Second},
			before: twoAtOnce,
			last:   req{key: "k", advance: 250 * msec},
			headers: map[string]string{
				"Content-Type": "text/plain; charset=utf-8",
				"Retry-After":  "1",
				"X-Request-Id": "req_3",
			},
			body: "rate limited: over 2 requests per 1s per API key\n",
		},
		{
			name:   "plain token bucket",
			cfg:    Config{Algorithm: TokenBucket, Rate: 10, Burst: 3},
			before: []req{{key: "k"}, {key: "k"}, {key: "k"}},
			last:   req{key: "k"},
			headers: map[string]string{
				"Retry-After": "1",
			},
			body: "rate limited: over 10 requests per 1s (burst 3) per API key\n",
		},
		{
			name:   "plain meter",
			cfg:    Config{Algorithm: Meter, Rate: 50},
			before: []req{{key: "k"}},
			last:   req{key: "k", advance: 19 * msec},
			headers: map[string]string{
				"Retry-After": "1",
			},
			body: "rate limited: over 50 requests per 1s per API key\n",
		},
		{
			name:   "openai meter",
			cfg:    Config{Algorithm: Meter, Rate: 50, Style: StyleOpenAI},
			before: []req{{key: "k"}},
			last:   req{key: "k", advance: 15 * msec},
			headers: map[string]string{
				"X-Ratelimit-Limit-Requests":     "1",
				"X-Ratelimit-Remaining-Requests": "0",
				"X-Ratelimit-Reset-Requests":     "5ms",
				"Retry-After":                    "1",
			},
			body: `{"error":{"message":"Rate limit reached for requests per 1s: Limit 1, Used 1, Requested 1. Please try again in 5ms.","type":"requests","param":null,"code":"rate_limit_exceeded"}}` + "\n",
		},
		{
			name:   "stripe rate",
			cfg:    Config{Rate: 2, Style: StyleStripe},
			before: twoAtOnce,
			last:   req{key: "k", advance: 250 * msec},
			headers: map[string]string{
				"Content-Type":               "application/json",
				"Stripe-Rate-Limited-Reason": "global-rate",
				"Request-Id":                 "req_3",
				"Retry-After":                absent,
				"X-Request-Id":               absent,
				"X-Ratelimit-Limit-Requests": absent,
			},
			body: `{"error":{"code":"rate_limit","doc_url":"https://stripe.com/docs/error-codes/rate-limit","message":"Request rate limit exceeded: this API key is limited to 2 requests per 1s. Retry with exponential backoff.","type":"invalid_request_error"}}` + "\n",
		},
		{
			name: "stripe endpoint",
			cfg:  Config{Rate: 10, EndpointLimit: &Limit{Rate: 1}, Style: StyleStripe},
			before: []req{
				{key: "k", method: "GET", path: "/v1/customers"},
				{key: "k", method: "POST", path: "/v1/customers"}, // another endpoint
				{key: "other", method: "GET", path: "/v1/customers"},
			},
			last: req{key: "k", method: "GET", path: "/v1/customers"},
			headers: map[string]string{
				"Stripe-Rate-Limited-Reason": "endpoint-rate",
				"Request-Id":                 "req_4",
			},
			body: `{"error":{"code":"rate_limit","doc_url":"https://stripe.com/docs/error-codes/rate-limit","message":"Request rate limit exceeded: this API key on this endpoint is limited to 1 request per 1s. Retry with exponential backoff.","type":"invalid_request_error"}}` + "\n",
		},
		{
			name:   "openai requests",
			cfg:    Config{Rate: 2, Style: StyleOpenAI},
			before: twoAtOnce,
			last:   req{key: "k", advance: 250 * msec},
			headers: map[string]string{
				"Content-Type":                   "application/json",
				"X-Ratelimit-Limit-Requests":     "2",
				"X-Ratelimit-Remaining-Requests": "0",
				"X-Ratelimit-Reset-Requests":     "750ms",
				"Retry-After":                    "1",
				"X-Request-Id":                   "req_3",
				"X-Ratelimit-Limit-Tokens":       absent,
			},
			body: `{"error":{"message":"Rate limit reached for requests per 1s: Limit 2, Used 2, Requested 1. Please try again in 750ms.","type":"requests","param":null,"code":"rate_limit_exceeded"}}` + "\n",
		},
		{
			name:   "openai fixed window",
			cfg:    Config{Algorithm: FixedWindow, Rate: 2, Style: StyleOpenAI},
			before: []req{{key: "k", advance: 900 * msec}, {key: "k"}},
			last:   req{key: "k", advance: 88 * msec},
			headers: map[string]string{
				"X-Ratelimit-Remaining-Requests": "0",
				"X-Ratelimit-Reset-Requests":     "12ms",
				"Retry-After":                    "1",
			},
			body: `{"error":{"message":"Rate limit reached for requests per 1s: Limit 2, Used 2, Requested 1. Please try again in 12ms.","type":"requests","param":null,"code":"rate_limit_exceeded"}}` + "\n",
		},
		{
			name:   "openai tokens",
			cfg:    Config{Rate: 100, CostLimit: &CostLimit{Rate: 1000}, Style: StyleOpenAI},
			before: []req{{key: "k", cost: "600"}},
			last:   req{key: "k", cost: "500", advance: 6 * time.Second},
			headers: map[string]string{
				"X-Ratelimit-Limit-Requests":     "100",
				"X-Ratelimit-Remaining-Requests": "100",
				"X-Ratelimit-Reset-Requests":     "0s",
				"X-Ratelimit-Limit-Tokens":       "1000",
				"X-Ratelimit-Remaining-Tokens":   "400",
				"X-Ratelimit-Reset-Tokens":       "54s",
				"Retry-After":                    "54",
			},
			body: `{"error":{"message":"Rate limit reached for tokens per 1m0s: Limit 1000, Used 600, Requested 500. Please try again in 54s.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}` + "\n",
		},
		{
			name: "openai tokens from the body",
			cfg:  Config{CostLimit: &CostLimit{Rate: 1000, Per: time.Second}, Style: StyleOpenAI},
			last: req{key: "k", body: `{"model":"m","max_tokens":1001}`},
			headers: map[string]string{
				"X-Ratelimit-Remaining-Tokens": "1000",
				"X-Ratelimit-Limit-Requests":   absent,
				"Retry-After":                  absent, // waiting never helps
			},
			body: `{"error":{"message":"Request too large for tokens per 1s: Limit 1000, Requested 1001. Send a smaller request.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}` + "\n",
		},
		{
			name:   "openai endpoint",
			cfg:    Config{Rate: 10, EndpointLimit: &Limit{Rate: 1}, Style: StyleOpenAI},
			before: []req{{key: "k"}},
			last:   req{key: "k", advance: 100 * msec},
			headers: map[string]string{
				"X-Ratelimit-Limit-Requests":     "1",
				"X-Ratelimit-Remaining-Requests": "0",
				"X-Ratelimit-Reset-Requests":     "900ms",
				"Retry-After":                    "1",
			},
			body: `{"error":{"message":"Rate limit reached for requests to this endpoint per 1s: Limit 1, Used 1, Requested 1. Please try again in 900ms.","type":"requests","param":null,"code":"rate_limit_exceeded"}}` + "\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, clock := newTestServer(t, tc.cfg)
			for i, r := range tc.before {
				if w := send(s, clock, r); w.Code != http.StatusOK {
					t.Fatalf("request %d before: status %d (%s), want 200", i, w.Code, w.Body)
				}
			}
			checkAnswer(t, send(s, clock, tc.last), http.StatusTooManyRequests, tc.headers, tc.body)
			if got := s.Report().Rejected; got != 1 {
				t.Errorf("report: %d rejected, want 1", got)
			}
		})
	}
}

func TestSuccess(t *testing.T) {
	for _, tc := range []struct {
		name    string
		style   Style
		headers map[string]string
		usage   string // the body's end, after the cost
	}{
		{"openai", StyleOpenAI, map[string]string{
			"X-Request-Id":                   "req_1",
			"X-Ratelimit-Limit-Requests":     "2",
			"X-Ratelimit-Remaining-Requests": "1",
			"X-Ratelimit-Reset-Requests":     "1s",
			"X-Ratelimit-Limit-Tokens":       "1000",
			"X-Ratelimit-Remaining-Tokens":   "700",
			"X-Ratelimit-Reset-Tokens":       "1m0s",
			"X-Fake-Usage":                   "300",
			"RateLimit":                      absent,
		}, `,"usage":{"prompt_tokens":75,"completion_tokens":225,"total_tokens":300}`},
		{"stripe", StyleStripe, map[string]string{
			"Request-Id":                 "req_1",
			"X-Ratelimit-Limit-Requests": absent,
			"X-Fake-Usage":               "300",
		}, ""},
		{"plain", StylePlain, map[string]string{
			"X-Request-Id":               "req_1",
			"X-Ratelimit-Limit-Requests": absent,
			"RateLimit":                  absent,
			"X-Fake-Usage":               "300",
		}, ""},
		{"ietf", StyleIETF, map[string]string{
			"X-Request-Id":               "req_1",
			"RateLimit-Policy":           `"default";q=2;w=1, "tokens";q=1000;w=60;qu="tokens"`,
			"RateLimit":                  `"default";r=1;t=1, "tokens";r=700;t=60`,
			"X-Ratelimit-Limit-Requests": absent,
			"Retry-After":                absent,
		}, ""},
		{"bare", StyleBare, map[string]string{
			"X-Request-Id":               "req_1",
			"RateLimit-Policy":           absent,
			"RateLimit":                  absent,
			"X-Ratelimit-Limit-Requests": absent,
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, clock := newTestServer(t, Config{Rate: 2, CostLimit: &CostLimit{Rate: 1000}, Style: tc.style})
			w := send(s, clock, req{key: "k", path: "/v1/chat/completions", idem: "idem-1", body: `{"max_tokens": 300}`})
			checkAnswer(t, w, http.StatusOK, tc.headers,
				`{"id":"req_1","object":"echo","method":"POST","path":"/v1/chat/completions","idempotency_key":"idem-1","cost":300`+tc.usage+"}\n")
		})
	}
}

// TestRefusalConsumesNothing: requests refused by one limit, as too large,
// or as malformed leave every other limit untouched.
func TestRefusalConsumesNothing(t *testing.T) {
	s, clock := newTestServer(t, Config{Rate: 2, CostLimit: &CostLimit{Rate: 1000}, EndpointLimit: &Limit{Rate: 5}, Style: StyleOpenAI})
	steps := []struct {
		r      req
		status int
	}{
		{req{key: "k", cost: "900"}, 200},
		{req{key: "k", cost: "200"}, 429},  // over the cost limit
		{req{key: "k", cost: "2000"}, 429}, // can never fit
		{req{key: "k", cost: "abc"}, 400},  // malformed
		// Had any of those counted, this would be the third request or the
		// 1001st token.
		{req{key: "k", cost: "100"}, 200},
	}
	var w *httptest.ResponseRecorder
	for i, st := range steps {
		if w = send(s, clock, st.r); w.Code != st.status {
			t.Fatalf("step %d: status %d (%s), want %d", i, w.Code, w.Body, st.status)
		}
	}
	checkAnswer(t, w, 200, map[string]string{
		"X-Ratelimit-Remaining-Requests": "0",
		"X-Ratelimit-Remaining-Tokens":   "0",
	}, "")
}

// holdingSleep replaces a server's latency with a wait the test controls,
// so requests stay in flight exactly as long as the test wants.
type holdingSleep struct {
	entered chan struct{}
	release chan struct{}
}

func holdRequests(s *Server) *holdingSleep {
	h := &holdingSleep{entered: make(chan struct{}, 100), release: make(chan struct{})}
	s.sleep = func(ctx context.Context, d time.Duration) error {
		h.entered <- struct{}{}
		select {
		case <-h.release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return h
}

func TestConcurrencyCap(t *testing.T) {
	s, _ := newTestServer(t, Config{Concurrency: 2, Rate: 3, Latency: time.Hour, Style: StyleStripe})
	hold := holdRequests(s)
	srv := httptest.NewServer(s)
	defer srv.Close()

	get := func(key string) (int, http.Header, string) {
		r, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/balance", nil)
		r.Header.Set("Authorization", "Bearer "+key)
		resp, err := srv.Client().Do(r)
		if err != nil {
			t.Errorf("GET: %v", err)
			return 0, nil, ""
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(body)
	}
	var wg sync.WaitGroup
	statuses := make(chan int, 3)
	for _, key := range []string{"k", "k", "other"} {
		wg.Go(func() {
			code, _, _ := get(key)
			statuses <- code
		})
	}
	for range 3 {
		<-hold.entered
	}
	// Two of k's requests are in flight: a third is refused at once; the
	// other key's request was not held back by k's.
	code, h, body := get("k")
	if code != http.StatusTooManyRequests || h.Get("Stripe-Rate-Limited-Reason") != "global-concurrency" {
		t.Errorf("third concurrent request: %d %q, want 429 global-concurrency", code, h.Get("Stripe-Rate-Limited-Reason"))
	}
	if want := "Too many concurrent requests: this API key may have at most 2 in flight."; !strings.Contains(body, want) {
		t.Errorf("body %s, want it to contain %q", body, want)
	}
	if got := s.Report().InFlight; got != 3 {
		t.Errorf("in flight %d, want 3", got)
	}
	close(hold.release)
	wg.Wait()
	close(statuses)
	for code := range statuses {
		if code != http.StatusOK {
			t.Errorf("held request answered %d, want 200", code)
		}
	}
	// The refused request took no slot of the rate limit (3 per second):
	// one more fits, then the limit refuses.
	if code, _, _ := get("k"); code != http.StatusOK {
		t.Errorf("after release: %d, want 200", code)
	}
	if code, h, _ := get("k"); code != http.StatusTooManyRequests || h.Get("Stripe-Rate-Limited-Reason") != "global-rate" {
		t.Errorf("fourth admitted: %d %q, want 429 global-rate", code, h.Get("Stripe-Rate-Limited-Reason"))
	}
	rep := s.Report()
	if rep.MaxInFlight != 3 || rep.InFlight != 0 {
		t.Errorf("max in flight %d, in flight %d; want 3 and 0", rep.MaxInFlight, rep.InFlight)
	}
	if want := map[int]int64{200: 4, 429: 2}; !mapsEqual(rep.ByStatus, want) {
		t.Errorf("by status %v, want %v", rep.ByStatus, want)
	}
}

func mapsEqual(a, b map[int]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestClientLeavingDuringLatency(t *testing.T) {
	s, _ := newTestServer(t, Config{Latency: time.Hour, Concurrency: 1})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w := httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequest("GET", "/x", nil).WithContext(ctx))
	if w.Body.Len() != 0 {
		t.Errorf("answered %q to a client that left, want nothing", w.Body)
	}
	rep := s.Report()
	if rep.ByStatus[StatusClientClosed] != 1 || rep.InFlight != 0 {
		t.Errorf("by status %v, in flight %d; want one %d and none in flight", rep.ByStatus, rep.InFlight, StatusClientClosed)
	}
	if recs := s.Records(); len(recs) != 1 || recs[0].Status != StatusClientClosed || !recs[0].Admitted {
		t.Errorf("records %+v, want one admitted with status %d", recs, StatusClientClosed)
	}
}

func failureRun(t *testing.T, cfg Config, n int) []int {
	t.Helper()
	s, clock := newTestServer(t, cfg)
	s.sleep = func(context.Context, time.Duration) error { return nil }
	codes := make([]int, n)
	for i := range codes {
		codes[i] = send(s, clock, req{key: "k"}).Code
	}
	return codes
}

func TestFailureInjection(t *testing.T) {
	const n = 400
	a := failureRun(t, Config{FailRate: 0.25, Seed: 7}, n)
	count := map[int]int{}
	for _, c := range a {
		count[c]++
	}
	if count[200]+count[500]+count[503] != n || count[500] == 0 || count[503] == 0 {
		t.Fatalf("statuses %v, want only 200, 500 and 503, each at least once", count)
	}
	if failed := count[500] + count[503]; failed < n/8 || failed > n*3/8 {
		t.Errorf("%d of %d failed, want about a quarter", failed, n)
	}
	if b := failureRun(t, Config{FailRate: 0.25, Seed: 7}, n); !slices.Equal(a, b) {
		t.Errorf("the same seed gave different answers")
	}
	if b := failureRun(t, Config{FailRate: 0.25, Seed: 7, Jitter: time.Millisecond}, n); !slices.Equal(a, b) {
		t.Errorf("turning jitter on changed which requests fail")
	}
	if b := failureRun(t, Config{FailRate: 0.25, Seed: 8}, n); slices.Equal(a, b) {
		t.Errorf("another seed gave the same answers")
	}
	for _, tc := range []struct {
		rate float64
		want int
	}{{0, 0}, {1, n}} {
		failed := 0
		for _, c := range failureRun(t, Config{FailRate: tc.rate, Seed: 1}, n) {
			if c != 200 {
				failed++
			}
		}
		if failed != tc.want {
			t.Errorf("fail rate %v: %d failed, want %d", tc.rate, failed, tc.want)
		}
	}
}

func TestFailureAnswers(t *testing.T) {
	for _, tc := range []struct {
		style Style
		body  string
	}{
		{StyleStripe, `{"error":{"message":"Simulated failure (500 Internal Server Error); retry with the same idempotency key.","type":"api_error"}}` + "\n"},
		{StyleOpenAI, `{"error":{"message":"Simulated failure (500 Internal Server Error); retry with the same idempotency key.","type":"server_error","param":null,"code":null}}` + "\n"},
		{StylePlain, "Simulated failure (500 Internal Server Error); retry with the same idempotency key.\n"},
	} {
		t.Run(string(tc.style), func(t *testing.T) {
			// Every request fails, half of them with 500: send until one does.
			s, clock := newTestServer(t, Config{FailRate: 1, Style: tc.style})
			var w *httptest.ResponseRecorder
			for range 20 {
				if w = send(s, clock, req{}); w.Code == 500 {
					break
				}
			}
			checkAnswer(t, w, 500, nil, tc.body)
		})
	}
}

func TestIdempotencyDuplicates(t *testing.T) {
	s, clock := newTestServer(t, Config{Rate: 2, Style: StyleStripe})
	for i, st := range []struct {
		r      req
		status int
	}{
		{req{key: "A", idem: "x"}, 200},
		{req{key: "A", idem: "x"}, 200}, // answered 2xx twice
		{req{key: "A", idem: "y"}, 429},
		{req{key: "A", idem: "y", advance: time.Second}, 200}, // retried, one 2xx
		{req{key: "B", idem: "x"}, 200},                       // another key's x
		{req{}, 200},                                          // no idempotency key at all
		{req{}, 200},
	} {
		if w := send(s, clock, st.r); w.Code != st.status {
			t.Fatalf("request %d: status %d, want %d", i, w.Code, st.status)
		}
	}
	rep := s.Report()
	if rep.IdempotencyKeys != 3 || rep.DuplicateKeys != 2 || rep.DuplicateSuccesses != 1 {
		t.Errorf("idempotency keys %d, duplicated %d, answered 2xx twice %d; want 3, 2, 1",
			rep.IdempotencyKeys, rep.DuplicateKeys, rep.DuplicateSuccesses)
	}
	want := map[string]KeyReport{
		"A": {Requests: 4, Succeeded: 3, Rejected: 1, MaxInWindow: 3, RatePerSecond: 3},
		"B": {Requests: 1, Succeeded: 1, MaxInWindow: 1},
		"":  {Requests: 2, Succeeded: 2, MaxInWindow: 2},
	}
	if len(rep.Keys) != len(want) {
		t.Errorf("keys %v, want %v", rep.Keys, want)
	}
	for k, w := range want {
		if got := rep.Keys[k]; got != w {
			t.Errorf("key %q: %+v, want %+v", k, got, w)
		}
	}
}

func TestMemoryCap(t *testing.T) {
	s, clock := newTestServer(t, Config{MaxRecords: 10})
	hold := holdRequests(s)
	s.cfg.Latency = time.Hour
	done := make(chan int)
	go func() { done <- send(s, clock, req{path: "/held"}).Code }()
	<-hold.entered
	s.sleep = func(context.Context, time.Duration) error { return nil }
	for i := range 24 {
		send(s, clock, req{path: fmt.Sprintf("/r%d", i+1), advance: msec})
	}
	// The held request's record is long gone when it finishes: it is
	// still counted, and overwrites nothing.
	close(hold.release)
	if code := <-done; code != 200 {
		t.Fatalf("held request: %d, want 200", code)
	}
	rep := s.Report()
	if rep.Total != 25 || rep.Records != 10 || rep.Dropped != 15 || rep.ByStatus[200] != 25 {
		t.Errorf("total %d, records %d, dropped %d, 200s %d; want 25, 10, 15, 25", rep.Total, rep.Records, rep.Dropped, rep.ByStatus[200])
	}
	recs := s.Records()
	if len(recs) != 10 {
		t.Fatalf("%d records, want 10", len(recs))
	}
	for i, r := range recs {
		want := Record{Seq: uint64(15 + i), At: time.Duration(15+i) * msec, Method: "POST", Path: fmt.Sprintf("/r%d", 15+i), Admitted: true, Status: 200}
		if r != want {
			t.Errorf("record %d: %+v, want %+v", i, r, want)
		}
	}
	if got := cap(s.records); got != 10 {
		t.Errorf("record buffer holds %d, want 10", got)
	}
}

func TestReportFigures(t *testing.T) {
	s, clock := newTestServer(t, Config{Per: time.Second})
	// Eleven requests 100ms apart, then a burst of three at once.
	for i := range 11 {
		adv := 100 * msec
		if i == 0 {
			adv = 0
		}
		send(s, clock, req{key: "k", advance: adv})
	}
	rep := s.Report()
	if rep.RatePerSecond != 10 || rep.MaxInWindow != 10 || rep.MaxInTenth != 1 || rep.MaxAdmittedInWindow != 10 {
		t.Errorf("rate %v, max in window %d, in tenth %d, admitted %d; want 10, 10, 1, 10",
			rep.RatePerSecond, rep.MaxInWindow, rep.MaxInTenth, rep.MaxAdmittedInWindow)
	}
	if want := (GapStats{Count: 10, Min: 100 * msec, P1: 100 * msec, P50: 100 * msec, P99: 100 * msec, Max: 100 * msec}); rep.Gaps != want {
		t.Errorf("gaps %+v, want %+v", rep.Gaps, want)
	}
	for range 3 {
		send(s, clock, req{key: "k", advance: 0})
	}
	rep = s.Report()
	if rep.MaxInWindow != 13 || rep.MaxInTenth != 4 || rep.Gaps.P1 != 0 {
		t.Errorf("after a burst: max in window %d, in tenth %d, gap p1 %v; want 13, 4, 0", rep.MaxInWindow, rep.MaxInTenth, rep.Gaps.P1)
	}
	if !strings.Contains(rep.String(), "14 requests (no limit), 14× 200") {
		t.Errorf("summary %q", rep.String())
	}
}

func TestReset(t *testing.T) {
	s, clock := newTestServer(t, Config{Rate: 1, Per: time.Hour})
	send(s, clock, req{key: "k"})
	if w := send(s, clock, req{key: "k"}); w.Code != 429 {
		t.Fatalf("second request: %d, want 429", w.Code)
	}
	s.Reset()
	if rep := s.Report(); rep.Total != 0 || rep.Records != 0 || len(rep.ByStatus) != 0 || len(rep.Keys) != 0 {
		t.Errorf("after reset: %+v, want nothing", rep)
	}
	if w := send(s, clock, req{key: "k"}); w.Code != 200 {
		t.Errorf("after reset: %d, want 200 (limits start afresh)", w.Code)
	}
	if recs := s.Records(); len(recs) != 1 || recs[0].Seq != 0 {
		t.Errorf("records after reset %+v, want one with Seq 0", recs)
	}
}

func TestControlEndpoints(t *testing.T) {
	s, _ := newTestServer(t, Config{Rate: 5})
	srv := httptest.NewServer(s)
	defer srv.Close()
	do := func(method, path string) *http.Response {
		r, _ := http.NewRequest(method, srv.URL+path, nil)
		resp, err := srv.Client().Do(r)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	do("POST", "/v1/charges")
	for _, tc := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{"GET", "/_thirdparty/report", 200, ""},
		{"POST", "/_thirdparty/report", 405, "GET, HEAD"},
		{"GET", "/_thirdparty/reset", 405, "POST"},
		{"GET", "/_thirdparty/nope", 404, ""},
	} {
		resp := do(tc.method, tc.path)
		if resp.StatusCode != tc.status || resp.Header.Get("Allow") != tc.allow {
			t.Errorf("%s %s: %d (Allow %q), want %d (Allow %q)", tc.method, tc.path, resp.StatusCode, resp.Header.Get("Allow"), tc.status, tc.allow)
		}
	}
	var rep Report
	if err := json.NewDecoder(do("GET", "/_thirdparty/report").Body).Decode(&rep); err != nil {
		t.Fatalf("decoding the report: %v", err)
	}
	if rep.Total != 1 || rep.ByStatus[200] != 1 || rep.Limit != "sliding_log: 5 requests per 1s per key" {
		t.Errorf("report %+v, want the one request only", rep)
	}
	if resp := do("POST", "/_thirdparty/reset"); resp.StatusCode != 204 {
		t.Errorf("reset: %d, want 204", resp.StatusCode)
	}
	if got := s.Report().Total; got != 0 {
		t.Errorf("after reset: total %d, want 0", got)
	}
}

func TestAPIKeys(t *testing.T) {
	s, _ := newTestServer(t, Config{})
	for _, auth := range []string{"Bearer k1", "bearer k2", "Basic c2tfdGVzdF8xOg==", "", "Token nope"} {
		r := httptest.NewRequest("GET", "/", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		s.ServeHTTP(httptest.NewRecorder(), r)
	}
	var got []string
	for _, r := range s.Records() {
		got = append(got, r.Key)
	}
	if want := []string{"k1", "k2", "sk_test_1", "", ""}; !slices.Equal(got, want) {
		t.Errorf("keys %q, want %q", got, want)
	}
}

func TestCost(t *testing.T) {
	big := `{"max_tokens": 1, "pad": "` + strings.Repeat("x", MaxBodyBytes) + `"}`
	for _, tc := range []struct {
		name   string
		cost   *CostLimit
		header map[string]string
		body   string
		status int
		want   int64
		msg    string
	}{
		{name: "header", cost: &CostLimit{Rate: 1000}, header: map[string]string{"X-Cost-Tokens": "250"}, status: 200, want: 250},
		{name: "header wins over body", cost: &CostLimit{Rate: 1000}, header: map[string]string{"X-Cost-Tokens": "7"}, body: `{"max_tokens":9}`, status: 200, want: 7},
		{name: "body", cost: &CostLimit{Rate: 1000}, body: `{"model":"m","max_tokens":42}`, status: 200, want: 42},
		{name: "body without max_tokens", cost: &CostLimit{Rate: 1000}, body: `{"model":"m"}`, status: 200},
		{name: "body not JSON", cost: &CostLimit{Rate: 1000}, body: "amount=100&currency=usd", status: 200},
		{name: "custom header", cost: &CostLimit{Name: "units", Header: "x-units", Rate: 10}, header: map[string]string{"X-Units": "3"}, status: 200, want: 3},
		{name: "default header follows the name", cost: &CostLimit{Name: "units", Rate: 10}, header: map[string]string{"X-Cost-Units": "4"}, status: 200, want: 4},
		{name: "no cost limit", header: map[string]string{"X-Cost-Tokens": "5"}, body: `{"max_tokens":9}`, status: 200},
		{name: "negative header", cost: &CostLimit{Rate: 1000}, header: map[string]string{"X-Cost-Tokens": "-1"}, status: 400,
			msg: `header X-Cost-Tokens: "-1" is not a whole number of tokens`},
		{name: "fractional header", cost: &CostLimit{Rate: 1000}, header: map[string]string{"X-Cost-Tokens": "1.5"}, status: 400,
			msg: `header X-Cost-Tokens: "1.5" is not a whole number of tokens`},
		{name: "negative max_tokens", cost: &CostLimit{Rate: 1000}, body: `{"max_tokens":-3}`, status: 400,
			msg: "max_tokens -3: must be a whole number, not negative"},
		{name: "fractional max_tokens", cost: &CostLimit{Rate: 1000}, body: `{"max_tokens":2.5}`, status: 400,
			msg: "max_tokens 2.5: must be a whole number, not negative"},
		{name: "huge body", cost: &CostLimit{Rate: 1000}, body: big, status: 413, msg: "body over 1048576 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newTestServer(t, Config{CostLimit: tc.cost})
			r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(tc.body))
			for k, v := range tc.header {
				r.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			s.ServeHTTP(w, r)
			if w.Code != tc.status {
				t.Fatalf("status %d (%s), want %d", w.Code, w.Body, tc.status)
			}
			if tc.msg != "" && w.Body.String() != tc.msg+"\n" {
				t.Errorf("body %q, want %q", w.Body, tc.msg+"\n")
			}
			if recs := s.Records(); recs[0].Cost != tc.want || recs[0].Admitted != (tc.status == 200) {
				t.Errorf("recorded cost %d, admitted %v; want %d, %v", recs[0].Cost, recs[0].Admitted, tc.want, tc.status == 200)
			}
		})
	}
}

// TestSlidingLogOverHTTP: a long randomized run through the handler never
// admits more than Rate in any window of length Per, and the report's own
// figure agrees.
func TestSlidingLogOverHTTP(t *testing.T) {
	s, clock := newTestServer(t, Config{Rate: 20, Per: 200 * msec})
	s.sleep = func(context.Context, time.Duration) error { return nil }
	for i := range 3000 {
		send(s, clock, req{key: "k", advance: time.Duration((i*7919)%19) * msec / 2})
	}
	rep := s.Report()
	if rep.MaxAdmittedInWindow != 20 || rep.Rejected == 0 || rep.MaxInWindow <= 20 {
		t.Errorf("most admitted in a window %d (want 20), rejected %d, most arrivals %d (want over 20)",
			rep.MaxAdmittedInWindow, rep.Rejected, rep.MaxInWindow)
	}
}

// TestSweepBoundsKeys: a stream of ever-new API keys does not grow the
// limiters' state without bound.
func TestSweepBoundsKeys(t *testing.T) {
	s, clock := newTestServer(t, Config{Rate: 1, Per: msec, EndpointLimit: &Limit{Rate: 1, Per: msec}, MaxRecords: 100})
	for i := range 3 * minSweep {
		send(s, clock, req{key: fmt.Sprint("key", i), advance: msec})
	}
	if n := s.request.size() + s.endpoint.size(); n > minSweep+2 {
		t.Errorf("limiters hold %d keys, want at most about %d", n, minSweep)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Algorithm: "leaky"}, `algorithm "leaky": want sliding_log, fixed_window, token_bucket or meter`},
		{Config{Rate: -1}, "rate -1: must not be negative (0 means no limit)"},
		{Config{Rate: 1, Per: 500 * time.Microsecond}, "per 500µs: must be at least 1ms"},
		{Config{Rate: 1, Per: -time.Second}, "per -1s: must be at least 1ms"},
		{Config{Rate: 1, Per: 400 * 24 * time.Hour}, "per 9600h0m0s: must be at most a year"},
		{Config{Rate: 5, Burst: 3}, "burst 3: only the token_bucket and meter algorithms have a burst"},
		{Config{Algorithm: TokenBucket, Rate: 5, Burst: -3}, "burst -3: must not be negative"},
		{Config{Algorithm: Meter, Rate: 5, Per: 1500 * time.Microsecond}, "per 1.5ms: the meter counts whole milliseconds"},
		{Config{Algorithm: Meter, Rate: 1, Per: 2000 * time.Second}, "1 per 33m20s: under one request per 1000s, too slow for the meter"},
		{Config{Burst: 3}, "burst 3: set rate too, or leave burst 0"},
		{Config{Algorithm: TokenBucket, Rate: 1 << 40, Per: time.Hour}, "1099511627776 per 1h0m0s: capacity × per is too large for the token bucket"},
		{Config{Concurrency: -1}, "concurrency -1: must not be negative (0 means no cap)"},
		{Config{EndpointLimit: &Limit{}}, "endpoint limit: rate 0: must be at least 1"},
		{Config{CostLimit: &CostLimit{}}, "cost limit: rate 0: must be at least 1"},
		{Config{CostLimit: &CostLimit{Name: "Tokens", Rate: 1}}, `cost limit: name "Tokens": want a lowercase name`},
		{Config{CostLimit: &CostLimit{Name: "requests", Rate: 1}}, `cost limit: name "requests"`},
		{Config{Style: "github"}, `style "github": want plain, stripe, openai, ietf or bare`},
		{Config{Style: StyleIETF, CostLimit: &CostLimit{Name: "default", Rate: 1}}, `cost limit: name "default": the ietf style names a request limit so; pick another`},
		{Config{Style: StyleIETF, CostLimit: &CostLimit{Name: "endpoint", Rate: 1}}, `cost limit: name "endpoint": the ietf style`},
		{Config{Latency: -1}, "latency -1ns: must not be negative"},
		{Config{Jitter: -1}, "jitter -1ns: must not be negative"},
		{Config{FailRate: 1.5}, "fail rate 1.5: must be between 0 and 1"},
		{Config{FailRate: math.NaN()}, "fail rate NaN: must be between 0 and 1"},
		{Config{MaxRecords: -1}, "max records -1: must not be negative (0 means 300000)"},
	} {
		_, err := New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v): error %v, want it to contain %q", tc.cfg, err, tc.want)
		}
	}
}

func TestConfigDefaults(t *testing.T) {
	s, err := New(Config{CostLimit: &CostLimit{Rate: 10}, EndpointLimit: &Limit{Rate: 2}})
	if err != nil {
		t.Fatal(err)
	}
	c := s.Config()
	if c.Algorithm != SlidingLog || c.Style != StylePlain || c.Per != time.Second ||
		c.IdempotencyHeader != "Idempotency-Key" || c.MaxRecords != DefaultMaxRecords || c.Now == nil {
		t.Errorf("defaults %+v", c)
	}
	if cl := *c.CostLimit; cl != (CostLimit{Name: "tokens", Header: "X-Cost-Tokens", Rate: 10, Per: time.Minute}) {
		t.Errorf("cost limit defaults %+v", cl)
	}
	if el := *c.EndpointLimit; el != (Limit{Rate: 2, Per: time.Second}) {
		t.Errorf("endpoint limit defaults %+v", el)
	}
	if got, want := c.describe(), "sliding_log: 2 requests per 1s per key and endpoint; 10 tokens per 1m0s per key"; got != want {
		t.Errorf("describe: %q, want %q", got, want)
	}
}

func TestIdempotencyHeaderConfigurable(t *testing.T) {
	s, _ := newTestServer(t, Config{IdempotencyHeader: "x-request-key"})
	r := httptest.NewRequest("POST", "/", nil)
	r.Header.Set("X-Request-Key", "abc")
	r.Header.Set("Idempotency-Key", "ignored")
	s.ServeHTTP(httptest.NewRecorder(), r)
	if got := s.Records()[0].IdempotencyKey; got != "abc" {
		t.Errorf("idempotency key %q, want abc", got)
	}
}

func TestOpenAIDuration(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"},
		{-time.Second, "0s"},
		{time.Nanosecond, "1ms"},
		{12 * msec, "12ms"},
		{11*msec + 200*time.Microsecond, "12ms"},
		{time.Second, "1s"},
		{1500 * msec, "1.5s"},
		{17*time.Second + 498*msec, "17.498s"},
		{6 * time.Minute, "6m0s"},
	} {
		if got := OpenAIDuration(tc.d); got != tc.want {
			t.Errorf("OpenAIDuration(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}
