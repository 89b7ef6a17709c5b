package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shaperhq/shaper/client"
)

// sleeper stands in for real waits: it records each one and returns at
// once, or does what hook says on the nth wait.
type sleeper struct {
	mu    sync.Mutex
	waits []time.Duration
	hook  func(n int) error
}

func (s *sleeper) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.waits = append(s.waits, d)
	n := len(s.waits)
	s.mu.Unlock()
	if s.hook != nil {
		if err := s.hook(n); err != nil {
			return err
		}
	}
	return ctx.Err()
}

func (s *sleeper) recorded() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.waits)
}

func newClient(t *testing.T, f *fake, key string, opts ...client.Option) (*client.Client, *sleeper) {
	t.Helper()
	c, err := client.New(f.URL(), key, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	s := &sleeper{}
	client.SetTime(c, f.now, s.sleep)
	return c, s
}

func setup(t *testing.T, opts ...client.Option) (*fake, *client.Client, *sleeper) {
	t.Helper()
	f := newFake()
	t.Cleanup(f.Close)
	c, s := newClient(t, f, producerKey, opts...)
	return f, c, s
}

// jsonOf decodes a request body generically, to compare with what the
// contract says should be sent.
func jsonOf(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("request body %q: %v", b, err)
	}
	return m
}

var allSentinels = []error{
	client.ErrRateLimited, client.ErrBacklogFull, client.ErrUnavailable, client.ErrNotFound,
	client.ErrInvalid, client.ErrUnauthorized, client.ErrConflict,
}

// checkSentinel asserts err matches want and no other sentinel.
func checkSentinel(t *testing.T, err, want error) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %v", want)
	}
	for _, s := range allSentinels {
		if got := errors.Is(err, s); got != (s == want) {
			t.Errorf("errors.Is(%v, %v) = %v, want %v", err, s, got, s == want)
		}
	}
}

func asError(t *testing.T, err error) *client.Error {
	t.Helper()
	var e *client.Error
	if !errors.As(err, &e) {
		t.Fatalf("got %T %v, want a *client.Error", err, err)
	}
	return e
}

