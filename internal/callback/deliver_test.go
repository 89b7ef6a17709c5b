package callback_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/callback"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/metrics"
	"github.com/shaperhq/shaper/queue"
)

var srv *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &srv) }

var secret = []byte("0123456789abcdef0123456789abcdef")

// delivery is one request a receiver got.
type delivery struct {
	header http.Header
	body   []byte
}

// receiver records what it gets and answers with status(n) for its n-th
// request (from 1).
type receiver struct {
	mu     sync.Mutex
	got    []delivery
	status func(n int) (int, string) // code, Location
	hs     *httptest.Server
}

func newReceiver(t *testing.T, status func(n int) (int, string)) *receiver {
	t.Helper()
	r := &receiver{status: status}
	r.hs = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.got = append(r.got, delivery{header: req.Header.Clone(), body: b})
		k := len(r.got)
		r.mu.Unlock()
		code, loc := r.status(k)
		if loc != "" {
			w.Header().Set("Location", loc)
		}
		w.WriteHeader(code)
		// A large answer, of which at most MaxResponseBytes is read.
		w.Write([]byte(strings.Repeat("x", 200<<10)))
	}))
	t.Cleanup(r.hs.Close)
	return r
}

func (r *receiver) host() string { u, _ := url.Parse(r.hs.URL); return u.Host }

func (r *receiver) deliveries() []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivery(nil), r.got...)
}

type env struct {
	t      *testing.T
	rdb    redis.UniversalClient
	q      *queue.Queue
	up     string
	prefix string
	reg    *prometheus.Registry
	m      *metrics.Metrics
	poll   time.Duration // the deliverer's PollInterval
}

var envSeq atomic.Int64

