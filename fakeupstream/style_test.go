package fakeupstream

import (
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// These tests go through a real HTTP server, since what matters about a
// style is what a client sees on the wire.

// httpReq is one request to a served fake.
type httpReq struct {
	key     string            // bearer token when not empty
	path    string            // default /v1/things
	headers map[string]string // extra request headers
	body    string
	advance time.Duration // the fake clock moves this much first
}

type httpAnswer struct {
	status int
	header http.Header
	body   string
}

func serve(t *testing.T, cfg Config) (*Server, *fakeClock, func(httpReq) httpAnswer) {
	t.Helper()
	s, clock := newTestServer(t, cfg)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	do := func(r httpReq) httpAnswer {
		t.Helper()
		clock.Advance(r.advance)
		path := r.path
		if path == "" {
			path = "/v1/things"
		}
		hr, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(r.body))
		if err != nil {
			t.Fatal(err)
		}
		if r.key != "" {
			hr.Header.Set("Authorization", "Bearer "+r.key)
		}
		for k, v := range r.headers {
			hr.Header.Set(k, v)
		}
		resp, err := srv.Client().Do(hr)
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("reading the answer: %v", err)
		}
		return httpAnswer{resp.StatusCode, resp.Header, string(body)}
	}
	return s, clock, do
}

// checkHTTP holds an answer to its status, headers (absent for one that
// must not be sent) and, when not empty, its body.
func checkHTTP(t *testing.T, step string, a httpAnswer, status int, headers map[string]string, body string) {
	t.Helper()
	if a.status != status {
		t.Errorf("%s: status %d, want %d (body %q)", step, a.status, status, a.body)
	}
	for name, want := range headers {
		got, ok := a.header[http.CanonicalHeaderKey(name)]
		switch {
		case want == absent && ok:
			t.Errorf("%s: header %s: %q, want none", step, name, got)
		case want != absent && (len(got) != 1 || got[0] != want):
			t.Errorf("%s: header %s: %q, want %q", step, name, got, want)
		}
	}
	if body != "" && a.body != body {
		t.Errorf("%s: body\n got %q\nwant %q", step, a.body, body)
	}
}

func tokens(n int) map[string]string { return map[string]string{"X-Cost-Tokens": strconv.Itoa(n)} }

// TestIETFStyle pins the draft-10 fields byte for byte on successes, on
// 429s over the rate and the cost, and on a cost too large to ever fit.
func TestIETFStyle(t *testing.T) {
	const policy = `"default";q=3;w=1, "tokens";q=2000;w=1;qu="tokens"`
	steps := []struct {
		name    string
		r       httpReq
		status  int
		headers map[string]string
		body    string
	}{
		{"first", httpReq{key: "k", headers: tokens(400)}, 200, map[string]string{
			"RateLimit-Policy": policy,
			"RateLimit":        `"default";r=2;t=1, "tokens";r=1600;t=1`,
			"Retry-After":      absent,
			"X-Request-Id":     "req_1",
			"X-Fake-Usage":     "400",
		}, `{"id":"req_1","object":"echo","method":"POST","path":"/v1/things","idempotency_key":"","cost":400}` + "\n"},
		// Charged what it used, not what it declared.
		{"used less", httpReq{key: "k", headers: map[string]string{"X-Cost-Tokens": "400", UsageHeader: "40"}, advance: 300 * msec}, 200, map[string]string{
			"RateLimit-Policy": policy,
			"RateLimit":        `"default";r=1;t=1, "tokens";r=1560;t=1`,
			"X-Fake-Usage":     "40",
		}, ""},
		{"last of the second", httpReq{key: "k", advance: 300 * msec}, 200, map[string]string{
			"RateLimit": `"default";r=0;t=1, "tokens";r=1560;t=1`,
		}, ""},
		// The first request leaves the window 300ms later: Retry-After
		// rounds that up; t is when all three have left (900ms).
		{"over the rate", httpReq{key: "k", advance: 100 * msec}, 429, map[string]string{
			"RateLimit-Policy": policy,
			"RateLimit":        `"default";r=0;t=1, "tokens";r=1560;t=1`,
			"Retry-After":      "1",
			"Content-Type":     "text/plain; charset=utf-8",
		}, "rate limited: over 3 requests per 1s per API key\n"},
		{"another key is not held back", httpReq{key: "other", headers: tokens(1999)}, 200, map[string]string{
			"RateLimit": `"default";r=2;t=1, "tokens";r=1;t=1`,
		}, ""},
		{"over the cost", httpReq{key: "other", headers: tokens(2)}, 429, map[string]string{
			"RateLimit":   `"default";r=2;t=1, "tokens";r=1;t=1`,
			"Retry-After": "1",
		}, "rate limited: over 2000 tokens per 1s per API key\n"},
		// Waiting never helps, so no Retry-After; the fields still describe
		// the limits, which are whole again after two idle seconds.
		{"too large", httpReq{key: "k", headers: tokens(2001), advance: 2 * time.Second}, 429, map[string]string{
			"RateLimit-Policy": policy,
			"RateLimit":        `"default";r=3;t=0, "tokens";r=2000;t=0`,
			"Retry-After":      absent,
		}, "request too large: costs more than the limit of 2000 tokens per 1s allows at once\n"},
		{"malformed usage", httpReq{key: "k", headers: map[string]string{UsageHeader: "lots"}}, 400, map[string]string{
			"RateLimit": `"default";r=3;t=0, "tokens";r=2000;t=0`,
		}, `header X-Fake-Usage: "lots" is not a whole number of tokens used` + "\n"},
	}
	s, _, do := serve(t, Config{Rate: 3, CostLimit: &CostLimit{Rate: 2000, Per: time.Second}, Style: StyleIETF})
	for _, st := range steps {
		checkHTTP(t, st.name, do(st.r), st.status, st.headers, st.body)
	}
	rep := s.Report()
	want := map[string]int64{"requests": 1, "cost": 1, "too_large": 1}
	if rep.Rejected != 3 || !maps.Equal(rep.RejectedBy, want) || rep.Style != StyleIETF {
		t.Errorf("report: %d rejected, by limit %v, style %q; want 3, %v, ietf", rep.Rejected, rep.RejectedBy, rep.Style, want)
	}
	if !strings.Contains(rep.String(), "; 429s by limit: requests 1, cost 1, too_large 1; cost declared 2799, charged 2439; ietf style") {
		t.Errorf("summary %q", rep.String())
	}
}

