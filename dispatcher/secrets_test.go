package dispatcher

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/fakeupstream"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// TestNoSecretsLeftInRedis runs jobs carrying a producer's credentials
// through a real dispatcher to an upstream that answers with Set-Cookie and
// other headers. The upstream must get every header on every attempt;
// once the jobs have finished (succeeded, succeeded after a retry, dead,
// expired, cancelled), no key in Redis may hold a secret value or the
// Set-Cookie value.
func TestNoSecretsLeftInRedis(t *testing.T) {
	const (
		auth      = "Bearer AUTH-SECRET-1f9c"
		cookie    = "sid=COOKIE-SECRET-77aa"
		token     = "TOKEN-SECRET-0b3e"
		setCookie = "session=SETCOOKIE-SECRET-5d21; HttpOnly"
		requestID = "req-VISIBLE-9e0f"
	)
	secrets := []string{"AUTH-SECRET-1f9c", "COOKIE-SECRET-77aa", "TOKEN-SECRET-0b3e", "SETCOOKIE-SECRET-5d21"}
	h := newHarness(t, fakeupstream.Config{}, shaper.Upstream{}, 3)
	q, err := queue.New(h.rdb, queue.Config{Upstreams: []shaper.Upstream{
		{Name: "api", Limits: []leaky.Limit{leaky.PerSecond(1000)}, MaxPending: 1000, Retry: shaper.Retry{MaxAttempts: 3}, ResultRetention: time.Hour, DeadRetention: time.Hour,
			SensitiveHeaders: []string{"X-*-Token"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	h.q = q

	var mu sync.Mutex
	calls := map[string]int{}
	var missing []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls[r.URL.Path]++
		n := calls[r.URL.Path]
		for name, want := range map[string]string{"Authorization": auth, "Cookie": cookie, "X-Api-Token": token, "X-Trace": "t1"} {
			if got := r.Header.Get(name); got != want {
				missing = append(missing, fmt.Sprintf("%s attempt %d: %s %q, want %q", r.URL.Path, n, name, got, want))
			}
		}
		mu.Unlock()
		w.Header().Set("Set-Cookie", setCookie)
		w.Header().Set("X-Request-Id", requestID)
		w.Header().Set("X-Internal-Debug", "node-7")
		w.Header().Set("Content-Type", "text/plain")
		switch {
		case r.URL.Path == "/bad":
			w.WriteHeader(http.StatusBadRequest)
		case r.URL.Path == "/flaky" && n == 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprint(w, "done")
	}))
	defer up.Close()
	h.start(Config{Upstreams: []shaper.Upstream{{Name: "api", BaseURL: up.URL, Limits: []leaky.Limit{leaky.PerSecond(1000)},
		Retry: shaper.Retry{MinBackoff: 5 * time.Millisecond, MaxBackoff: 10 * time.Millisecond}}}}, nil)

	headers := func() map[string]string {
		return map[string]string{"Authorization": auth, "Cookie": cookie, "X-Api-Token": token, "X-Trace": "t1"}
	}
	ok := h.enqueue(&queue.Job{Tenant: "t", Upstream: "api", Path: "/ok", Headers: headers(), IdempotencyKey: "ok"})
	// The repeat must neither replace nor leave a second copy of the secrets.
	h.enqueue(&queue.Job{Tenant: "t", Upstream: "api", Path: "/ok", Headers: headers(), IdempotencyKey: "ok"})
	flaky := h.enqueue(&queue.Job{Tenant: "t", Upstream: "api", Path: "/flaky", Headers: headers()})
	bad := h.enqueue(&queue.Job{Tenant: "t", Upstream: "api", Path: "/bad", Headers: headers()})
	expired := h.enqueue(&queue.Job{Tenant: "t", Upstream: "api", Path: "/late", Headers: headers(), ExpiresAt: time.Now().Add(-time.Second)})
	later := h.enqueue(&queue.Job{Tenant: "t", Upstream: "api", Path: "/later", Headers: headers(), NotBefore: time.Now().Add(time.Hour)})
	if _, err := h.q.Cancel(context.Background(), later.ID, "t"); err != nil {
		t.Fatal(err)
	}
	got := h.waitFor([]string{ok.ID, flaky.ID, bad.ID, expired.ID}, queue.StateSucceeded, queue.StateDead)
	for id, want := range map[string]queue.State{ok.ID: queue.StateSucceeded, flaky.ID: queue.StateSucceeded, bad.ID: queue.StateDead, expired.ID: queue.StateDead} {
		if got[id].State != want {
			t.Errorf("job %s (%s): got %s (%s), want %s", id, got[id].Path, got[id].State, got[id].LastError, want)
		}
	}
	mu.Lock()
	if calls["/ok"] != 1 || calls["/flaky"] != 2 || calls["/bad"] != 1 || calls["/late"] != 0 || calls["/later"] != 0 {
		t.Errorf("upstream calls %v, want /ok 1, /flaky 2, /bad 1 and none for the expired and cancelled jobs", calls)
	}
	for _, m := range missing {
		t.Error("upstream did not get the job's header: " + m)
	}
	mu.Unlock()
	// What is stored of the answer: allowed headers, never Set-Cookie.
	resp := got[ok.ID].Response
	if resp == nil || resp.Status != 200 || string(resp.Body) != "done" {
		t.Fatalf("stored response %+v, want 200 done", resp)
	}
	if resp.Headers["X-Request-Id"] == nil || resp.Headers["Content-Type"] == nil || resp.Headers["Set-Cookie"] != nil || resp.Headers["X-Internal-Debug"] != nil {
		t.Errorf("stored response headers %v: want X-Request-Id and Content-Type, not Set-Cookie nor X-Internal-Debug", resp.Headers)
	}

	dump := dumpRedis(t, h.rdb)
	if !strings.Contains(dump, requestID) {
		t.Fatal("the dump lacks the stored X-Request-Id: the scan does not read the values")
	}
	for _, s := range secrets {
		if i := strings.Index(dump, s); i >= 0 {
			t.Errorf("Redis still holds %q after the jobs finished: ...%s...", s, dump[max(i-200, 0):min(i+50, len(dump))])
		}
	}
}

// dumpRedis reads every key of the database with every value, whatever its
// type, into one string.
func dumpRedis(t *testing.T, rdb *redis.Client) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	iter := rdb.Scan(ctx, 0, "*", 100).Iterator()
	keys := 0
	for iter.Next(ctx) {
		key := iter.Val()
		keys++
		fmt.Fprintf(&b, "\n== %s: ", key)
		typ := rdb.Type(ctx, key).Val()
		var v any
		var err error
		switch typ {
		case "string":
			v, err = rdb.Get(ctx, key).Result()
		case "hash":
			v, err = rdb.HGetAll(ctx, key).Result()
		case "list":
			v, err = rdb.LRange(ctx, key, 0, -1).Result()
		case "set":
			v, err = rdb.SMembers(ctx, key).Result()
		case "zset":
			v, err = rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
		case "stream":
			v, err = rdb.XRange(ctx, key, "-", "+").Result()
		case "none":
			continue // expired since the scan saw it
		default:
			t.Fatalf("key %s has type %s, which the dump cannot read", key, typ)
		}
		if err != nil && err != redis.Nil {
			t.Fatalf("read %s: %v", key, err)
		}
		fmt.Fprintf(&b, "%s %v", typ, v)
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	if keys == 0 {
		t.Fatal("Redis holds no keys at all")
	}
	return b.String()
}

func TestStoredResponse(t *testing.T) {
	full := &queue.Response{Status: 429, Body: []byte("slow down"), Truncated: true, Headers: map[string][]string{
		"Content-Type": {"application/json"}, "Set-Cookie": {"a=b"}, "Retry-After": {"3"}, "X-Ratelimit-Remaining-Requests": {"0"},
		"Ratelimit-Policy": {"10;w=1"}, "Request-Id": {"req_1"}, "X-Amzn-Requestid": {"amz"}, "Server": {"nginx"}, "X-Debug": {"x"},
	}}
	kept := []string{"Content-Type", "Retry-After", "X-Ratelimit-Remaining-Requests", "Ratelimit-Policy", "Request-Id", "X-Amzn-Requestid"}
	for _, mode := range []string{shaper.StoreFull, shaper.StoreHeaders, shaper.StoreStatus} {
		u := &upstream{cfg: shaper.Upstream{StoreResponse: mode}, base: &url.URL{Scheme: "https", Host: "api.example"}}
		got := u.stored(full)
		if got.Status != 429 {
			t.Errorf("%s: status %d, want 429", mode, got.Status)
		}
		wantHeaders := 0
		if mode != shaper.StoreStatus {
			wantHeaders = len(kept)
			for _, h := range kept {
				if got.Headers[h] == nil {
					t.Errorf("%s: header %s dropped, want it kept", mode, h)
				}
			}
		}
		if len(got.Headers) != wantHeaders {
			t.Errorf("%s: kept headers %v, want %d of them", mode, got.Headers, wantHeaders)
		}
		if wantBody := mode == shaper.StoreFull; (string(got.Body) == "slow down") != wantBody || got.Truncated != wantBody {
			t.Errorf("%s: body %q truncated %v, want the body only with full", mode, got.Body, got.Truncated)
		}
	}
	if len(full.Headers) != 9 {
		t.Error("stored changed the answer it was given, which classify still reads")
	}
}

// TestJobWithoutItsSecretsIsNotSent: a job whose sensitive headers expired
// goes dead without a request, rather than being sent without them.
func TestJobWithoutItsSecretsIsNotSent(t *testing.T) {
	h := newHarness(t, fakeupstream.Config{}, shaper.Upstream{}, 3)
	h.start(Config{Upstreams: []shaper.Upstream{{Name: "api", Limits: []leaky.Limit{leaky.PerSecond(1000)}}}}, nil)
	info := h.enqueue(&queue.Job{Upstream: "api", Path: "/x", Headers: map[string]string{"Cookie": "sid=1"}, NotBefore: time.Now().Add(300 * time.Millisecond)})
	if n := h.rdb.Del(context.Background(), queue.SecretsKey("shaper", &info.Job)).Val(); n != 1 {
		t.Fatalf("deleted %d side keys, want the job's one", n)
	}
	got := h.waitFor([]string{info.ID}, queue.StateSucceeded, queue.StateDead)[info.ID]
	if got.State != queue.StateDead || got.Attempts != 1 || !strings.Contains(got.LastError, "sensitive headers are gone") {
		t.Fatalf("got %s after %d attempts (%q), want dead for its lost headers", got.State, got.Attempts, got.LastError)
	}
	if n := h.fake.Report().Total; n != 0 {
		t.Fatalf("upstream saw %d requests, want none", n)
	}
}

// TestUnusableSecretsKillTheJob: a side key that Redis answers for but that
// cannot be used (not JSON, the wrong type) is no passing outage: the job
// dies with a last error that says why, instead of being handed back for
// ever.
func TestUnusableSecretsKillTheJob(t *testing.T) {
	for _, tc := range []struct {
		name      string
		spoil     func(ctx context.Context, rdb *redis.Client, key string) error
		wantError string
	}{
		{"undecodable", func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.Set(ctx, key, "not json", time.Hour).Err()
		}, "invalid character"},
		{"wrong type", func(ctx context.Context, rdb *redis.Client, key string) error {
			if err := rdb.Del(ctx, key).Err(); err != nil {
				return err
			}
			return rdb.HSet(ctx, key, "Cookie", "sid=1").Err()
		}, "WRONGTYPE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, fakeupstream.Config{}, shaper.Upstream{}, 3)
			info := h.enqueue(&queue.Job{Upstream: "api", Path: "/x", Headers: map[string]string{"Cookie": "sid=1"}})
			if err := tc.spoil(context.Background(), h.rdb, queue.SecretsKey("shaper", &info.Job)); err != nil {
				t.Fatal(err)
			}
			h.start(Config{Upstreams: []shaper.Upstream{{Name: "api", Limits: []leaky.Limit{leaky.PerSecond(1000)}}}}, nil)
			got := h.waitFor([]string{info.ID}, queue.StateSucceeded, queue.StateDead)[info.ID]
			if got.State != queue.StateDead || !strings.Contains(got.LastError, "sensitive headers") || !strings.Contains(got.LastError, tc.wantError) {
				t.Fatalf("got %s (%q), want dead with an error about its sensitive headers mentioning %q", got.State, got.LastError, tc.wantError)
			}
			if n := h.fake.Report().Total; n != 0 {
				t.Fatalf("upstream saw %d requests, want none", n)
			}
		})
	}
}

func TestUnreachable(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	gone := redis.NewClient(&redis.Options{Addr: closed, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer gone.Close()
	rdb.Set(ctx, "unreachable:str", "x", time.Minute)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"connection refused", gone.Get(ctx, "k").Err(), true},
		{"context cancelled", rdb.Get(cancelled, "k").Err(), true},
		{"client closed", redis.ErrClosed, true},
		{"loading", fmt.Errorf("read: %w", redisReply("LOADING Redis is loading the dataset in memory")), true},
		{"unknown command", rdb.Do(ctx, "NOSUCHCOMMAND").Err(), false},
		{"wrong type", rdb.HGet(ctx, "unreachable:str", "f").Err(), false},
		{"not json", json.Unmarshal([]byte("x"), new(map[string]string)), false},
	} {
		if tc.err == nil {
			t.Fatalf("%s: no error to classify", tc.name)
		}
		if got := unreachable(tc.err); got != tc.want {
			t.Errorf("%s (%v): got unreachable %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// redisReply is an error reply as go-redis reports one.
type redisReply string

func (e redisReply) Error() string { return string(e) }
func (redisReply) RedisError()     {}

// TestHandedBackJobsKeepTheirSecrets: a job handed back to wait (pushback,
// a retry after Retry-After) keeps its sensitive headers for that wait
// plus the backstop, however long the wait: nothing else renews them until
// a worker takes it again. (A paused upstream's jobs are never taken, so
// they keep the TTL they were enqueued with.)
func TestHandedBackJobsKeepTheirSecrets(t *testing.T) {
	backstop := queue.SecretsTTL(&queue.Job{}, time.Now())
	for _, tc := range []struct {
		name   string
		status int
		retry  string
		state  queue.State
		wait   time.Duration
	}{
		{name: "pushback", status: http.StatusTooManyRequests, retry: "3600", state: queue.StateScheduled, wait: time.Hour},
		{name: "retry", status: http.StatusServiceUnavailable, retry: "7200", state: queue.StateRetrying, wait: 2 * time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, fakeupstream.Config{}, shaper.Upstream{}, 3)
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Retry-After", tc.retry)
				w.WriteHeader(tc.status)
			}))
			defer up.Close()
			h.start(Config{Upstreams: []shaper.Upstream{{Name: "api", BaseURL: up.URL, Limits: []leaky.Limit{leaky.PerSecond(1000)}}}}, nil)
			info := h.enqueue(&queue.Job{Upstream: "api", Path: "/x", Headers: map[string]string{"Authorization": "Bearer x"}})
			key := queue.SecretsKey("shaper", &info.Job)
			deadline := time.Now().Add(30 * time.Second)
			for {
				got, err := h.q.Get(context.Background(), info.ID, "")
				if err != nil {
					t.Fatal(err)
				}
				if got.State == tc.state {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("job is %s (%q), want %s", got.State, got.LastError, tc.state)
				}
				time.Sleep(20 * time.Millisecond)
			}
			// The renewal follows the hand-back; give it a moment.
			want := tc.wait + backstop - 2*time.Minute
			var ttl time.Duration
			for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
				if ttl = h.rdb.PTTL(context.Background(), key).Val(); ttl >= want {
					return
				}
			}
			t.Fatalf("side key TTL after a hand-back for %v: got %v, want at least %v (the wait plus the backstop)", tc.wait, ttl, want)
		})
	}
}