func newEnv(t *testing.T) *env {
	t.Helper()
	rdb := srv.Client(t)
	n := envSeq.Add(1)
	up, prefix := fmt.Sprintf("cb%d", n), fmt.Sprintf("cbtest%d", n)
	q, err := queue.New(rdb, queue.Config{Upstreams: []shaper.Upstream{{Name: up, BaseURL: "https://x.example",
		Limits: []leaky.Limit{leaky.PerSecond(100)}, ResultRetention: time.Hour, DeadRetention: time.Hour}},
		Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	reg := prometheus.NewRegistry()
	return &env{t: t, rdb: rdb, q: q, up: up, prefix: prefix, reg: reg, m: metrics.New(reg), poll: 5 * time.Millisecond}
}

// cancelled enqueues a job with callback url and cancels it: the quickest
// way to a final state without a dispatcher.
func (e *env) cancelled(callbackURL string) string {
	e.t.Helper()
	ctx := context.Background()
	info, _, err := e.q.Enqueue(ctx, &queue.Job{Tenant: "t", Upstream: e.up, Method: "POST", Path: "/x",
		NotBefore: time.Now().Add(time.Hour), CallbackURL: callbackURL, CallbackKey: "k"})
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.q.Cancel(ctx, info.ID, "t"); err != nil {
		e.t.Fatal(err)
	}
	return info.ID
}

// run starts a deliverer allowing allowed, and returns what stops it and
// waits for it (also called at cleanup).
func (e *env) run(allowed []string, maxAttempts int, resolver *net.Resolver) (stop func()) {
	e.t.Helper()
	d, err := callback.New(e.rdb, callback.Config{
		Queue: e.q, Upstreams: []string{e.up}, Prefix: e.prefix, AllowedHosts: allowed,
		Secret: func(key string) []byte {
			if key == "k" {
				return secret
			}
			return nil
		},
		Limits:      []leaky.Limit{leaky.PerSecond(1000)},
		MaxAttempts: maxAttempts, MinBackoff: time.Millisecond, MaxBackoff: 4 * time.Millisecond,
		View:         func(i *queue.Info) ([]byte, error) { return json.Marshal(i) },
		Timeout:      2 * time.Second,
		PollInterval: e.poll,
		Resolver:     resolver,
		Metrics:      e.m,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	stop = func() { cancel(); <-done }
	e.t.Cleanup(stop)
	return stop
}

// dueLooks counts the scripts Redis has run so far, every client's.
func (e *env) dueLooks() int64 {
	e.t.Helper()
	info, err := e.rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		e.t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "cmdstat_evalsha:") || strings.HasPrefix(line, "cmdstat_eval:") {
			f := strings.TrimPrefix(strings.SplitN(line, ":", 2)[1], "calls=")
			c, _ := strconv.ParseInt(strings.SplitN(f, ",", 2)[0], 10, 64)
			n += c
		}
	}
	return n
}

// settled waits until job id's callback is delivered or failed.
func (e *env) settled(id string) *queue.Callback {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := e.q.Get(context.Background(), id, "")
		if err != nil {
			e.t.Fatal(err)
		}
		if c := info.Callback; c != nil && c.State != "pending" {
			return c
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("job %s: callback %+v after 10s, want delivered or failed", id, info.Callback)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestDeliversSignedFinalView(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, func(n int) (int, string) {
		if n < 3 {
			return http.StatusInternalServerError, ""
		}
		return http.StatusNoContent, ""
	})
	id := e.cancelled(rc.hs.URL + "/hook?x=1")
	stop := e.run([]string{rc.host()}, 5, nil)
	c := e.settled(id)
	// Stopped, it has counted every attempt it recorded.
	stop()
	if c.State != "delivered" || c.Attempts != 3 {
		t.Fatalf("callback: got %+v, want delivered after 3 attempts", c)
	}
	got := rc.deliveries()
	if len(got) != 3 {
		t.Fatalf("receiver got %d requests, want 3", len(got))
	}
	wantID := callback.WebhookID(id, 1)
	for i, d := range got {
		h := d.header
		if h.Get("webhook-id") != wantID {
			t.Errorf("attempt %d: webhook-id %q, want %q (the same on every attempt)", i+1, h.Get("webhook-id"), wantID)
		}
		ts, err := strconv.ParseInt(h.Get("webhook-timestamp"), 10, 64)
		if err != nil || time.Since(time.Unix(ts, 0)).Abs() > time.Minute {
			t.Errorf("attempt %d: webhook-timestamp %q, want now in Unix seconds", i+1, h.Get("webhook-timestamp"))
		}
		if want := callback.Sign(secret, wantID, ts, d.body); h.Get("webhook-signature") != want {
			t.Errorf("attempt %d: webhook-signature %q, want %q", i+1, h.Get("webhook-signature"), want)
		}
		if h.Get("Content-Type") != "application/json" {
			t.Errorf("attempt %d: content-type %q", i+1, h.Get("Content-Type"))
		}
		var view queue.Info
		if err := json.Unmarshal(d.body, &view); err != nil {
			t.Fatalf("attempt %d: body %q: %v", i+1, d.body, err)
		}
		if view.ID != id || view.State != queue.StateCancelled || view.Callback != nil {
			t.Errorf("attempt %d: body's job %s %s callback %+v, want %s cancelled without callback bookkeeping", i+1, view.ID, view.State, view.Callback, id)
		}
		if i > 0 && string(d.body) != string(got[0].body) {
			t.Errorf("attempt %d: body differs from the first attempt's", i+1)
		}
	}
	if n := testutil.ToFloat64(e.m.CallbackDeliveries.WithLabelValues("delivered")); n != 1 {
		t.Errorf("delivered count: got %v, want 1", n)
	}
	if n := testutil.ToFloat64(e.m.CallbackDeliveries.WithLabelValues("retry")); n != 2 {
		t.Errorf("retry count: got %v, want 2", n)
	}
	if problems, err := testutil.GatherAndLint(e.reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// Retries run out: the job shows why, and a retry through the queue
// delivers it again, from attempt 1, under the same webhook-id.
func TestFailedCallbackShowsAndRetries(t *testing.T) {
	e := newEnv(t)
	var ok atomic.Bool
	rc := newReceiver(t, func(int) (int, string) {
		if ok.Load() {
			return http.StatusOK, ""
		}
		return http.StatusBadGateway, ""
	})
	id := e.cancelled(rc.hs.URL + "/hook")
	e.run([]string{rc.host()}, 2, nil)
	c := e.settled(id)
	if c.State != "failed" || c.Attempts != 2 || c.LastError != "answered 502" {
		t.Fatalf("callback: got %+v, want failed after 2 attempts, last error answered 502", c)
	}
	ok.Store(true)
	info, err := e.q.RetryCallback(context.Background(), id, "t")
	if err != nil || info.Callback == nil || info.Callback.State != "pending" {
		t.Fatalf("retry: got %+v, %v", info, err)
	}
	if c := e.settled(id); c.State != "delivered" || c.Attempts != 1 {
		t.Fatalf("after retry: got %+v, want delivered on attempt 1", c)
	}
	got := rc.deliveries()
	if len(got) != 3 || got[2].header.Get("webhook-id") != got[0].header.Get("webhook-id") {
		t.Fatalf("got %d deliveries, webhook-ids %v; want 3 under one id", len(got), ids(got))
	}
	if _, err := e.q.RetryCallback(context.Background(), id, "t"); !errors.Is(err, queue.ErrNoCallbackToRetry) {
		t.Fatalf("retry of a delivered callback: got %v, want ErrNoCallbackToRetry", err)
	}
	if _, err := e.q.RetryCallback(context.Background(), id, "other"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("retry by another tenant: got %v, want ErrNotFound", err)
	}
}

func ids(ds []delivery) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.header.Get("webhook-id"))
	}
	return out
}

// No way in: a redirect is not followed (and is a failed attempt), a name
// that resolves to a loopback address is refused at dial time though the
// name is allowed, as is a name a resolver maps there, and a URL whose host
// left the allowlist since it was enqueued is not called.
func TestNoWayInThroughACallback(t *testing.T) {
	e := newEnv(t)
	var internalHits atomic.Int64
	inside := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { internalHits.Add(1) }))
	t.Cleanup(inside.Close)
	redirect := newReceiver(t, func(int) (int, string) { return http.StatusFound, inside.URL + "/metadata" })
	// Reached only by name: its address is not in the allowlist.
	target := newReceiver(t, func(int) (int, string) { return http.StatusOK, "" })
	_, port, _ := net.SplitHostPort(target.host())

	// A resolver whose DNS server maps every name to 127.0.0.1.
	dns := fakeDNS(t, net.IPv4(127, 0, 0, 1))
	resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "udp", dns)
	}}

	redirected := e.cancelled(redirect.hs.URL + "/hook")
	viaLocalhost := e.cancelled("http://localhost:" + port + "/hook")
	viaDNS := e.cancelled("http://hooks.rebind.test:" + port + "/hook")
	gone := e.cancelled("http://removed.example:" + port + "/hook")
	e.run([]string{redirect.host(), "localhost:" + port, "hooks.rebind.test:" + port}, 1, resolver)

	if c := e.settled(redirected); c.State != "failed" || !strings.Contains(c.LastError, "answered 302 (redirects are not followed)") {
		t.Errorf("redirect: got %+v", c)
	}
	for _, id := range []string{viaLocalhost, viaDNS} {
		if c := e.settled(id); c.State != "failed" || !strings.Contains(c.LastError, "internal address") {
			t.Errorf("%s: got %+v, want failed at dial time", id, c)
		}
	}
	if c := e.settled(gone); c.State != "failed" || !strings.Contains(c.LastError, "not in callbacks.allowed_hosts") {
		t.Errorf("host no longer allowed: got %+v", c)
	}
	if n := internalHits.Load(); n != 0 {
		t.Errorf("the internal address got %d requests, want 0", n)
	}
	if n := len(redirect.deliveries()); n != 1 {
		t.Errorf("the redirecting receiver got %d requests, want 1", n)
	}
	if n := len(target.deliveries()); n != 0 {
		t.Errorf("the receiver behind internal addresses got %d requests, want 0", n)
	}
}