// TestIETFStyleShapes: the policy follows each algorithm and optional
// limit: a token bucket states its rate, not its burst; a window that is
// not whole seconds is rounded up; the endpoint limit names its endpoint
// as the partition key.
func TestIETFStyleShapes(t *testing.T) {
	for _, tc := range []struct {
		name           string
		cfg            Config
		policy, state  string
		path           string
		advanceToCheck time.Duration
	}{
		{
			name:   "token bucket",
			cfg:    Config{Algorithm: TokenBucket, Rate: 10, Burst: 5},
			policy: `"default";q=10;w=1`,
			state:  `"default";r=4;t=1`, // one token back in 100ms
		},
		{
			name:   "fixed window, per 1500ms",
			cfg:    Config{Algorithm: FixedWindow, Rate: 7, Per: 1500 * msec},
			policy: `"default";q=7;w=2`,
			state:  `"default";r=6;t=2`, // the epoch starts a slot: 1.5s to go
		},
		{
			name:   "endpoint",
			cfg:    Config{Rate: 10, EndpointLimit: &Limit{Rate: 2, Per: time.Minute}},
			path:   "/v1/things",
			policy: `"default";q=10;w=1, "endpoint";q=2;w=60;pk=:UE9TVCAvdjEvdGhpbmdz:`,
			state:  `"default";r=9;t=1, "endpoint";r=1;t=60;pk=:UE9TVCAvdjEvdGhpbmdz:`,
		},
		{
			name:   "cost only, custom name",
			cfg:    Config{CostLimit: &CostLimit{Name: "credits", Rate: 90}},
			policy: `"credits";q=90;w=60;qu="credits"`,
			state:  `"credits";r=90;t=0`, // cost zero: nothing taken
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Style = StyleIETF
			_, _, do := serve(t, tc.cfg)
			checkHTTP(t, "first", do(httpReq{key: "k", path: tc.path}), 200, map[string]string{
				"RateLimit-Policy": tc.policy,
				"RateLimit":        tc.state,
			}, "")
		})
	}
	t.Run("no limit, no fields", func(t *testing.T) {
		_, _, do := serve(t, Config{Style: StyleIETF, Concurrency: 5})
		checkHTTP(t, "first", do(httpReq{}), 200, map[string]string{"RateLimit-Policy": absent, "RateLimit": absent}, "")
	})
}