func TestNew(t *testing.T) {
	tests := []struct {
		name, base, key string
		opts            []client.Option
		wantErr         string
	}{
		{"ok", "http://localhost:8080", "k", nil, ""},
		{"prefix", "https://api.example.com/shaper/", "k", nil, ""},
		{"all options", "http://h", "k", []client.Option{client.WithHTTPClient(&http.Client{}), client.WithRetry(3), client.WithMaxRetryWait(time.Second), client.WithUserAgent("x/1")}, ""},
		{"relative", "/v1", "k", nil, "scheme"},
		{"no scheme", "localhost:8080", "k", nil, "scheme"},
		{"ftp", "ftp://h", "k", nil, "scheme"},
		{"no host", "http://", "k", nil, "no host"},
		{"query", "http://h?x=1", "k", nil, "query"},
		{"unparseable", "http://h/%zz", "k", nil, "base url"},
		{"empty key", "http://h", "", nil, "api key"},
		{"nil http client", "http://h", "k", []client.Option{client.WithHTTPClient(nil)}, "http client"},
		{"negative retries", "http://h", "k", []client.Option{client.WithRetry(-1)}, "max retries"},
		{"zero retry wait", "http://h", "k", []client.Option{client.WithMaxRetryWait(0)}, "max retry wait"},
		{"empty user agent", "http://h", "k", []client.Option{client.WithUserAgent("")}, "user agent"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := client.New(tt.base, tt.key, tt.opts...)
			if tt.wantErr == "" {
				if err != nil || c == nil {
					t.Fatalf("got %v, want a client", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("got %v, want an error mentioning %q", err, tt.wantErr)
			}
		})
	}
}

func TestEnqueueSendsTheContract(t *testing.T) {
	f, c, _ := setup(t)
	ctx := context.Background()
	notBefore := time.Date(2099, 1, 2, 3, 4, 5, 0, time.FixedZone("CET", 3600))
	job, err := c.Enqueue(ctx, client.JobRequest{
		Upstream:       "stripe",
		Method:         "POST",
		Path:           "/v1/charges",
		Headers:        map[string]string{"Content-Type": "application/x-www-form-urlencoded"},
		Body:           []byte("amount=100&currency=eur"),
		Cost:           map[string]int64{"tokens": 12},
		Lane:           "bulk",
		IdempotencyKey: "order-42",
		MaxAttempts:    5,
		NotBefore:      notBefore,
		TTL:            90 * time.Minute,
		Partition:      "example.org",
	})
	if err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	reqs := f.log()
	if len(reqs) != 1 {
		t.Fatalf("got %d requests, want 1", len(reqs))
	}
	r := reqs[0]
	if r.Method != "POST" || r.Path != "/v1/jobs" {
		t.Errorf("got %s %s, want POST /v1/jobs", r.Method, r.Path)
	}
	for h, want := range map[string]string{
		"Authorization": "Bearer " + producerKey,
		"Content-Type":  "application/json",
		"User-Agent":    client.DefaultUserAgent,
		"Accept":        "application/json, application/problem+json",
	} {
		if got := r.Header.Get(h); got != want {
			t.Errorf("header %s: got %q, want %q", h, got, want)
		}
	}
	want := map[string]any{
		"upstream":        "stripe",
		"method":          "POST",
		"path":            "/v1/charges",
		"headers":         map[string]any{"Content-Type": "application/x-www-form-urlencoded"},
		"body":            "amount=100&currency=eur",
		"cost":            map[string]any{"tokens": float64(12)},
		"lane":            "bulk",
		"idempotency_key": "order-42",
		"max_attempts":    float64(5),
		"not_before":      "2099-01-02T03:04:05+01:00",
		"ttl":             "1h30m0s",
		"partition":       "example.org",
	}
	if got := jsonOf(t, r.Body); !reflect.DeepEqual(got, want) {
		t.Errorf("body:\ngot  %v\nwant %v", got, want)
	}

	if job.ID != "stripe.bulk.j1" || job.State != client.StateScheduled || job.Upstream != "stripe" ||
		job.Lane != "bulk" || job.Partition != "example.org" || job.IdempotencyKey != "order-42" || job.CreatedAt.IsZero() || job.Existing || job.Done() {
		t.Errorf("got %+v, want the accepted job stripe.bulk.j1, scheduled", job)
	}

	again, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe", Lane: "bulk", IdempotencyKey: "order-42"})
	if err != nil {
		t.Fatalf("Enqueue again: %v", err)
	}
	if !again.Existing || again.ID != job.ID || again.MaxAttempts != 5 || again.Path != "/v1/charges" ||
		again.Cost["tokens"] != 12 || !again.NotBefore.Equal(notBefore) || again.ExpiresAt.IsZero() || again.Partition != "example.org" {
		t.Errorf("got %+v, want the existing job %s in full", again, job.ID)
	}
	if n := f.jobCount(); n != 1 {
		t.Errorf("got %d jobs, want 1", n)
	}
}

func TestEnqueueMinimalAndTask(t *testing.T) {
	f, c, _ := setup(t)
	ctx := context.Background()
	if _, err := c.Enqueue(ctx, client.JobRequest{Upstream: "openai"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enqueue(ctx, client.JobRequest{Upstream: "openai", Task: "embed", Body: []byte(`{"text":"hi"}`)}); err != nil {
		t.Fatal(err)
	}
	reqs := f.log()
	if got, want := string(reqs[0].Body), `{"upstream":"openai"}`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
	want := map[string]any{"upstream": "openai", "task": "embed", "body": `{"text":"hi"}`}
	if got := jsonOf(t, reqs[1].Body); !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestBodyRoundTrip(t *testing.T) {
	tests := []struct {
		name    string
		body    []byte
		wantKey string // which field carries it; "" for none
	}{
		{"text", []byte("amount=100"), "body"},
		{"json", []byte(`{"a":"<b>&"}`), "body"},
		{"unicode", []byte("héllo ✓"), "body"},
		{"binary", []byte{0xff, 0x00, 0xfe, 0x80, 'a'}, "body_base64"},
		{"bad utf-8 tail", append([]byte("text then "), 0xc3), "body_base64"},
		{"empty", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, c, _ := setup(t)
			f.setStates("succeeded")
			ctx := context.Background()
			job, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe", Path: "/v1/files", Body: tt.body})
			if err != nil {
				t.Fatal(err)
			}
			sent := jsonOf(t, f.log()[0].Body)
			for _, k := range []string{"body", "body_base64"} {
				if _, ok := sent[k]; ok != (k == tt.wantKey) {
					t.Errorf("field %s sent: got %v, want %v", k, ok, k == tt.wantKey)
				}
			}
			got, err := c.Get(ctx, job.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.Response == nil || !bytes.Equal(got.Response.Body, tt.body) {
				t.Fatalf("got response %+v, want body %q echoed", got.Response, tt.body)
			}
		})
	}
}

func TestJSONRoundTrip(t *testing.T) {
	req := client.JobRequest{
		Upstream: "stripe", Method: "PUT", Path: "/x", Headers: map[string]string{"A": "b"},
		Body: []byte{0, 1, 0xff}, Task: "t", Cost: map[string]int64{"tokens": 3}, Lane: "bulk",
		IdempotencyKey: "k", MaxAttempts: 2, NotBefore: time.Date(2030, 5, 6, 7, 8, 9, 500, time.UTC), TTL: 1500 * time.Millisecond,
		Partition: "example.org",
	}
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var back client.JobRequest
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, req) {
		t.Errorf("got %+v, want %+v", back, req)
	}

	resp := client.Response{Status: 201, Headers: http.Header{"X-A": {"1", "2"}}, Body: []byte{0xfe, 'x'}, Truncated: true}
	b, err = json.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"body_base64":"/ng="`) {
		t.Errorf("got %s, want body_base64 for a binary body", b)
	}
	var rback client.Response
	if err := json.Unmarshal(b, &rback); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rback, resp) {
		t.Errorf("got %+v, want %+v", rback, resp)
	}

	for _, bad := range []string{`{"upstream":"a","ttl":"soon"}`, `{"upstream":"a","not_before":"tomorrow"}`, `{"upstream":"a","body_base64":"!!"}`} {
		if err := json.Unmarshal([]byte(bad), &back); err == nil {
			t.Errorf("decoding %s: got no error, want one", bad)
		}
	}
}

func TestGetFollowsTheJob(t *testing.T) {
	f, c, _ := setup(t)
	f.setStates("active", "retrying", "active", "succeeded")
	ctx := context.Background()
	job, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe", Path: "/v1/charges", Body: []byte(`{"amount":100}`), Cost: map[string]int64{"tokens": 7}})
	if err != nil {
		t.Fatal(err)
	}

	got, err := c.Get(ctx, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != client.StateActive || got.Attempts != 1 || got.Tenant != "billing" || got.MaxAttempts != 3 ||
		got.Method != "POST" || got.Path != "/v1/charges" || got.Cost["tokens"] != 7 || got.IdempotencyKey != job.ID || got.Response != nil {
		t.Errorf("got %+v, want active on attempt 1", got)
	}
	got, err = c.Get(ctx, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != client.StateRetrying || got.LastError != "upstream answered 500" || got.LastFailedAt.IsZero() || got.NextAttemptAt.IsZero() || got.Done() {
		t.Errorf("got %+v, want retrying with its last error", got)
	}
	c.Get(ctx, job.ID)
	got, err = c.Get(ctx, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != client.StateSucceeded || !got.Done() || got.Attempts != 2 || got.CompletedAt.IsZero() || got.Response == nil {
		t.Fatalf("got %+v, want succeeded with a response", got)
	}
	if r := got.Response; r.Status != 200 || r.Headers.Get("X-Request-Id") != "req_1" || string(r.Body) != `{"amount":100}` || r.Truncated {
		t.Errorf("got response %+v, want the echo", r)
	}
	if log := f.log(); log[len(log)-1].Method != "GET" || log[len(log)-1].Path != "/v1/jobs/"+job.ID {
		t.Errorf("got %s %s, want GET /v1/jobs/%s", log[len(log)-1].Method, log[len(log)-1].Path, job.ID)
	}

	other, _ := newClient(t, f, otherKey)
	_, err = other.Get(ctx, job.ID)
	checkSentinel(t, err, client.ErrNotFound)
}

func TestGetDeadJob(t *testing.T) {
	f, c, _ := setup(t)
	f.setStates("dead")
	ctx := context.Background()
	job, _ := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"})
	got, err := c.Get(ctx, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != client.StateDead || !got.Done() || got.LastError == "" || got.Response == nil ||
		got.Response.Status != 400 || !got.Response.Truncated || string(got.Response.Body) != `{"error":"bad card"}` {
		t.Errorf("got %+v (response %+v), want dead with a truncated 400", got, got.Response)
	}
}

func TestIDsAreEscaped(t *testing.T) {
	f, c, _ := setup(t)
	ctx := context.Background()
	_, err := c.Get(ctx, "a/b c?d")
	checkSentinel(t, err, client.ErrNotFound)
	if got, want := f.log()[0].Path, "/v1/jobs/a%2Fb%20c%3Fd"; got != want {
		t.Errorf("got path %s, want %s", got, want)
	}
	for name, call := range map[string]func() error{
		"get":      func() error { _, err := c.Get(ctx, ""); return err },
		"cancel":   func() error { _, err := c.Cancel(ctx, ""); return err },
		"upstream": func() error { _, err := c.Upstream(ctx, ""); return err },
		"pause":    func() error { _, err := c.Pause(ctx, "", 0); return err },
		"resume":   func() error { _, err := c.Resume(ctx, ""); return err },
	} {
		if err := call(); err == nil {
			t.Errorf("%s with an empty name: got no error, want one", name)
		}
	}
	if n := len(f.log()); n != 1 {
		t.Errorf("got %d requests, want 1: empty names must not reach the server", n)
	}
}

func TestCancel(t *testing.T) {
	f, c, _ := setup(t)
	ctx := context.Background()
	job, _ := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"})
	got, err := c.Cancel(ctx, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != client.StateCancelled || got.ID != job.ID || !got.Done() {
		t.Errorf("got %+v, want %s cancelled", got, job.ID)
	}
	if log := f.log(); log[1].Method != "DELETE" || log[1].Path != "/v1/jobs/"+job.ID {
		t.Errorf("got %s %s, want DELETE /v1/jobs/%s", log[1].Method, log[1].Path, job.ID)
	}

	_, err = c.Cancel(ctx, job.ID)
	checkSentinel(t, err, client.ErrConflict)
	if e := asError(t, err); e.StatusCode != 409 || !strings.Contains(e.Detail, "cancelled") {
		t.Errorf("got %+v, want a 409 naming the state", e)
	}

	f.setStates("active")
	running, _ := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"})
	c.Get(ctx, running.ID)
	_, err = c.Cancel(ctx, running.ID)
	checkSentinel(t, err, client.ErrConflict)

	_, err = c.Cancel(ctx, "stripe.default.nope")
	checkSentinel(t, err, client.ErrNotFound)
}

func TestErrorsFromTheServer(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name       string
		key        string
		prepare    func(*fake)
		call       func(*client.Client) error
		want       error
		wantStatus int
		check      func(*testing.T, *client.Error)
	}{
		{
			name: "unknown key", key: "sk_nope",
			call: func(c *client.Client) error {
				_, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"})
				return err
			},
			want:       client.ErrUnauthorized,
			wantStatus: 401,
		},
		{
			name: "not admin", key: producerKey,
			call:       func(c *client.Client) error { _, err := c.Pause(ctx, "stripe", time.Minute); return err },
			want:       client.ErrUnauthorized,
			wantStatus: 403,
		},
		{
			name: "unknown upstream", key: producerKey,
			call: func(c *client.Client) error {
				_, err := c.Enqueue(ctx, client.JobRequest{Upstream: "nope"})
				return err
			},
			want:       client.ErrNotFound,
			wantStatus: 404,
			check: func(t *testing.T, e *client.Error) {
				if !strings.Contains(e.Detail, `"nope"`) {
					t.Errorf("got detail %q, want it to name the upstream", e.Detail)
				}
			},
		},
		{
			name: "unknown upstream status", key: producerKey,
			call:       func(c *client.Client) error { _, err := c.Upstream(ctx, "nope"); return err },
			want:       client.ErrNotFound,
			wantStatus: 404,
		},
		{
			name: "missing upstream", key: producerKey,
			call:       func(c *client.Client) error { _, err := c.Enqueue(ctx, client.JobRequest{Path: "/x"}); return err },
			want:       client.ErrInvalid,
			wantStatus: 400,
			check: func(t *testing.T, e *client.Error) {
				if want := []client.FieldError{{Field: "upstream", Message: "is required"}}; !reflect.DeepEqual(e.Fields, want) {
					t.Errorf("got fields %v, want %v", e.Fields, want)
				}
				if e.Type == "" || e.Title != "Invalid request" || !strings.Contains(e.Error(), "upstream: is required") {
					t.Errorf("got %+v (%q), want the problem with its field in the message", e, e.Error())
				}
			},
		},
		{
			name: "partition too long", key: producerKey,
			call: func(c *client.Client) error {
				_, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe", Path: "/x", Partition: strings.Repeat("p", 201)})
				return err
			},
			want:       client.ErrInvalid,
			wantStatus: 400,
			check: func(t *testing.T, e *client.Error) {
				if len(e.Fields) != 1 || e.Fields[0].Field != "partition" {
					t.Errorf("got fields %v, want partition", e.Fields)
				}
			},
		},
		{
			name: "absolute path", key: producerKey,
			call: func(c *client.Client) error {
				_, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe", Path: "https://evil.example/x"})
				return err
			},
			want:       client.ErrInvalid,
			wantStatus: 400,
			check: func(t *testing.T, e *client.Error) {
				if len(e.Fields) != 1 || e.Fields[0].Field != "path" {
					t.Errorf("got fields %v, want path", e.Fields)
				}
			},
		},
		{
			name: "too large", key: producerKey,
			call: func(c *client.Client) error {
				_, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe", Body: bytes.Repeat([]byte("a"), 2<<20)})
				return err
			},
			want:       client.ErrInvalid,
			wantStatus: 413,
		},
		{
			name: "unsupported media type", key: producerKey,
			prepare: func(f *fake) {
				f.answer(canned{status: 415, header: http.Header{"Content-Type": {"application/problem+json"}}, body: `{"type":"about:blank","title":"Unsupported Media Type","status":415}`})
			},
			call: func(c *client.Client) error {
				_, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"})
				return err
			},
			want:       client.ErrInvalid,
			wantStatus: 415,
		},
		{
			name: "conflict", key: producerKey,
			prepare: func(f *fake) {
				f.answer(canned{status: 409, header: http.Header{"Content-Type": {"application/problem+json"}}, body: `{"title":"Conflict","status":409,"detail":"job is active"}`})
			},
			call:       func(c *client.Client) error { _, err := c.Cancel(ctx, "stripe.default.x"); return err },
			want:       client.ErrConflict,
			wantStatus: 409,
		},
		{
			name: "rate limited", key: producerKey,
			prepare: func(f *fake) { f.answer(rateLimited(3)) },
			call: func(c *client.Client) error {
				_, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"})
				return err
			},
			want:       client.ErrRateLimited,
			wantStatus: 429,
			check: func(t *testing.T, e *client.Error) {
				if e.RetryAfter != 3*time.Second {
					t.Errorf("got retry after %v, want 3s", e.RetryAfter)
				}
				want := client.RateLimit{Policy: "enqueue", Limit: 10, Window: 10 * time.Second, Remaining: 0, Reset: 4 * time.Second}
				if e.RateLimit == nil || *e.RateLimit != want {
					t.Errorf("got rate limit %v, want %v", e.RateLimit, want)
				}
				if got, want := e.RateLimit.String(), `"enqueue" 0/10 left, full in 4s`; got != want {
					t.Errorf("got %q, want %q", got, want)
				}
			},
		},
		{
			name: "admission spent for real", key: producerKey,
			prepare: func(f *fake) { f.setTokens(producerKey, 0) },
			call: func(c *client.Client) error {
				_, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"})
				return err
			},
			want:       client.ErrRateLimited,
			wantStatus: 429,
		},
		{
			name: "backlog full", key: producerKey,
			prepare: func(f *fake) { f.setMaxPending("openai", 0) },
			call: func(c *client.Client) error {
				_, err := c.Enqueue(ctx, client.JobRequest{Upstream: "openai"})
				return err
			},
			want: client.ErrBacklogFull, wantStatus: 503,
			check: func(t *testing.T, e *client.Error) {
				if e.RetryAfter != 7*time.Second || e.Title != "Backlog full" || e.RateLimit != nil {
					t.Errorf("got %+v, want backlog full, retry after 7s, no rate limit", e)
				}
			},
		},
		{
			name: "store unavailable", key: producerKey,
			prepare: func(f *fake) { f.setStoreDown(true) },
			call: func(c *client.Client) error {
				_, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"})
				return err
			},
			want: client.ErrUnavailable, wantStatus: 503,
			check: func(t *testing.T, e *client.Error) {
				if e.RetryAfter != time.Second || e.Type != "https://shaperhq.github.io/problems/store-unavailable" {
					t.Errorf("got %+v, want store-unavailable, retry after 1s", e)
				}
			},
		},
		{
			name: "proxy 503 in plain text", key: producerKey,
			prepare: func(f *fake) {
				f.answer(canned{status: 503, header: http.Header{"Content-Type": {"text/plain"}}, body: "upstream connect error\nor disconnect/reset before headers\n"})
			},
			call:       func(c *client.Client) error { _, err := c.Get(ctx, "x.y.z"); return err },
			want:       client.ErrUnavailable,
			wantStatus: 503,
			check: func(t *testing.T, e *client.Error) {
				if e.Title != "Service Unavailable" || e.Detail != "upstream connect error or disconnect/reset before headers" || e.RetryAfter != 0 {
					t.Errorf("got %+v, want the status text and the body as detail", e)
				}
			},
		},
		{
			name: "html bad gateway", key: producerKey,
			prepare: func(f *fake) {
				f.answer(canned{status: 502, header: http.Header{"Content-Type": {"text/html"}}, body: "<html><body><h1>502 Bad Gateway</h1></body></html>"})
			},
			call:       func(c *client.Client) error { _, err := c.Upstreams(ctx); return err },
			wantStatus: 502,
			check: func(t *testing.T, e *client.Error) {
				if e.Title != "Bad Gateway" || !strings.Contains(e.Detail, "502 Bad Gateway") {
					t.Errorf("got %+v, want the status text and the page", e)
				}
			},
		},
		{
			name: "json that is not a problem", key: producerKey,
			prepare: func(f *fake) {
				f.answer(canned{status: 500, header: http.Header{"Content-Type": {"application/json"}}, body: `{"error":{"message":"boom"}}`})
			},
			call:       func(c *client.Client) error { _, err := c.Get(ctx, "x.y.z"); return err },
			wantStatus: 500,
			check: func(t *testing.T, e *client.Error) {
				if e.Title != "Internal Server Error" || e.Detail != "boom" {
					t.Errorf("got %+v, want title from the status and detail boom", e)
				}
			},
		},
		{
			name: "empty 404", key: producerKey,
			prepare:    func(f *fake) { f.answer(canned{status: 404}) },
			call:       func(c *client.Client) error { _, err := c.Get(ctx, "x.y.z"); return err },
			want:       client.ErrNotFound,
			wantStatus: 404,
			check: func(t *testing.T, e *client.Error) {
				if e.Title != "Not Found" || e.Error() != "404 Not Found" {
					t.Errorf("got %+v (%q), want a bare 404", e, e.Error())
				}
			},
		},
		{
			name: "old-style rate limit headers and retry after from the body", key: producerKey,
			prepare: func(f *fake) {
				f.answer(canned{status: 429, header: http.Header{
					"X-Ratelimit-Limit": {"50"}, "X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {"12"},
				}, body: `{"title":"Too many","status":429,"retry_after":2.5}`})
			},
			call: func(c *client.Client) error {
				_, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"})
				return err
			},
			want:       client.ErrRateLimited,
			wantStatus: 429,
			check: func(t *testing.T, e *client.Error) {
				want := client.RateLimit{Limit: 50, Reset: 12 * time.Second}
				if e.RateLimit == nil || *e.RateLimit != want || e.RetryAfter != 2500*time.Millisecond {
					t.Errorf("got %v and retry after %v, want %v and 2.5s", e.RateLimit, e.RetryAfter, want)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake()
			defer f.Close()
			if tt.prepare != nil {
				tt.prepare(f)
			}
			c, _ := newClient(t, f, tt.key)
			err := tt.call(c)
			checkSentinel(t, err, tt.want)
			e := asError(t, err)
			if e.StatusCode != tt.wantStatus {
				t.Errorf("got status %d, want %d", e.StatusCode, tt.wantStatus)
			}
			if tt.check != nil {
				tt.check(t, e)
			}
			if n := f.jobCount(); n != 0 {
				t.Errorf("got %d jobs, want none after a refusal", n)
			}
		})
	}
}

func TestRetryAfterAsHTTPDate(t *testing.T) {
	f, c, s := setup(t, client.WithRetry(1))
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	client.SetTime(c, func() time.Time { return now }, nil)
	f.answer(canned{status: 503, header: http.Header{"Retry-After": {now.Add(9 * time.Second).Format(http.TimeFormat)}}})
	if _, err := c.Upstreams(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, want := s.recorded(), []time.Duration{9 * time.Second}; !reflect.DeepEqual(got, want) {
		t.Errorf("got waits %v, want %v", got, want)
	}
}

func TestRetry(t *testing.T) {
	ctx := context.Background()

	t.Run("honours retry after and keeps one idempotency key", func(t *testing.T) {
		f, c, s := setup(t, client.WithRetry(3))
		f.answer(rateLimited(3), backlogFull(5))
		job, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"})
		if err != nil {
			t.Fatalf("Enqueue: %v", err)
		}
		if got, want := s.recorded(), []time.Duration{3 * time.Second, 5 * time.Second}; !reflect.DeepEqual(got, want) {
			t.Errorf("got waits %v, want %v", got, want)
		}
		reqs := f.log()
		if len(reqs) != 3 {
			t.Fatalf("got %d requests, want 3", len(reqs))
		}
		key := jsonOf(t, reqs[0].Body)["idempotency_key"]
		if k, _ := key.(string); k == "" {
			t.Fatalf("got idempotency key %v on a retried enqueue, want one made up", key)
		}
		for i, r := range reqs {
			if got := jsonOf(t, r.Body)["idempotency_key"]; got != key {
				t.Errorf("attempt %d: got key %v, want %v", i, got, key)
			}
		}
		if job.IdempotencyKey != key || job.Existing || f.jobCount() != 1 {
			t.Errorf("got %+v and %d jobs, want one new job under key %v", job, f.jobCount(), key)
		}
	})

	t.Run("keeps the caller's key", func(t *testing.T) {
		f, c, _ := setup(t, client.WithRetry(1))
		f.answer(rateLimited(1))
		if _, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe", IdempotencyKey: "mine"}); err != nil {
			t.Fatal(err)
		}
		for _, r := range f.log() {
			if got := jsonOf(t, r.Body)["idempotency_key"]; got != "mine" {
				t.Errorf("got key %v, want mine", got)
			}
		}
	})

	t.Run("makes up no key without retries", func(t *testing.T) {
		f, c, _ := setup(t)
		if _, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"}); err != nil {
			t.Fatal(err)
		}
		if _, ok := jsonOf(t, f.log()[0].Body)["idempotency_key"]; ok {
			t.Error("got an idempotency key, want none when retries are off")
		}
	})

	t.Run("each enqueue gets its own key", func(t *testing.T) {
		f, c, _ := setup(t, client.WithRetry(1))
		c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"})
		c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"})
		reqs := f.log()
		if a, b := jsonOf(t, reqs[0].Body)["idempotency_key"], jsonOf(t, reqs[1].Body)["idempotency_key"]; a == b {
			t.Errorf("got the same key %v twice, want two", a)
		}
		if f.jobCount() != 2 {
			t.Errorf("got %d jobs, want 2", f.jobCount())
		}
	})

	t.Run("gives up after max retries", func(t *testing.T) {
		f, c, s := setup(t, client.WithRetry(2))
		f.answer(rateLimited(1), rateLimited(1), rateLimited(2), rateLimited(1))
		_, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"})
		checkSentinel(t, err, client.ErrRateLimited)
		if e := asError(t, err); e.RetryAfter != 2*time.Second {
			t.Errorf("got retry after %v, want the last refusal's 2s", e.RetryAfter)
		}
		if n := len(f.log()); n != 3 {
			t.Errorf("got %d requests, want 3", n)
		}
		if n := len(s.recorded()); n != 2 {
			t.Errorf("got %d waits, want 2", n)
		}
	})

	t.Run("does not retry what cannot succeed", func(t *testing.T) {
		for _, c := range []canned{
			{status: 400, body: `{"title":"Invalid request","status":400}`},
			{status: 404},
			{status: 409},
			{status: 500, header: http.Header{"Retry-After": {"1"}}},
			{status: 502},
		} {
			f, cl, s := setup(t, client.WithRetry(5))
			f.answer(c)
			if _, err := cl.Enqueue(ctx, client.JobRequest{Upstream: "stripe"}); err == nil {
				t.Errorf("%d: got no error, want one", c.status)
			}
			if n := len(f.log()); n != 1 || len(s.recorded()) != 0 {
				t.Errorf("%d: got %d requests and waits %v, want 1 request and no wait", c.status, n, s.recorded())
			}
		}
	})

	t.Run("does not retry network errors", func(t *testing.T) {
		f := newFake()
		f.Close()
		c, s := newClient(t, f, producerKey, client.WithRetry(5))
		if _, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"}); err == nil {
			t.Error("got no error from a closed server, want one")
		}
		if len(s.recorded()) != 0 {
			t.Errorf("got waits %v, want none", s.recorded())
		}
	})

	t.Run("refuses to wait longer than the cap", func(t *testing.T) {
		f, c, s := setup(t, client.WithRetry(5), client.WithMaxRetryWait(10*time.Second))
		f.answer(rateLimited(30))
		_, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"})
		checkSentinel(t, err, client.ErrRateLimited)
		if e := asError(t, err); e.RetryAfter != 30*time.Second {
			t.Errorf("got retry after %v, want 30s handed to the caller", e.RetryAfter)
		}
		if n := len(f.log()); n != 1 || len(s.recorded()) != 0 {
			t.Errorf("got %d requests and waits %v, want 1 and none", n, s.recorded())
		}
	})

	t.Run("refuses to wait past the deadline", func(t *testing.T) {
		f, c, s := setup(t, client.WithRetry(5))
		now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
		client.SetTime(c, func() time.Time { return now }, nil)
		dctx, cancel := context.WithDeadline(ctx, now.Add(2*time.Second))
		defer cancel()
		f.answer(rateLimited(3))
		_, err := c.Enqueue(dctx, client.JobRequest{Upstream: "stripe"})
		checkSentinel(t, err, client.ErrRateLimited)
		if len(s.recorded()) != 0 {
			t.Errorf("got waits %v, want none", s.recorded())
		}
	})

	t.Run("backs off on its own when no wait is named", func(t *testing.T) {
		f, c, s := setup(t, client.WithRetry(3), client.WithMaxRetryWait(3*time.Second))
		f.answer(canned{status: 503}, canned{status: 503}, canned{status: 429})
		if _, err := c.Upstream(ctx, "stripe"); err != nil {
			t.Fatal(err)
		}
		if got, want := s.recorded(), []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}; !reflect.DeepEqual(got, want) {
			t.Errorf("got waits %v, want %v", got, want)
		}
	})

	t.Run("retry after zero retries at once", func(t *testing.T) {
		f, c, s := setup(t, client.WithRetry(1))
		f.answer(rateLimited(0))
		if _, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"}); err != nil {
			t.Fatal(err)
		}
		if got, want := s.recorded(), []time.Duration{0}; !reflect.DeepEqual(got, want) {
			t.Errorf("got waits %v, want %v", got, want)
		}
	})

	t.Run("ctx ends the wait", func(t *testing.T) {
		f, c, s := setup(t, client.WithRetry(3))
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		s.hook = func(int) error { cancel(); return nil }
		f.answer(rateLimited(1), rateLimited(1))
		_, err := c.Enqueue(cctx, client.JobRequest{Upstream: "stripe"})
		if !errors.Is(err, context.Canceled) || !errors.Is(err, client.ErrRateLimited) {
			t.Errorf("got %v, want both context.Canceled and ErrRateLimited", err)
		}
		if n := len(f.log()); n != 1 {
			t.Errorf("got %d requests, want 1", n)
		}
	})
}

func TestEnqueueBatch(t *testing.T) {
	f, c, _ := setup(t)
	ctx := context.Background()
	if _, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe", IdempotencyKey: "dup"}); err != nil {
		t.Fatal(err)
	}
	results, err := c.EnqueueBatch(ctx, []client.JobRequest{
		{Upstream: "stripe", Path: "/v1/charges", Body: []byte("a=1")},
		{Path: "/v1/charges"},
		{Upstream: "nope"},
		{Upstream: "stripe", IdempotencyKey: "dup"},
		{Upstream: "openai", Lane: "default", Body: []byte{0xff, 0xfe}},
	})
	if err != nil {
		t.Fatalf("EnqueueBatch: %v", err)
	}
	log := f.log()
	r := log[len(log)-1]
	if r.Method != "POST" || r.Path != "/v1/jobs/batch" || r.Header.Get("Authorization") != "Bearer "+producerKey {
		t.Errorf("got %s %s, want POST /v1/jobs/batch with the key", r.Method, r.Path)
	}
	want := map[string]any{"jobs": []any{
		map[string]any{"upstream": "stripe", "path": "/v1/charges", "body": "a=1"},
		map[string]any{"upstream": "", "path": "/v1/charges"},
		map[string]any{"upstream": "nope"},
		map[string]any{"upstream": "stripe", "idempotency_key": "dup"},
		map[string]any{"upstream": "openai", "lane": "default", "body_base64": "//4="},
	}}
	if got := jsonOf(t, r.Body); !reflect.DeepEqual(got, want) {
		t.Errorf("body:\ngot  %v\nwant %v", got, want)
	}

	if len(results) != 5 {
		t.Fatalf("got %d results, want 5", len(results))
	}
	wantStatus := []int{202, 400, 404, 200, 202}
	wantErr := []error{nil, client.ErrInvalid, client.ErrNotFound, nil, nil}
	for i, res := range results {
		if res.Index != i || res.Status != wantStatus[i] {
			t.Errorf("result %d: got index %d status %d, want %d %d", i, res.Index, res.Status, i, wantStatus[i])
		}
		if wantErr[i] != nil {
			checkSentinel(t, res.Err, wantErr[i])
			if res.Job != nil {
				t.Errorf("result %d: got job %+v beside an error", i, res.Job)
			}
			continue
		}
		if res.Err != nil || res.Job == nil || res.Job.ID == "" {
			t.Errorf("result %d: got %+v, want a job", i, res)
		}
	}
	if e := asError(t, results[1].Err); len(e.Fields) != 1 || e.Fields[0].Field != "upstream" || e.StatusCode != 400 {
		t.Errorf("got %+v, want a 400 naming upstream", e)
	}
	if !results[3].Job.Existing || results[3].Job.ID != "stripe.default.j1" || results[0].Job.Existing {
		t.Errorf("got %+v and %+v, want only the repeat marked existing", results[3].Job, results[0].Job)
	}

	got, err := c.Get(ctx, results[4].Job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Upstream != "openai" {
		t.Errorf("got %+v, want the openai job", got)
	}
}

func TestEnqueueBatchRefusedWhole(t *testing.T) {
	f, c, _ := setup(t)
	f.setTokens(producerKey, 2)
	_, err := c.EnqueueBatch(context.Background(), []client.JobRequest{{Upstream: "stripe"}, {Upstream: "stripe"}, {Upstream: "stripe"}})
	checkSentinel(t, err, client.ErrRateLimited)
	if e := asError(t, err); e.RetryAfter != time.Second || e.RateLimit == nil {
		t.Errorf("got %+v, want retry after and rate limit headers", e)
	}
	if n := f.jobCount(); n != 0 {
		t.Errorf("got %d jobs, want none", n)
	}
	if res, err := c.EnqueueBatch(context.Background(), nil); res != nil || err != nil || len(f.log()) != 1 {
		t.Errorf("empty batch: got %v, %v, want nothing sent", res, err)
	}
}

func TestEnqueueBatchRetry(t *testing.T) {
	f, c, s := setup(t, client.WithRetry(2))
	f.answer(rateLimited(4))
	results, err := c.EnqueueBatch(context.Background(), []client.JobRequest{{Upstream: "stripe"}, {Upstream: "stripe", IdempotencyKey: "own"}, {Upstream: "openai"}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.recorded(), []time.Duration{4 * time.Second}; !reflect.DeepEqual(got, want) {
		t.Errorf("got waits %v, want %v", got, want)
	}
	reqs := f.log()
	if len(reqs) != 2 || !bytes.Equal(reqs[0].Body, reqs[1].Body) {
		t.Fatalf("got %d requests, want 2 identical ones", len(reqs))
	}
	keys := map[any]bool{}
	for _, j := range jsonOf(t, reqs[0].Body)["jobs"].([]any) {
		k := j.(map[string]any)["idempotency_key"]
		if k == nil || k == "" || keys[k] {
			t.Errorf("got key %v, want a distinct key per job", k)
		}
		keys[k] = true
	}
	if !keys["own"] {
		t.Errorf("got keys %v, want the caller's own kept", keys)
	}
	for i, r := range results {
		if r.Err != nil || r.Status != 202 {
			t.Errorf("result %d: got %+v, want accepted", i, r)
		}
	}
}

func TestEnqueueBatchMismatchedAnswer(t *testing.T) {
	job := `{"id":"stripe.default.j1","state":"queued","upstream":"stripe","lane":"default"}`
	for name, body := range map[string]string{
		"missing":      `{"results":[{"index":0,"status":202,"job":` + job + `}]}`,
		"out of range": `{"results":[{"index":0,"status":202,"job":` + job + `},{"index":2,"status":202,"job":` + job + `}]}`,
		"repeated":     `{"results":[{"index":0,"status":202,"job":` + job + `},{"index":0,"status":202,"job":` + job + `}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			f, c, _ := setup(t)
			f.answer(canned{status: 200, header: http.Header{"Content-Type": {"application/json"}}, body: body})
			if _, err := c.EnqueueBatch(context.Background(), []client.JobRequest{{Upstream: "stripe"}, {Upstream: "stripe"}}); err == nil {
				t.Error("got no error, want one for results that do not match the jobs")
			}
		})
	}
}

// longPolls are the GETs of job id the fake received, with their wait.
func longPolls(f *fake, id string) []string {
	var out []string
	for _, r := range f.log() {
		if r.Method == "GET" && strings.HasSuffix(r.Path, "/"+id) {
			q, _ := url.ParseQuery(r.Query)
			out = append(out, q.Get("wait"))
		}
	}
	return out
}

func TestWait(t *testing.T) {
	ctx := context.Background()

	t.Run("one long poll per window, no polling", func(t *testing.T) {
		f, c, s := setup(t)
		f.setStates("queued", "active", "retrying", "active", "succeeded")
		job, _ := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe", Body: []byte("hi")})
		var seen []client.State
		got, err := c.Wait(ctx, job.ID, client.WithProgress(func(j *client.Job) { seen = append(seen, j.State) }))
		if err != nil {
			t.Fatal(err)
		}
		if got.State != client.StateSucceeded || string(got.Response.Body) != "hi" {
			t.Errorf("got %+v, want succeeded with the echo", got)
		}
		if got, want := longPolls(f, job.ID), []string{"20000ms", "20000ms", "20000ms", "20000ms", "20000ms"}; !reflect.DeepEqual(got, want) {
			t.Errorf("got GETs with wait %q, want one long poll of the default window per state", got)
		}
		if w := s.recorded(); len(w) != 0 {
			t.Errorf("slept %v between long polls, want no sleep at all", w)
		}
		if want := []client.State{"queued", "active", "retrying", "active"}; !reflect.DeepEqual(seen, want) {
			t.Errorf("progress saw %v, want %v", seen, want)
		}
	})

	t.Run("window", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			opts []client.WaitOption
			http *http.Client
			want string
		}{
			{"asked for", []client.WaitOption{client.WithWaitWindow(5 * time.Second)}, nil, "5000ms"},
			{"the server's bound", []client.WaitOption{client.WithWaitWindow(5 * time.Minute)}, &http.Client{}, "60000ms"},
			{"within the http timeout", []client.WaitOption{client.WithWaitWindow(time.Minute)}, nil, "24000ms"},
			{"within a short http timeout", nil, &http.Client{Timeout: 2 * time.Second}, "1000ms"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				var opts []client.Option
				if tc.http != nil {
					opts = append(opts, client.WithHTTPClient(tc.http))
				}
				f, c, _ := setup(t, opts...)
				f.setStates("active", "succeeded")
				job, _ := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"})
				if _, err := c.Wait(ctx, job.ID, tc.opts...); err != nil {
					t.Fatal(err)
				}
				if got := longPolls(f, job.ID); len(got) != 2 || got[0] != tc.want {
					t.Errorf("got waits %q, want two of %s", got, tc.want)
				}
			})
		}
	})

	t.Run("within ctx's deadline", func(t *testing.T) {
		f, c, _ := setup(t)
		f.setStates("active", "succeeded")
		job, _ := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"})
		dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		if _, err := c.Wait(dctx, job.ID); err != nil {
			t.Fatal(err)
		}
		got := longPolls(f, job.ID)
		d, err := time.ParseDuration(got[0])
		if err != nil || d > 3*time.Second || d < 2*time.Second {
			t.Errorf("got wait %q with 3s left, want about 3s", got[0])
		}
	})

	t.Run("a server that answers at once", func(t *testing.T) {
		f, c, s := setup(t)
		f.ignoreWait = true
		f.setStates("active", "active", "active", "dead")
		job, _ := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"})
		got, err := c.Wait(ctx, job.ID)
		if err != nil || got.State != client.StateDead {
			t.Fatalf("got %+v, %v, want dead", got, err)
		}
		if got, want := s.recorded(), []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second}; !reflect.DeepEqual(got, want) {
			t.Errorf("got pauses %v, want a back-off, not a busy loop", got)
		}
	})

	t.Run("already final", func(t *testing.T) {
		f, c, s := setup(t)
		job, _ := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"})
		c.Cancel(ctx, job.ID)
		got, err := c.Wait(ctx, job.ID)
		if err != nil || got.State != client.StateCancelled || len(s.recorded()) != 0 || len(longPolls(f, job.ID)) != 1 {
			t.Errorf("got %+v, %v, waits %v, want cancelled at once", got, err, s.recorded())
		}
	})

	t.Run("ctx cancelled while waiting", func(t *testing.T) {
		f, c, _ := setup(t)
		job, _ := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"})
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		n := 0
		got, err := c.Wait(cctx, job.ID, client.WithProgress(func(*client.Job) {
			if n++; n == 3 {
				cancel()
			}
		}))
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want context.Canceled", err)
		}
		if got == nil || got.ID != job.ID || got.State != client.StateQueued {
			t.Errorf("got %+v, want the job as last seen", got)
		}
		if gets := len(longPolls(f, job.ID)); gets != 3 {
			t.Errorf("got %d long polls, want 3", gets)
		}
	})

	t.Run("ctx already done", func(t *testing.T) {
		_, c, _ := setup(t)
		job, _ := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"})
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		got, err := c.Wait(cctx, job.ID)
		if !errors.Is(err, context.Canceled) || got != nil {
			t.Errorf("got %+v, %v, want nil and context.Canceled", got, err)
		}
	})

	t.Run("unknown job", func(t *testing.T) {
		_, c, _ := setup(t)
		_, err := c.Wait(ctx, "stripe.default.nope")
		checkSentinel(t, err, client.ErrNotFound)
	})
}

