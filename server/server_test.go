package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/client"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/internal/testsupport/apicheck"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/metrics"
	"github.com/shaperhq/shaper/queue"
	"github.com/shaperhq/shaper/status"
	"github.com/shaperhq/shaper/tokenbucket"
)

var srv *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &srv) }

type fixture struct {
	t   *testing.T
	rdb redis.UniversalClient
	q   *queue.Queue
	s   *Server
	hs  *httptest.Server
	reg *prometheus.Registry
	// hc sends every request of the tests: each exchange is checked
	// against the OpenAPI document (internal/testsupport/apicheck), so an
	// undocumented status, header or field fails the test that met it.
	hc *http.Client
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newFixture(t *testing.T, admission tokenbucket.Limit, maxPending int64) *fixture {
	t.Helper()
	rdb := srv.Client(t)
	rdb.FlushAll(context.Background())
	return newFixtureOn(t, rdb, admission, maxPending, nil)
}

// newFixtureOn builds the API on rdb; tune, when set, adjusts its config.
func newFixtureOn(t *testing.T, rdb redis.UniversalClient, admission tokenbucket.Limit, maxPending int64, tune func(*Config)) *fixture {
	t.Helper()
	stripe := []leaky.Limit{leaky.PerSecond(100)}
	openai := []leaky.Limit{leaky.PerMinute(5000), {Rate: 800000, Per: time.Minute, Cost: "tokens"}}
	mail := []leaky.Limit{leaky.PerSecond(10)}
	retry := shaper.Retry{MaxAttempts: 3}
	ups := []shaper.Upstream{
		{Name: "stripe", BaseURL: "https://api.stripe.com", Limits: stripe, Lanes: map[string]int{"default": 1, "bulk": 1},
			Headers: map[string]string{"Authorization": "Bearer sk"}, IdempotencyHeader: "Idempotency-Key",
			MaxPending: maxPending, Retry: retry, ResultRetention: time.Hour, DeadRetention: time.Hour},
		{Name: "openai", BaseURL: "https://api.openai.com", Limits: openai, MaxPending: maxPending, Retry: retry, ResultRetention: time.Hour, DeadRetention: time.Hour,
			// Each partition (a customer) may send 25000 tokens at once, big-customer 200000
			// (the default burst of a cost limit: 25% of its rate).
			PartitionLimits:    []leaky.Limit{{Rate: 100000, Per: time.Minute, Cost: "tokens"}},
			PartitionOverrides: map[string][]leaky.Limit{"big-customer": {{Rate: 800000, Per: time.Minute, Cost: "tokens"}}}},
		{Name: "mail", Limits: mail, MaxPending: maxPending, Retry: retry, ResultRetention: time.Hour, DeadRetention: time.Hour},
	}
	q, err := queue.New(rdb, queue.Config{Upstreams: ups})
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
		Keys: []Key{
			{Name: "billing", Tenant: "billing", Secret: "billing-secret"},
			{Name: "ops", Tenant: "ops", Secret: "ops-secret", Admin: true},
		},
		Admission:    admission,
		MaxBodyBytes: 4096,
		MaxBatch:     50,
		Logger:       quiet(),
		Metrics:      metrics.New(reg),
		Registry:     reg,
	}
	if tune != nil {
		tune(&cfg)
	}
	s, err := New(rdb, q, st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	chk, err := apicheck.New()
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, rdb: rdb, q: q, s: s, hs: hs, reg: reg, hc: chk.Client(t)}
}

// do sends a request with the billing key (unless headers say otherwise).
func (f *fixture) do(method, path, body string, headers ...string) (*http.Response, map[string]any) {
	f.t.Helper()
	req, _ := http.NewRequest(method, f.hs.URL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer billing-secret")
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "" {
			req.Header.Del(headers[i])
		} else {
			req.Header.Set(headers[i], headers[i+1])
		}
	}
	resp, err := f.hc.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	json.Unmarshal(raw, &out)
	return resp, out
}

func (f *fixture) backlog() int64 {
	var n int64
	for _, up := range []string{"stripe", "openai", "mail"} {
		c, err := f.q.Counts(context.Background(), up)
		if err != nil {
			f.t.Fatal(err)
		}
		for _, l := range c {
			n += l.Backlog()
		}
	}
	return n
}

var generous = tokenbucket.PerSecond(1000, 1000)