// ietfItems reads this server's RateLimit field into policy name →
// parameters, as much of structured fields as the server writes.
func ietfItems(t *testing.T, field string) map[string]map[string]int64 {
	t.Helper()
	items := map[string]map[string]int64{}
	for _, item := range strings.Split(field, ", ") {
		parts := strings.Split(item, ";")
		name, err := strconv.Unquote(parts[0])
		if err != nil {
			t.Fatalf("item %q of %q: name %v", item, field, err)
		}
		params := map[string]int64{}
		for _, p := range parts[1:] {
			k, v, _ := strings.Cut(p, "=")
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				params[k] = n
			}
		}
		items[name] = params
	}
	return items
}

// TestIETFStateIsTrue: over a random run, for every algorithm, what the
// RateLimit field says holds. r more requests at the same instant are
// admitted and the next is refused; after t seconds the limit is whole
// again.
func TestIETFStateIsTrue(t *testing.T) {
	for _, alg := range []Algorithm{SlidingLog, FixedWindow, TokenBucket} {
		t.Run(string(alg), func(t *testing.T) {
			const q = 5
			_, _, do := serve(t, Config{Algorithm: alg, Rate: q, Per: 2500 * msec, Style: StyleIETF})
			rng := rand.New(rand.NewPCG(1, uint64(len(alg))))
			state := func(a httpAnswer) (r, tt int64) {
				d := ietfItems(t, a.header.Get("RateLimit"))["default"]
				return d["r"], d["t"]
			}
			for round := range 30 {
				var last httpAnswer
				for range 1 + rng.IntN(3) {
					last = do(httpReq{key: "k", advance: time.Duration(rng.IntN(900)) * msec})
				}
				r, _ := state(last)
				for i := range r {
					if a := do(httpReq{key: "k"}); a.status != 200 {
						t.Fatalf("round %d: request %d of the %d the field promised: %d", round, i+1, r, a.status)
					}
				}
				refused := do(httpReq{key: "k"})
				if refused.status != 429 {
					t.Fatalf("round %d: after the %d promised: %d, want 429", round, r, refused.status)
				}
				r, tt := state(refused)
				if r != 0 || tt < 1 {
					t.Fatalf("round %d: refused with r=%d t=%d, want r=0 and t at least 1", round, r, tt)
				}
				whole := do(httpReq{key: "k", advance: time.Duration(tt) * time.Second})
				if r, _ := state(whole); whole.status != 200 || r != q-1 {
					t.Fatalf("round %d: %ds later: %d with r=%d, want 200 with r=%d", round, tt, whole.status, r, q-1)
				}
			}
		})
	}
}

// TestBareStyle: no answer says anything about the limit, yet the report
// still counts every refusal by the limit that made it.
func TestBareStyle(t *testing.T) {
	s, _, do := serve(t, Config{Rate: 2, CostLimit: &CostLimit{Rate: 100}, Style: StyleBare})
	steps := []struct {
		r      httpReq
		status int
		body   string
	}{
		{httpReq{key: "k"}, 200, ""},
		{httpReq{key: "k", headers: tokens(50)}, 200, ""},
		{httpReq{key: "k"}, 429, "Too Many Requests\n"},
		{httpReq{key: "other", headers: tokens(101)}, 429, "Too Many Requests\n"},
		{httpReq{key: "other", headers: tokens(60)}, 200, ""},
		{httpReq{key: "other", headers: tokens(60)}, 429, "Too Many Requests\n"},
		{httpReq{key: "k", headers: tokens(-1), advance: time.Minute}, 400, "header X-Cost-Tokens: \"-1\" is not a whole number of tokens\n"},
	}
	for i, st := range steps {
		a := do(st.r)
		checkHTTP(t, fmt.Sprint("step ", i), a, st.status, nil, st.body)
		for name := range a.header {
			if n := strings.ToLower(name); strings.Contains(n, "ratelimit") || strings.Contains(n, "rate-limit") || n == "retry-after" {
				t.Errorf("step %d: header %s: %q, want no rate-limit header", i, name, a.header[name])
			}
		}
	}
	rep := s.Report()
	want := map[string]int64{"requests": 1, "cost": 1, "too_large": 1}
	if rep.Rejected != 3 || !maps.Equal(rep.RejectedBy, want) || rep.ByStatus[200] != 3 || rep.MaxAdmittedInWindow != 3 {
		t.Errorf("report: %d rejected, by limit %v, %d× 200, %d admitted in a window; want 3, %v, 3, 3",
			rep.Rejected, rep.RejectedBy, rep.ByStatus[200], rep.MaxAdmittedInWindow, want)
	}
}