// fakeDNS answers every A query with ip (and every other query with no
// answer) on a loopback UDP port, returned.
func fakeDNS(t *testing.T, ip net.IP) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, addr, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if n < 12 {
				continue
			}
			q := buf[:n]
			// The question ends after its name (labels to a 0) and 4 bytes.
			end := 12
			for end < n && q[end] != 0 {
				end += int(q[end]) + 1
			}
			end += 5
			if end > n {
				continue
			}
			qtype := int(q[end-4])<<8 | int(q[end-3])
			resp := append([]byte{}, q[:end]...)
			resp[2] = 0x81 // response, recursion desired
			resp[3] = 0x80 // recursion available, no error
			resp[6], resp[7] = 0, 0
			resp[8], resp[9], resp[10], resp[11] = 0, 0, 0, 0
			if qtype == 1 {
				resp[7] = 1
				resp = append(resp, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4)
				resp = append(resp, ip.To4()...)
			}
			pc.WriteTo(resp, addr)
		}
	}()
	return pc.LocalAddr().String()
}

// Without polling: a delivery that becomes due after the deliverer started
// is announced over pub/sub, and its retry is looked at when its backoff
// ends, though the deliverer would poll only hourly.
func TestWakesWithoutPolling(t *testing.T) {
	e := newEnv(t)
	e.poll = time.Hour
	rc := newReceiver(t, func(n int) (int, string) {
		if n == 1 {
			return http.StatusServiceUnavailable, ""
		}
		return http.StatusOK, ""
	})
	before := e.dueLooks()
	e.run([]string{rc.host()}, 5, nil)
	// Once the deliverer listens, and has made its first look (an empty
	// due set: the only script it calls while idle), the job becomes final.
	ctx := context.Background()
	channel := jobstore.For(e.prefix, e.up).CallbacksChannel()
	deadline := time.Now().Add(10 * time.Second)
	for e.rdb.PubSubNumSub(ctx, channel).Val()[channel] != 1 || e.dueLooks() == before {
		if time.Now().After(deadline) {
			t.Fatal("the deliverer did not subscribe and look within 10s")
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	id := e.cancelled(rc.hs.URL + "/hook")
	if c := e.settled(id); c.State != "delivered" || c.Attempts != 2 {
		t.Fatalf("callback: got %+v, want delivered on attempt 2", c)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("delivered after %v, want at once (the poll is hourly)", took)
	}
}