func TestUpstreams(t *testing.T) {
	f, c, _ := setup(t)
	ctx := context.Background()
	c.Enqueue(ctx, client.JobRequest{Upstream: "stripe", Lane: "bulk"})

	all, err := c.Upstreams(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || all[0].Name != "openai" || all[1].Name != "stripe" {
		t.Fatalf("got %+v, want openai and stripe", all)
	}
	st, err := c.Upstream(ctx, "stripe")
	if err != nil {
		t.Fatal(err)
	}
	log := f.log()
	if log[1].Method != "GET" || log[1].Path != "/v1/upstreams" || log[2].Path != "/v1/upstreams/stripe" {
		t.Errorf("got %s %s and %s, want GET /v1/upstreams and /v1/upstreams/stripe", log[1].Method, log[1].Path, log[2].Path)
	}
	wantLimits := []client.Limit{
		{Rate: 100, Per: time.Second, Burst: 1, Description: "100 req/s", SustainedPerSecond: 99.5,
			Adaptive: true, EffectiveRate: 37.5, Source: client.SourceAdaptive},
		{Rate: 800000, Per: time.Minute, Cost: "tokens", Burst: 1, Description: "800000 tokens/min", SustainedPerSecond: 13333.3,
			EffectiveRate: 600000, Source: client.SourceStated},
	}
	if !reflect.DeepEqual(st.Limits, wantLimits) {
		t.Errorf("got limits %+v, want %+v", st.Limits, wantLimits)
	}
	wantStated := []client.Limit{{Rate: 10000, Per: time.Second, Cost: "tokens", Description: "10000 tokens/s", SustainedPerSecond: 9800,
		EffectiveRate: 10000, Source: client.SourceStated}}
	if !reflect.DeepEqual(st.StatedLimits, wantStated) {
		t.Errorf("got stated limits %+v, want %+v", st.StatedLimits, wantStated)
	}
	if st.Concurrency != 20 || st.DrainRate != (client.DrainRate{Last10s: 98.2, Last60s: 97.9}) || st.InFlight != 3 ||
		st.Retrying != 2 || st.Dead != 2 || st.Succeeded != 80 || !st.PausedUntil.IsZero() || st.Paused(time.Now()) {
		t.Errorf("got %+v, want the fake's numbers", st)
	}
	if st.Backlog.Total != 1 || st.Backlog.Lanes["bulk"].Pending != 1 || !reflect.DeepEqual(st.Backlog.Lanes["default"], client.LaneCounts{Dead: 1, Succeeded: 40}) {
		t.Errorf("got backlog %+v, want 1 pending in bulk", st.Backlog)
	}
	if d, ok := st.TimeToDrain(); !ok || d <= 0 {
		t.Errorf("got time to drain %v, %v, want a positive duration", d, ok)
	}
	if _, ok := all[0].TimeToDrain(); ok {
		t.Error("got a time to drain for openai, want none (null)")
	}
	if got := st.Limits[1].String(); got != "800000 tokens/min" {
		t.Errorf("got %q, want the description", got)
	}
	if st.Partitions.WithBacklog != 0 || len(st.Partitions.Top) != 0 {
		t.Errorf("got partitions %+v, want none", st.Partitions)
	}
}

func TestUpstreamPartitions(t *testing.T) {
	_, c, _ := setup(t)
	ctx := context.Background()
	for p, n := range map[string]int{"a.example": 3, "b.example": 1} {
		for i := 0; i < n; i++ {
			if _, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe", Path: "/x", Partition: p}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe", Path: "/x"}); err != nil {
		t.Fatal(err)
	}
	st, err := c.Upstream(ctx, "stripe")
	if err != nil {
		t.Fatal(err)
	}
	want := client.Partitions{WithBacklog: 2, Top: []client.PartitionBacklog{
		{Partition: "a.example", Backlog: 3}, {Partition: "b.example", Backlog: 1},
	}}
	if !reflect.DeepEqual(st.Partitions, want) {
		t.Errorf("got partitions %+v, want %+v", st.Partitions, want)
	}
}

func TestLimitPerEncodings(t *testing.T) {
	for raw, want := range map[string]time.Duration{`"1m0s"`: time.Minute, `"250ms"`: 250 * time.Millisecond, `60`: time.Minute, `0.5`: 500 * time.Millisecond, `"2"`: 2 * time.Second, `null`: 0} {
		var l client.Limit
		if err := json.Unmarshal([]byte(`{"rate":1,"per":`+raw+`}`), &l); err != nil || l.Per != want {
			t.Errorf("per %s: got %v, %v, want %v", raw, l.Per, err, want)
		}
	}
	var l client.Limit
	if err := json.Unmarshal([]byte(`{"rate":1,"per":"often"}`), &l); err == nil {
		t.Error("per often: got no error, want one")
	}
	// A limit survives a round trip, the fields of dynamic limits too.
	in := client.Limit{Rate: 100, Per: time.Second, Description: "100 requests per 1s", SustainedPerSecond: 98,
		Adaptive: true, EffectiveRate: 37.5, Source: client.SourceAdaptive}
	var out client.Limit
	if b, err := json.Marshal(in); err != nil || json.Unmarshal(b, &out) != nil || out != in {
		t.Errorf("round trip: got %+v (%v), want %+v", out, err, in)
	}
	if got := (client.Limit{Rate: 5, Per: time.Minute, Cost: "tokens"}).String(); got != "5/1m0s tokens" {
		t.Errorf("got %q, want 5/1m0s tokens", got)
	}
}

func TestPauseResume(t *testing.T) {
	f := newFake()
	defer f.Close()
	c, _ := newClient(t, f, adminKey)
	ctx := context.Background()

	tests := []struct {
		d        time.Duration
		wantBody string
	}{
		{30 * time.Second, `{"for":"30s"}`},
		{1500 * time.Millisecond, `{"for":"1.5s"}`},
		{0, `{}`},
	}
	for _, tt := range tests {
		before := time.Now()
		st, err := c.Pause(ctx, "stripe", tt.d)
		if err != nil {
			t.Fatalf("Pause %v: %v", tt.d, err)
		}
		log := f.log()
		r := log[len(log)-1]
		if r.Method != "POST" || r.Path != "/v1/upstreams/stripe/pause" || string(r.Body) != tt.wantBody || r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("Pause %v: got %s %s %s, want POST /v1/upstreams/stripe/pause %s", tt.d, r.Method, r.Path, r.Body, tt.wantBody)
		}
		if st.Name != "stripe" || !st.Paused(before) || st.PauseReason != "paused by operator" {
			t.Errorf("Pause %v: got %+v, want paused", tt.d, st)
		}
	}

	st, err := c.Resume(ctx, "stripe")
	if err != nil {
		t.Fatal(err)
	}
	log := f.log()
	if r := log[len(log)-1]; r.Method != "POST" || r.Path != "/v1/upstreams/stripe/resume" || string(r.Body) != "{}" {
		t.Errorf("got %s %s %s, want POST /v1/upstreams/stripe/resume {}", r.Method, r.Path, r.Body)
	}
	if !st.PausedUntil.IsZero() || st.Paused(time.Now()) {
		t.Errorf("got %+v, want not paused", st)
	}

	if _, err := c.Pause(ctx, "stripe", -time.Second); err == nil {
		t.Error("negative pause: got no error, want one")
	}
	_, err = c.Resume(ctx, "nope")
	checkSentinel(t, err, client.ErrNotFound)

	producer, _ := newClient(t, f, producerKey)
	_, err = producer.Resume(ctx, "stripe")
	checkSentinel(t, err, client.ErrUnauthorized)
}