// TestStoreResponseHeaders: an upstream's store_response_headers replace
// the default list; Set-Cookie is never kept, not even by "*".
func TestStoreResponseHeaders(t *testing.T) {
	answer := &queue.Response{Status: 200, Body: []byte("ok"), Headers: map[string][]string{
		"Content-Type": {"text/plain"}, "Set-Cookie": {"a=b"}, "X-Request-Id": {"r1"}, "Server": {"nginx"},
		"X-Debug-Node": {"7"}, "Idempotent-Replayed": {"true"},
	}}
	for _, tc := range []struct {
		name     string
		patterns []string
		want     []string
	}{
		{"default", nil, []string{"Content-Type", "X-Request-Id"}},
		{"own list", []string{"idempotent-replayed", "X-Debug-*"}, []string{"Idempotent-Replayed", "X-Debug-Node"}},
		{"set-cookie asked for", []string{"Set-Cookie", "Server"}, []string{"Server"}},
		{"everything", []string{"*"}, []string{"Content-Type", "Idempotent-Replayed", "Server", "X-Debug-Node", "X-Request-Id"}},
	} {
		u := &upstream{cfg: shaper.Upstream{StoreResponse: shaper.StoreHeaders, StoreResponseHeaders: tc.patterns}, base: &url.URL{Scheme: "https", Host: "api.example"}}
		var got []string
		for name := range u.stored(answer).Headers {
			got = append(got, name)
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: kept %v, want %v", tc.name, got, tc.want)
		}
	}

	// Through a dispatcher, and a bad pattern is refused at New.
	h := newHarness(t, fakeupstream.Config{}, shaper.Upstream{}, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for name, v := range answer.Headers {
			w.Header()[name] = v
		}
		fmt.Fprint(w, "ok")
	}))
	defer up.Close()
	if _, err := New(h.rdb, Config{Upstreams: []shaper.Upstream{{Name: "api", BaseURL: up.URL, Limits: []leaky.Limit{leaky.PerSecond(10)},
		StoreResponseHeaders: []string{"X Id"}}}}); err == nil || !strings.Contains(err.Error(), "store_response_headers") {
		t.Errorf("New with a bad store_response_headers pattern: got %v, want an error naming it", err)
	}
	h.start(Config{Upstreams: []shaper.Upstream{{Name: "api", BaseURL: up.URL, Limits: []leaky.Limit{leaky.PerSecond(1000)},
		StoreResponseHeaders: []string{"Server", "Set-Cookie"}}}}, nil)
	info := h.enqueue(&queue.Job{Upstream: "api", Path: "/x"})
	got := h.waitFor([]string{info.ID}, queue.StateSucceeded, queue.StateDead)[info.ID]
	if got.Response == nil || len(got.Response.Headers) != 1 || got.Response.Headers["Server"] == nil {
		t.Fatalf("stored response %+v, want only the Server header", got.Response)
	}
}