// TestUsageSettlesTheCharge: jobs that declare 400 tokens and use 40 fit
// ten times as often once they say so, and the OpenAI answers agree with
// what was charged.
func TestUsageSettlesTheCharge(t *testing.T) {
	cfg := Config{CostLimit: &CostLimit{Rate: 2000, Per: time.Second}, Style: StyleOpenAI}
	const body = `{"model":"m","max_tokens":400}`
	admittedInASecond := func(headers map[string]string) (int, httpAnswer, *Server) {
		s, _, do := serve(t, cfg)
		for n := 0; ; n++ {
			a := do(httpReq{key: "k", body: body, headers: headers})
			if a.status != 200 {
				return n, a, s
			}
			if n > 100 {
				t.Fatalf("over 100 admitted at 2000 tokens per second")
			}
		}
	}

	n, refused, _ := admittedInASecond(nil)
	if n != 5 {
		t.Errorf("declared 400, no usage: %d admitted, want 5", n)
	}
	checkHTTP(t, "declared only", refused, 429, map[string]string{"X-Ratelimit-Remaining-Tokens": "0"},
		`{"error":{"message":"Rate limit reached for tokens per 1s: Limit 2000, Used 2000, Requested 400. Please try again in 1s.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`+"\n")

	n, refused, s := admittedInASecond(map[string]string{UsageHeader: "40"})
	if n != 50 {
		t.Errorf("declared 400, used 40: %d admitted, want 50", n)
	}
	checkHTTP(t, "used 40", refused, 429, map[string]string{"X-Ratelimit-Remaining-Tokens": "0"},
		`{"error":{"message":"Rate limit reached for tokens per 1s: Limit 2000, Used 2000, Requested 40. Please try again in 1s.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`+"\n")
	rep := s.Report()
	if rep.CostDeclared != 50*400 || rep.CostCharged != 50*40 {
		t.Errorf("report: declared %d, charged %d; want %d, %d", rep.CostDeclared, rep.CostCharged, 50*400, 50*40)
	}

	_, clock, do := serve(t, cfg)
	for i, st := range []struct {
		usage   string
		status  int
		headers map[string]string
		body    string
	}{
		{"40", 200, map[string]string{"X-Ratelimit-Remaining-Tokens": "1960", UsageHeader: "40"},
			`{"id":"req_1","object":"echo","method":"POST","path":"/v1/things","idempotency_key":"","cost":400,"usage":{"prompt_tokens":10,"completion_tokens":30,"total_tokens":40}}` + "\n"},
		// An overrun is charged too.
		{"1500", 200, map[string]string{"X-Ratelimit-Remaining-Tokens": "460", UsageHeader: "1500"},
			`{"id":"req_2","object":"echo","method":"POST","path":"/v1/things","idempotency_key":"","cost":400,"usage":{"prompt_tokens":375,"completion_tokens":1125,"total_tokens":1500}}` + "\n"},
		{"-3", 400, map[string]string{UsageHeader: absent},
			`{"error":{"message":"header X-Fake-Usage: \"-3\" is not a whole number of tokens used","type":"invalid_request_error","param":null,"code":null}}` + "\n"},
		{"2001", 429, map[string]string{"Retry-After": absent, "X-Ratelimit-Remaining-Tokens": "460"},
			`{"error":{"message":"Request too large for tokens per 1s: Limit 2000, Requested 2001. Send a smaller request.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}` + "\n"},
		// Nothing used costs nothing, even with the limit nearly spent.
		{"0", 200, map[string]string{"X-Ratelimit-Remaining-Tokens": "460", UsageHeader: "0"}, ""},
		{"460", 200, map[string]string{"X-Ratelimit-Remaining-Tokens": "0"}, ""},
	} {
		clock.Advance(msec)
		checkHTTP(t, fmt.Sprintf("usage %s (step %d)", st.usage, i), do(httpReq{key: "k", body: body, headers: map[string]string{UsageHeader: st.usage}}),
			st.status, st.headers, st.body)
	}
}

// TestUsageWithoutCostLimit: without a cost limit nothing is charged and
// no usage header is answered, but OpenAI's body still reports the usage
// the request gave.
func TestUsageWithoutCostLimit(t *testing.T) {
	_, _, do := serve(t, Config{Rate: 10, Style: StyleOpenAI})
	checkHTTP(t, "used 7", do(httpReq{headers: map[string]string{UsageHeader: "7"}}), 200, map[string]string{UsageHeader: absent},
		`{"id":"req_1","object":"echo","method":"POST","path":"/v1/things","idempotency_key":"","cost":0,"usage":{"prompt_tokens":1,"completion_tokens":6,"total_tokens":7}}`+"\n")
}