func TestBaseURLWithPrefixAndOptions(t *testing.T) {
	f := newFake()
	defer f.Close()
	proxy := httptest.NewServer(http.StripPrefix("/shaper", f.srv.Config.Handler))
	defer proxy.Close()

	var mu sync.Mutex
	used := 0
	hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		mu.Lock()
		used++
		mu.Unlock()
		return http.DefaultTransport.RoundTrip(r)
	})}
	c, err := client.New(proxy.URL+"/shaper/", producerKey, client.WithHTTPClient(hc), client.WithUserAgent("billing-svc/1.2"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enqueue(context.Background(), client.JobRequest{Upstream: "stripe"}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if used != 1 {
		t.Errorf("got %d requests through the given client, want 1", used)
	}
	if ua := f.log()[0].Header.Get("User-Agent"); ua != "billing-svc/1.2" {
		t.Errorf("got user agent %q, want billing-svc/1.2", ua)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestErrorMessage(t *testing.T) {
	e := &client.Error{StatusCode: 400, Title: "Invalid request", Detail: "2 fields are invalid",
		Fields: []client.FieldError{{Field: "path", Message: "must be relative"}, {Field: "ttl", Message: "must be positive"}}}
	if got, want := e.Error(), "400 Invalid request: 2 fields are invalid (path: must be relative; ttl: must be positive)"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestConcurrentUse(t *testing.T) {
	f, c, _ := setup(t, client.WithRetry(2))
	f.setStates("active", "succeeded")
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			job, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"})
			if err == nil {
				_, err = c.Wait(ctx, job.ID)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if n := f.jobCount(); n != 16 {
		t.Errorf("got %d jobs, want 16", n)
	}
}
