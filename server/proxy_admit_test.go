package server

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/tokenbucket"
)

// scriptWatch counts the script calls a client sends that name a key
// with admission's bucket (":tb:{"), and those of them that also name
// the upstream's keys of waiting calls (":cq"): the booking.
type scriptWatch struct {
	mu              sync.Mutex
	admits, booking int
}

func (h *scriptWatch) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptWatch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *scriptWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			var admits, books bool
			for _, a := range cmd.Args() {
				if k, ok := a.(string); ok {
					admits = admits || strings.Contains(k, ":tb:{")
					books = books || strings.HasSuffix(k, ":cq")
				}
			}
			h.mu.Lock()
			if admits {
				h.admits++
				if books {
					h.booking++
				}
			}
			h.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (h *scriptWatch) counts() (admits, booking int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.admits, h.booking
}

// TestProxyPaysAdmissionInItsBooking: on a single Redis, a call pays its
// key's admission in the script call that books its slot, admitted or
// refused; the refusal is admission's 429, counted as admission's
// decisions are.
func TestProxyPaysAdmissionInItsBooking(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	rdb.FlushAll(context.Background())
	rdb.ScriptFlush(context.Background())
	watch := &scriptWatch{}
	rdb.AddHook(watch)
	f := newProxyFixtureOn(t, rdb, &recorder{}, nil, func(c *Config) {
		c.Admission = tokenbucket.Limit{Capacity: 2, Refill: 1, Per: time.Hour}
	})
	for i, want := range []int{200, 200, 429} {
		resp, body := f.call("GET", "/proxy/api/v1/x", "")
		if resp.StatusCode != want {
			t.Fatalf("call %d: got %d %s, want %d", i, resp.StatusCode, body, want)
		}
		if want == 429 && (!strings.Contains(body, "admission") || resp.Header.Get("RateLimit-Policy") == "") {
			t.Fatalf("call %d: got %s, want admission's 429 with its RateLimit headers", i, body)
		}
	}
	// The first script call loads the script: EVALSHA, then EVAL.
	if admits, booking := watch.counts(); admits != 4 || booking != 4 {
		t.Errorf("3 calls: %d script calls paid admission, %d of them booking too; want 3 (and the first's EVAL), all booking", admits, booking)
	}
	if n := counter(t, f.reg, "shaper_admission_decisions_total", "allowed"); n != 2 {
		t.Errorf("allowed decisions: got %v, want 2", n)
	}
	if n := counter(t, f.reg, "shaper_admission_decisions_total", "denied"); n != 1 {
		t.Errorf("denied decisions: got %v, want 1", n)
	}
	if n := len(f.up.requests()); n != 2 {
		t.Errorf("upstream got %d requests, want 2", n)
	}
}

// TestProxyAdmissionOnCluster: on a Redis Cluster, whose admission
// buckets lie in slots of their own, a call pays admission on its own
// first, and is admitted and refused as on one server.
func TestProxyAdmissionOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-master Redis Cluster takes seconds to start: runs in make test")
	}
	cl := redistest.NewCluster(t)
	f := newProxyFixtureOn(t, cl.Client(t), &recorder{}, nil, func(c *Config) {
		c.Admission = tokenbucket.Limit{Capacity: 1, Refill: 1, Per: time.Hour}
	})
	if f.s.callAdmission.Load() != nil {
		t.Fatal("on a Cluster, calls pay admission in their booking: want it paid on its own")
	}
	if resp, body := f.call("GET", "/proxy/api/v1/x", ""); resp.StatusCode != 200 || resp.Header.Get("RateLimit") != "" {
		t.Fatalf("first call: got %d %s (RateLimit %q), want 200 without admission's headers", resp.StatusCode, body, resp.Header.Get("RateLimit"))
	}
	resp, body := f.call("GET", "/proxy/api/v1/x", "")
	if resp.StatusCode != 429 || !strings.Contains(body, "admission") || resp.Header.Get("RateLimit-Policy") == "" {
		t.Fatalf("second call: got %d %s, want admission's 429 with its RateLimit headers", resp.StatusCode, body)
	}
	if n := len(f.up.requests()); n != 1 {
		t.Errorf("upstream got %d requests, want 1", n)
	}
}

// TestProxyAdmissionPolicyWithoutRedis: with Redis stopped, the script
// call that would pay admission and book fails, and admission decides
// under its failure policy as when it was asked on its own: failing
// closed, the call is admission's 429; failing open or locally (the
// local bucket has room), the call is admitted and, nothing booked,
// answered 503. Nothing is sent.
func TestProxyAdmissionPolicyWithoutRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("a Redis of its own stopped: runs in make test")
	}
	for _, tc := range []struct {
		policy shaper.OnRedisError
		want   int
		label  string
	}{
		{shaper.FailClosed, 429, "fail_closed"},
		{shaper.FailOpen, 503, "fail_open"},
		{shaper.FailLocal, 503, "local"},
	} {
		t.Run(tc.label, func(t *testing.T) {
			own := redistest.New(t)
			f := newProxyFixtureOn(t, serveClient(t, own), &recorder{}, nil, func(c *Config) { c.OnRedisError = tc.policy })
			if resp, body := f.call("GET", "/proxy/api/v1/x", ""); resp.StatusCode != 200 {
				t.Fatalf("with Redis: got %d %s, want 200", resp.StatusCode, body)
			}
			if err := own.Stop(); err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				resp, body := f.call("GET", "/proxy/api/v1/x", "")
				if resp.StatusCode != tc.want {
					t.Fatalf("call %d without Redis: got %d %s, want %d", i, resp.StatusCode, body, tc.want)
				}
				if tc.want == 429 && !strings.Contains(body, "admission") {
					t.Fatalf("call %d without Redis: got %s, want admission's refusal", i, body)
				}
			}
			if n := counter(t, f.reg, "shaper_admission_decisions_total", tc.label); n != 3 {
				t.Errorf("%s decisions: got %v, want 3", tc.label, n)
			}
			if n := len(f.up.requests()); n != 1 {
				t.Errorf("upstream got %d requests, want only the one made with Redis", n)
			}
		})
	}
}