// TestBadRequests: every malformed or forbidden request gets the right
// status and a message naming the problem, and nothing is enqueued.
func TestBadRequests(t *testing.T) {
	f := newFixture(t, generous, 1000)
	huge := `{"upstream":"stripe","path":"/x","body":"` + strings.Repeat("a", 5000) + `"}`
	for _, tc := range []struct {
		name    string
		method  string
		path    string
		body    string
		headers []string
		status  int
		want    string
	}{
		{"no key", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x"}`, []string{"Authorization", ""}, 401, "API key is required"},
		{"unknown key", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x"}`, []string{"Authorization", "Bearer nope"}, 401, "not known"},
		{"basic auth", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x"}`, []string{"Authorization", "Basic Zm9vOmJhcg=="}, 401, "Bearer KEY"},
		{"malformed json", "POST", "/v1/jobs", `{"upstream":`, nil, 400, "malformed JSON"},
		{"not an object", "POST", "/v1/jobs", `[1,2]`, nil, 400, "malformed JSON"},
		{"trailing data", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x"} {}`, nil, 400, "after the JSON value"},
		{"empty body", "POST", "/v1/jobs", ``, []string{"Content-Type", "application/json"}, 400, "empty"},
		{"unknown field", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","colour":"red"}`, nil, 400, `unknown field "colour"`},
		{"wrong type", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","max_attempts":"three"}`, nil, 400, "max_attempts"},
		{"wrong content type", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x"}`, []string{"Content-Type", "text/plain"}, 415, "application/json"},
		{"too large", "POST", "/v1/jobs", huge, nil, 413, "4096 bytes"},
		{"no upstream", "POST", "/v1/jobs", `{"path":"/x"}`, nil, 400, "upstream is required"},
		{"unknown upstream", "POST", "/v1/jobs", `{"upstream":"twilio","path":"/x"}`, nil, 404, `no upstream "twilio"`},
		{"no path", "POST", "/v1/jobs", `{"upstream":"stripe"}`, nil, 400, "path is required"},
		{"absolute url", "POST", "/v1/jobs", `{"upstream":"stripe","path":"https://evil.example/x"}`, nil, 400, "path"},
		{"other host", "POST", "/v1/jobs", `{"upstream":"stripe","path":"//evil.example/x"}`, nil, 400, "stay on the upstream"},
		{"dot segments", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/v1/../../admin"}`, nil, 400, ". or .."},
		{"relative path", "POST", "/v1/jobs", `{"upstream":"stripe","path":"v1/charges"}`, nil, 400, "single /"},
		{"bad method", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","method":"BREW"}`, nil, 400, "method"},
		{"bad header name", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","headers":{"Bad Header":"v"}}`, nil, 400, "headers.Bad Header"},
		{"header injection", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","headers":{"X-A":"v\r\nX-B: w"}}`, nil, 400, "line breaks"},
		{"control byte in header value", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","headers":{"X-Ctl":"a\u0001b"}}`, nil, 400, "headers.X-Ctl value must not contain control characters"},
		{"DEL in header value", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","headers":{"X-Del":"a\u007fb"}}`, nil, 400, "headers.X-Del value must not contain control characters"},
		{"space in header name", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","headers":{"X Trace":"v"}}`, nil, 400, "headers.X Trace is not a valid header name"},
		{"non-ASCII header name", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","headers":{"X-Café":"v"}}`, nil, 400, "headers.X-Café is not a valid header name"},
		{"encoded dot segments", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/v1/%2e%2e/admin"}`, nil, 400, ". or .."},
		{"dots behind an encoded slash", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/v1/a%2F..%2Fadmin"}`, nil, 400, ". or .."},
		{"space in path", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/v1/a b"}`, nil, 400, "percent-encode"},
		{"fragment in path", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/v1/a#b"}`, nil, 400, "fragment"},
		{"header twice in other case", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","headers":{"X-A":"1","x-a":"2"}}`, nil, 400, "headers.x-a names the same header as headers.X-A"},
		{"idempotency header set by workers by default", "POST", "/v1/jobs", `{"upstream":"openai","path":"/x","headers":{"Idempotency-Key":"mine"}}`, nil, 400, "is set by shaper's workers"},
		{"credential header", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","headers":{"authorization":"Bearer mine"}}`, nil, 400, "set by shaper's workers"},
		{"host header", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","headers":{"Host":"evil"}}`, nil, 400, "set by the HTTP client"},
		{"both bodies", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","body":"a","body_base64":"YQ=="}`, nil, 400, "not both"},
		{"bad base64", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","body_base64":"***"}`, nil, 400, "base64"},
		{"unknown cost", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","cost":{"tokens":5}}`, nil, 400, `no limit counting "tokens"`},
		{"negative cost", "POST", "/v1/jobs", `{"upstream":"openai","path":"/x","cost":{"tokens":-5}}`, nil, 400, "negative"},
		{"cost over burst", "POST", "/v1/jobs", `{"upstream":"openai","path":"/x","cost":{"tokens":200001}}`, nil, 400,
			`cost.tokens 200001 can never be sent: limit "800000 tokens per 1m0s" takes at most 200000 per job (raise its burst)`},
		{"partition too long", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","partition":"` + strings.Repeat("p", 201) + `"}`, nil, 400, "partition is 201 bytes: must be at most 200"},
		{"partition too long in multibyte", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","partition":"` + strings.Repeat("é", 101) + `"}`, nil, 400, "partition is 202 bytes: must be at most 200"},
		{"partition with a line break", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","partition":"a\nb"}`, nil, 400, "partition holds a control character (U+000A at byte 1)"},
		{"partition with NUL", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","partition":"\u0000"}`, nil, 400, "partition holds a control character (U+0000 at byte 0)"},
		{"partition not a string", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","partition":42}`, nil, 400, "partition: expected string"},
		{"cost over the partition's burst", "POST", "/v1/jobs", `{"upstream":"openai","path":"/x","partition":"acme","cost":{"tokens":30000}}`, nil, 400,
			`cost.tokens 30000 can never be sent: partition "acme"'s limit "100000 tokens per 1m0s" takes at most 25000 per job (raise its burst)`},
		{"unknown lane", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","lane":"vip"}`, nil, 400, "lanes: default, bulk"},
		{"too many attempts", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","max_attempts":1000}`, nil, 400, "max_attempts"},
		{"bad ttl", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","ttl":"soon"}`, nil, 400, "ttl"},
		{"negative ttl", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","ttl":"-1s"}`, nil, 400, "positive"},
		{"bad not_before", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","not_before":"tomorrow"}`, nil, 400, "not_before"},
		{"long idempotency key", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","idempotency_key":"` + strings.Repeat("k", 300) + `"}`, nil, 400, "idempotency_key"},
		{"task on http upstream", "POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","task":"send"}`, nil, 400, "not task"},
		{"path on handler upstream", "POST", "/v1/jobs", `{"upstream":"mail","path":"/x","task":"send"}`, nil, 400, "Go handler"},
		{"no task on handler upstream", "POST", "/v1/jobs", `{"upstream":"mail"}`, nil, 400, "task is required"},
		{"several problems at once", "POST", "/v1/jobs", `{"upstream":"stripe","path":"x","method":"BREW","max_attempts":-1}`, nil, 400, "method"},
		{"empty batch", "POST", "/v1/jobs/batch", `{"jobs":[]}`, nil, 400, "1 to 50 jobs"},
		{"batch unknown field", "POST", "/v1/jobs/batch", `{"jobs":[],"x":1}`, nil, 400, `unknown field "x"`},
		{"unknown job", "GET", "/v1/jobs/stripe.default.nope", "", nil, 404, "no job"},
		{"not a job id", "GET", "/v1/jobs/hello", "", nil, 404, "no job"},
		{"cancel unknown", "DELETE", "/v1/jobs/stripe.default.nope", "", nil, 404, "no job"},
		{"unknown upstream status", "GET", "/v1/upstreams/twilio", "", nil, 404, `no upstream "twilio"`},
		{"pause without admin", "POST", "/v1/upstreams/stripe/pause", `{"for":"1m"}`, nil, 403, "not an admin key"},
		{"pause bad duration", "POST", "/v1/upstreams/stripe/pause", `{"for":"forever"}`, []string{"Authorization", "Bearer ops-secret"}, 400, "for"},
		{"unknown route", "GET", "/v2/jobs", "", nil, 404, "no route"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := f.backlog()
			resp, body := f.do(tc.method, tc.path, tc.body, tc.headers...)
			if resp.StatusCode != tc.status {
				t.Fatalf("got %d %v, want %d", resp.StatusCode, body, tc.status)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("Content-Type %q, want application/problem+json", ct)
			}
			text := fmt.Sprint(body["detail"], body["errors"])
			if !strings.Contains(text, tc.want) {
				t.Errorf("got problem %v, want it to mention %q", body, tc.want)
			}
			if body["status"] != float64(tc.status) || body["type"] == "" || body["title"] == "" {
				t.Errorf("problem %v lacks type, title or status", body)
			}
			if after := f.backlog(); after != before {
				t.Errorf("backlog went from %d to %d: a refused request enqueued something", before, after)
			}
		})
	}
	// The several-problems case lists each field.
	_, body := f.do("POST", "/v1/jobs", `{"upstream":"stripe","path":"x","method":"BREW","max_attempts":-1}`)
	if errs, _ := body["errors"].([]any); len(errs) != 3 {
		t.Errorf("got errors %v, want three: path, method and max_attempts", body["errors"])
	}
}

func TestEnqueueGetCancel(t *testing.T) {
	f := newFixture(t, generous, 1000)
	resp, body := f.do("POST", "/v1/jobs", `{"upstream":"stripe","method":"post","path":"/v1/charges?expand=x","headers":{"Content-Type":"application/x-www-form-urlencoded"},
		"body":"amount=100","idempotency_key":"order-1","not_before":"`+time.Now().Add(24*time.Hour).Format(time.RFC3339)+`","lane":"bulk"}`)
	if resp.StatusCode != 202 {
		t.Fatalf("got %d %v, want 202", resp.StatusCode, body)
	}
	id, _ := body["id"].(string)
	if resp.Header.Get("Location") != "/v1/jobs/"+id || body["state"] != "scheduled" || body["lane"] != "bulk" || body["upstream"] != "stripe" {
		t.Fatalf("got %v, Location %q", body, resp.Header.Get("Location"))
	}
	for _, h := range []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"} {
		if resp.Header.Get(h) == "" {
			t.Errorf("missing %s on an admitted request", h)
		}
	}
	// The same idempotency key returns the job with 200, enqueuing nothing.
	resp, again := f.do("POST", "/v1/jobs", `{"upstream":"stripe","path":"/other","idempotency_key":"order-1","lane":"bulk"}`)
	if resp.StatusCode != 200 || again["id"] != id || again["path"] != "/v1/charges?expand=x" || again["method"] != "POST" {
		t.Fatalf("repeat: got %d %v", resp.StatusCode, again)
	}
	resp, got := f.do("GET", "/v1/jobs/"+id, "")
	if resp.StatusCode != 200 || got["tenant"] != "billing" || got["state"] != "scheduled" {
		t.Fatalf("get: %d %v", resp.StatusCode, got)
	}
	// Another tenant cannot see or cancel it.
	if resp, _ := f.do("GET", "/v1/jobs/"+id, "", "Authorization", "Bearer ops-secret"); resp.StatusCode != 404 {
		t.Fatalf("other tenant's get: %d, want 404", resp.StatusCode)
	}
	if resp, _ := f.do("DELETE", "/v1/jobs/"+id, "", "Authorization", "Bearer ops-secret"); resp.StatusCode != 404 {
		t.Fatalf("other tenant's cancel: %d, want 404", resp.StatusCode)
	}
	resp, cancelled := f.do("DELETE", "/v1/jobs/"+id, "")
	if resp.StatusCode != 200 || cancelled["state"] != "cancelled" {
		t.Fatalf("cancel: %d %v", resp.StatusCode, cancelled)
	}
	// X-API-Key works too; a handler upstream takes a task and a binary body.
	resp, body = f.do("POST", "/v1/jobs", `{"upstream":"mail","task":"welcome","body_base64":"AAEC/w=="}`, "Authorization", "", "X-API-Key", "billing-secret")
	if resp.StatusCode != 202 {
		t.Fatalf("handler job: %d %v", resp.StatusCode, body)
	}
	info, err := f.q.Get(context.Background(), body["id"].(string), "billing")
	if err != nil || info.Task != "welcome" || string(info.Body) != "\x00\x01\x02\xff" {
		t.Fatalf("stored handler job: %+v, %v", info, err)
	}
}

func TestAdmissionLimit(t *testing.T) {
	f := newFixture(t, tokenbucket.Limit{Capacity: 3, Refill: 1, Per: time.Hour}, 1000)
	// A batch is admitted whole, so the capacity caps its size; one too big
	// is refused, and pays one token like any invalid request.
	resp, body := f.do("POST", "/v1/jobs/batch", `{"jobs":[{"upstream":"stripe","path":"/a"},{"upstream":"stripe","path":"/b"},{"upstream":"stripe","path":"/c"},{"upstream":"stripe","path":"/d"}]}`)
	if resp.StatusCode != 400 || !strings.Contains(fmt.Sprint(body["detail"]), "split the batch") ||
		!strings.Contains(fmt.Sprint(body["detail"]), "api.admission.capacity 3") {
		t.Fatalf("oversize batch: got %d %v, want 400 naming the capacity", resp.StatusCode, body)
	}
	codes := map[int]int{}
	var last *http.Response
	var lastBody map[string]any
	for i := 0; i < 5; i++ {
		resp, body := f.do("POST", "/v1/jobs", `{"upstream":"stripe","path":"/x"}`)
		codes[resp.StatusCode]++
		if resp.StatusCode == 429 {
			last, lastBody = resp, body
		}
	}
	if codes[202] != 2 || codes[429] != 3 {
		t.Fatalf("got %v, want 2 accepted and 3 refused", codes)
	}
	if last.Header.Get("Retry-After") == "" || last.Header.Get("RateLimit-Policy") != `"enqueue";q=3;w=10800` || lastBody["retry_after"] == nil {
		t.Fatalf("429 headers %v body %v", last.Header, lastBody)
	}
	if got := f.backlog(); got != 2 {
		t.Fatalf("backlog %d, want the 2 admitted jobs", got)
	}
	if n := counter(t, f.reg, "shaper_admission_decisions_total", "denied"); n != 3 {
		t.Fatalf("denied decisions counted %v, want 3", n)
	}
}

// TestBatchFollowsAdmissionCapacity: with the default admission (capacity
// 100) and max_batch (1000), a batch of 100 jobs is accepted whole and one
// of 101 is refused with a message that says why, before anything is stored.
func TestBatchFollowsAdmissionCapacity(t *testing.T) {
	rdb := srv.Client(t)
	rdb.FlushAll(context.Background())
	f := newFixtureOn(t, rdb, tokenbucket.Limit{Capacity: 100, Refill: 10, Per: time.Second}, 1000, func(c *Config) {
		c.MaxBatch, c.MaxBodyBytes = 1000, 1<<20
	})
	batch := func(n int) string {
		jobs := make([]string, n)
		for i := range jobs {
			jobs[i] = fmt.Sprintf(`{"upstream":"stripe","path":"/%d"}`, i)
		}
		return `{"jobs":[` + strings.Join(jobs, ",") + `]}`
	}
	resp, body := f.do("POST", "/v1/jobs/batch", batch(101))
	if resp.StatusCode != 400 || !strings.Contains(fmt.Sprint(body["detail"]), "1 to 100 jobs") {
		t.Fatalf("101 jobs: got %d %v, want 400 naming the limit of 100", resp.StatusCode, body)
	}
	time.Sleep(200 * time.Millisecond) // the refusal's token refills
	resp, body = f.do("POST", "/v1/jobs/batch", batch(100))
	if resp.StatusCode != 200 {
		t.Fatalf("100 jobs: got %d %v, want 200", resp.StatusCode, body)
	}
	for _, r := range body["results"].([]any) {
		if st := r.(map[string]any)["status"]; st != 202.0 {
			t.Fatalf("100 jobs: got item %v, want every item 202", r)
		}
	}
	if got := f.backlog(); got != 100 {
		t.Fatalf("backlog %d, want 100", got)
	}
}

// counter sums the series of a counter that carry the given label value
// (every upstream's, for a reason), now that they all exist from the start.
func counter(t *testing.T, reg *prometheus.Registry, name, labelValue string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		sum := 0.0
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetValue() == labelValue {
					sum += m.GetCounter().GetValue()
					break
				}
			}
		}
		return sum
	}
	return 0
}

func TestBatch(t *testing.T) {
	f := newFixture(t, generous, 1000)
	resp, body := f.do("POST", "/v1/jobs/batch", `{"jobs":[
		{"upstream":"stripe","path":"/a"},
		{"upstream":"stripe","path":"nope"},
		{"upstream":"twilio","path":"/a"},
		{"upstream":"stripe","path":"/b","idempotency_key":"k1"},
		{"upstream":"stripe","path":"/c","idempotency_key":"k1"},
		{"upstream":"stripe","path":"/d","colour":"red"}
	]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("got %d %v", resp.StatusCode, body)
	}
	results := body["results"].([]any)
	statuses := []float64{}
	for _, r := range results {
		statuses = append(statuses, r.(map[string]any)["status"].(float64))
	}
	// Items 3 and 4 share a key: one is created, the other finds it.
	if len(statuses) != 6 || statuses[0] != 202 || statuses[1] != 400 || statuses[2] != 404 || statuses[5] != 400 ||
		statuses[3]+statuses[4] != 202+200 && statuses[3]+statuses[4] != 202+202 {
		t.Fatalf("got per-item statuses %v", statuses)
	}
	if n := f.backlog(); n != 2 {
		t.Fatalf("backlog %d, want 2 (one plain job, one idempotent one)", n)
	}
}

func TestBacklogFull(t *testing.T) {
	f := newFixture(t, generous, 2)
	for i := 0; i < 2; i++ {
		if resp, body := f.do("POST", "/v1/jobs", `{"upstream":"stripe","path":"/x"}`); resp.StatusCode != 202 {
			t.Fatalf("got %d %v", resp.StatusCode, body)
		}
	}
	resp, body := f.do("POST", "/v1/jobs", `{"upstream":"stripe","path":"/x"}`)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(fmt.Sprint(body["detail"]), "max_pending 2") {
		t.Fatalf("got %d %v (Retry-After %q), want 503 naming max_pending", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
	c, err := client.New(f.hs.URL, "billing-secret", client.WithHTTPClient(f.hc))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Enqueue(context.Background(), client.JobRequest{Upstream: "stripe", Path: "/x"})
	if !errors.Is(err, client.ErrBacklogFull) || errors.Is(err, client.ErrUnavailable) {
		t.Errorf("client: got %v, want ErrBacklogFull and not ErrUnavailable", err)
	}
}

func TestPauseResumeAndStatus(t *testing.T) {
	f := newFixture(t, generous, 1000)
	admin := []string{"Authorization", "Bearer ops-secret"}
	resp, body := f.do("POST", "/v1/upstreams/stripe/pause", `{"for":"10m"}`, admin...)
	if resp.StatusCode != 200 || body["paused_until"] == nil || !strings.Contains(fmt.Sprint(body["pause_reason"]), "ops") {
		t.Fatalf("pause: %d %v", resp.StatusCode, body)
	}
	resp, body = f.do("POST", "/v1/upstreams/stripe/resume", "", admin...)
	if resp.StatusCode != 200 || body["paused_until"] != nil {
		t.Fatalf("resume: %d %v", resp.StatusCode, body)
	}
	resp, body = f.do("GET", "/v1/upstreams", "")
	ups, _ := body["upstreams"].([]any)
	if resp.StatusCode != 200 || len(ups) != 3 {
		t.Fatalf("list: %d %v", resp.StatusCode, body)
	}
	first := ups[0].(map[string]any)
	for _, k := range []string{"name", "limits", "drain_rate", "backlog", "in_flight", "retrying", "dead", "paused_until", "time_to_drain_seconds"} {
		if _, ok := first[k]; !ok {
			t.Errorf("status lacks %q: %v", k, first)
		}
	}
}

// TestUpstreamHistory: GET /v1/upstreams/{name}/history is 15 minutes of
// 10 s steps, oldest first, from the counts workers keep: the step before
// last holds 30 sends over 10 s.
func TestUpstreamHistory(t *testing.T) {
	f := newFixture(t, generous, 1000)
	rec := jobstore.NewRecorder(f.rdb, "")
	now := time.Now()
	stepEnd := now.Truncate(10 * time.Second).Add(-10 * time.Second)
	for i := range 30 {
		rec.Sent("mail", stepEnd.Add(-time.Duration(1+i%10)*time.Second))
	}
	if err := rec.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	resp, body := f.do("GET", "/v1/upstreams/mail/history", "")
	pts, _ := body["points"].([]any)
	if resp.StatusCode != 200 || body["name"] != "mail" || body["step_seconds"] != 10.0 || len(pts) != 90 {
		t.Fatalf("got %d %v, want mail's 90 points of 10 s", resp.StatusCode, body)
	}
	var found bool
	for _, p := range pts {
		pt := p.(map[string]any)
		at, _ := time.Parse(time.RFC3339, fmt.Sprint(pt["at"]))
		if at.Equal(stepEnd) {
			found = true
			if pt["drain_rate"] != 3.0 {
				t.Errorf("step ending %v: got %v, want 3/s", stepEnd, pt["drain_rate"])
			}
		} else if pt["drain_rate"] != 0.0 {
			t.Errorf("step ending %v: got %v, want 0", at, pt["drain_rate"])
		}
	}
	if !found {
		t.Errorf("no point ends at %v: %v", stepEnd, pts)
	}
	if resp, _ := f.do("GET", "/v1/upstreams/nope/history", ""); resp.StatusCode != 404 {
		t.Errorf("unknown upstream: got %d, want 404", resp.StatusCode)
	}
	if resp, _ := f.do("GET", "/v1/upstreams/mail/history", "", "Authorization", "Bearer wrong"); resp.StatusCode != 401 {
		t.Errorf("bad key: got %d, want 401", resp.StatusCode)
	}
}

func TestHealthReadyMetrics(t *testing.T) {
	f := newFixture(t, generous, 1000)
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := f.hc.Get(f.hs.URL + p)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %v %v", p, resp, err)
		}
		resp.Body.Close()
	}
	problems, err := testutil.GatherAndLint(f.reg)
	if err != nil || len(problems) > 0 {
		t.Fatalf("promlint: %v %v", problems, err)
	}
}

// TestPartition: a job's partition is stored and shown, checked against
// the partition's own limits where the upstream has them, and a label
// where it has none; a bad one is refused with a field error, singly and
// in a batch, and nothing is stored.
func TestPartition(t *testing.T) {
	f := newFixture(t, generous, 1000)
	for _, tc := range []struct {
		name, body string
	}{
		// stripe limits no partition: the partition only labels the job.
		{"label only", `{"upstream":"stripe","path":"/x","partition":"example.org"}`},
		{"at the byte limit", `{"upstream":"stripe","path":"/x","partition":"` + strings.Repeat("é", 100) + `"}`},
		{"within the partition's burst", `{"upstream":"openai","path":"/x","partition":"acme","cost":{"tokens":25000}}`},
		{"within an override's burst", `{"upstream":"openai","path":"/x","partition":"big-customer","cost":{"tokens":200000}}`},
		{"handler upstream", `{"upstream":"mail","task":"welcome","partition":"gmail.com"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var req JobRequest
			if err := json.Unmarshal([]byte(tc.body), &req); err != nil {
				t.Fatal(err)
			}
			resp, body := f.do("POST", "/v1/jobs", tc.body)
			if resp.StatusCode != 202 || body["partition"] != req.Partition {
				t.Fatalf("got %d %v, want 202 with partition %q", resp.StatusCode, body, req.Partition)
			}
			resp, got := f.do("GET", "/v1/jobs/"+body["id"].(string), "")
			if resp.StatusCode != 200 || got["partition"] != req.Partition {
				t.Fatalf("get: got %d %v, want partition %q", resp.StatusCode, got, req.Partition)
			}
		})
	}
	// No partition, no field.
	resp, body := f.do("POST", "/v1/jobs", `{"upstream":"stripe","path":"/x"}`)
	if _, ok := body["partition"]; resp.StatusCode != 202 || ok {
		t.Fatalf("no partition: got %d %v, want 202 without a partition field", resp.StatusCode, body)
	}

	before := f.backlog()
	resp, body = f.do("POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","partition":"`+strings.Repeat("p", 201)+`"}`)
	errs, _ := body["errors"].([]any)
	if resp.StatusCode != 400 || len(errs) != 1 || errs[0].(map[string]any)["field"] != "partition" {
		t.Fatalf("too long: got %d %v, want 400 with one error on field partition", resp.StatusCode, body)
	}
	resp, body = f.do("POST", "/v1/jobs/batch", `{"jobs":[
		{"upstream":"stripe","path":"/a","partition":"example.org"},
		{"upstream":"stripe","path":"/b","partition":"`+strings.Repeat("p", 201)+`"}
	]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("batch: got %d %v", resp.StatusCode, body)
	}
	results := body["results"].([]any)
	ok, bad := results[0].(map[string]any), results[1].(map[string]any)
	if ok["status"] != float64(202) || ok["job"].(map[string]any)["partition"] != "example.org" {
		t.Fatalf("batch item 0: got %v, want 202 with partition example.org", ok)
	}
	berrs, _ := bad["error"].(map[string]any)["errors"].([]any)
	if bad["status"] != float64(400) || len(berrs) != 1 || berrs[0].(map[string]any)["field"] != "jobs[1].partition" {
		t.Fatalf("batch item 1: got %v, want 400 with one error on jobs[1].partition", bad)
	}
	if after := f.backlog(); after != before+1 {
		t.Fatalf("backlog went from %d to %d, want one more (the good batch item only)", before, after)
	}
}

// TestImpossibleCost: a job whose cost no reservation of a limit could
// carry is refused at enqueue with one short sentence that names the
// limit, the most it takes per job and the key that raises it, singly and
// per item of a batch; nothing is stored.
func TestImpossibleCost(t *testing.T) {
	f := newFixture(t, generous, 1000)
	const want = `cost.tokens 500000 can never be sent: limit "800000 tokens per 1m0s" takes at most 200000 per job (raise its burst)`
	resp, body := f.do("POST", "/v1/jobs", `{"upstream":"openai","path":"/v1/chat","cost":{"tokens":500000}}`)
	if resp.StatusCode != 400 || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("got %d %s %v, want 400 problem+json", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	if body["detail"] != want {
		t.Errorf("detail: got %q, want %q", body["detail"], want)
	}
	errs, _ := body["errors"].([]any)
	wantErr := map[string]any{"field": "cost.tokens", "message": strings.TrimPrefix(want, "cost.tokens ")}
	if len(errs) != 1 || !reflect.DeepEqual(errs[0], wantErr) {
		t.Errorf("errors: got %v, want [%v]", errs, wantErr)
	}
	// Over both the upstream's limit and the partition's: one reason, the
	// tighter limit.
	_, body = f.do("POST", "/v1/jobs", `{"upstream":"openai","path":"/v1/chat","partition":"acme","cost":{"tokens":500000}}`)
	if errs, _ := body["errors"].([]any); len(errs) != 1 || body["detail"] != want {
		t.Errorf("over the upstream's and the partition's limit: got %v, want one error, %q", body, want)
	}

	resp, body = f.do("POST", "/v1/jobs/batch", `{"jobs":[
		{"upstream":"openai","path":"/v1/chat","cost":{"tokens":100}},
		{"upstream":"openai","path":"/v1/chat","cost":{"tokens":500000}},
		{"upstream":"openai","path":"/v1/chat","partition":"acme","cost":{"tokens":25001}}
	]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("batch: got %d %v", resp.StatusCode, body)
	}
	results, _ := body["results"].([]any)
	if len(results) != 3 {
		t.Fatalf("batch: got %v, want 3 results", body)
	}
	wantItems := []struct {
		status float64
		detail string
	}{
		{202, ""},
		{400, "jobs[1]." + want},
		{400, `jobs[2].cost.tokens 25001 can never be sent: partition "acme"'s limit "100000 tokens per 1m0s" takes at most 25000 per job (raise its burst)`},
	}
	for i, w := range wantItems {
		r := results[i].(map[string]any)
		detail := ""
		if p, ok := r["error"].(map[string]any); ok {
			detail, _ = p["detail"].(string)
		}
		if r["status"] != w.status || detail != w.detail {
			t.Errorf("batch item %d: got %v %q, want %v %q", i, r["status"], detail, w.status, w.detail)
		}
	}
	if n := f.backlog(); n != 1 {
		t.Errorf("backlog %d, want 1: only the job that fits", n)
	}
}

func TestNeverFits(t *testing.T) {
	cases := []struct {
		l    leaky.Limit
		n    int64
		want string
	}{
		{leaky.Limit{Rate: 2000, Per: time.Second, Cost: "tokens"}, 5000,
			`5000 can never be sent: limit "2000 tokens per 1s" takes at most 500 per job (raise its burst)`},
		// The burst is already the rate, as high as it goes.
		{leaky.Limit{Rate: 10, Per: time.Minute, Cost: "images", Burst: 10}, 11,
			`11 can never be sent: limit "10 images per 1m0s" takes at most 10 per job (split the job)`},
	}
	for _, c := range cases {
		if got := neverFits(c.n, "limit", c.l); got != c.want {
			t.Errorf("got %q, want %q", got, c.want)
		}
	}
}
