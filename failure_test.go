package shaper_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
)

// broken is a limiter whose store is down: it fails every call with err.
type broken struct{ err error }

func (b broken) Allow(ctx context.Context, key string, n int64) (shaper.Result, error) {
	return shaper.Result{}, b.err
}

// always answers with a fixed result.
type always struct{ res shaper.Result }

func (a always) Allow(ctx context.Context, key string, n int64) (shaper.Result, error) {
	return a.res, nil
}

func TestFallible(t *testing.T) {
	down := broken{errors.New("dial tcp 127.0.0.1:6379: connection refused")}
	local := always{shaper.Result{Allowed: true, Limit: 7, Remaining: 6}}
	for _, tc := range []struct {
		name    string
		f       *shaper.Fallible
		allowed bool
		limit   int64
		err     string
		logged  bool
	}{
		{"fail open", &shaper.Fallible{Limiter: down}, true, 1, "", true},
		{"fail closed", &shaper.Fallible{Limiter: down, Policy: shaper.FailClosed}, false, 0, "", true},
		{"local", &shaper.Fallible{Limiter: down, Policy: shaper.FailLocal, Local: local}, true, 7, "", true},
		{"local without a local limiter", &shaper.Fallible{Limiter: down, Policy: shaper.FailLocal}, false, 0, "without a local limiter", true},
		{"invalid arguments pass through", &shaper.Fallible{Limiter: broken{fmt.Errorf("%w: cost 9 over capacity 5", shaper.ErrInvalid)}}, false, 0, "cost 9", false},
		{"healthy", &shaper.Fallible{Limiter: local}, true, 7, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			var observed []shaper.OnRedisError
			tc.f.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			tc.f.Observe = func(p shaper.OnRedisError, err error) { observed = append(observed, p) }
			res, err := tc.f.Allow(context.Background(), "k", 1)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, want an error containing %q", err, tc.err)
				}
			} else if err != nil {
				t.Fatalf("got error %v", err)
			}
			if err == nil && (res.Allowed != tc.allowed || res.Limit != tc.limit) {
				t.Fatalf("got %v, want allowed %v limit %d", res, tc.allowed, tc.limit)
			}
			if tc.f.Policy == shaper.FailClosed && res.RetryAfter != time.Second {
				t.Fatalf("fail closed: RetryAfter %v, want the 1s default", res.RetryAfter)
			}
			if got := strings.Contains(logs.String(), "level=ERROR"); got != tc.logged {
				t.Fatalf("logged at ERROR: %v, want %v (%s)", got, tc.logged, logs.String())
			}
			if tc.logged && (len(observed) != 1 || observed[0] != tc.f.Policy) {
				t.Fatalf("observed %v, want one decision under %v", observed, tc.f.Policy)
			}
		})
	}
}

// countingLimiter counts the calls it is asked.
type countingLimiter struct{ n *int }

func (c countingLimiter) Allow(ctx context.Context, key string, n int64) (shaper.Result, error) {
	*c.n++
	return shaper.Result{Allowed: true}, nil
}

// Decide applies the policy to a failure met elsewhere without asking the
// limiter (whose token the failed call may have spent already).
func TestFallibleDecide(t *testing.T) {
	asked := 0
	var observed []shaper.OnRedisError
	f := &shaper.Fallible{Limiter: countingLimiter{&asked}, Policy: shaper.FailClosed, Logger: slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)),
		Observe: func(p shaper.OnRedisError, err error) { observed = append(observed, p) }}
	res, err := f.Decide(context.Background(), "k", 1, errors.New("i/o timeout"))
	if err != nil || res.Allowed || res.RetryAfter != time.Second {
		t.Fatalf("fail closed: got %+v, %v; want denied with RetryAfter 1s", res, err)
	}
	if asked != 0 || len(observed) != 1 || observed[0] != shaper.FailClosed {
		t.Fatalf("limiter asked %d times, observed %v; want 0 and one decision under fail closed", asked, observed)
	}
	f.Policy = shaper.FailOpen
	if res, err := f.Decide(context.Background(), "k", 1, errors.New("i/o timeout")); err != nil || !res.Allowed {
		t.Fatalf("fail open: got %+v, %v; want allowed", res, err)
	}
	if _, err := f.Decide(context.Background(), "k", 1, nil); err != nil || asked != 0 || len(observed) != 2 {
		t.Fatalf("no failure: got %v, asked %d, observed %v; want nothing decided", err, asked, observed)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := f.Decide(ctx, "k", 1, context.Canceled); !errors.Is(err, context.Canceled) || len(observed) != 2 {
		t.Fatalf("caller gone: got %v, observed %v; want its error back, nothing decided", err, observed)
	}
}

func TestFallibleLogsAtMostOncePerInterval(t *testing.T) {
	var logs bytes.Buffer
	f := &shaper.Fallible{Limiter: broken{errors.New("down")}, Logger: slog.New(slog.NewTextHandler(&logs, nil)), LogEvery: time.Hour}
	for i := 0; i < 50; i++ {
		f.Allow(context.Background(), "k", 1)
	}
	if n := strings.Count(logs.String(), "level=ERROR"); n != 1 {
		t.Fatalf("logged %d times in an hour's interval, want 1", n)
	}
}

func TestParseOnRedisError(t *testing.T) {
	for in, want := range map[string]shaper.OnRedisError{"": shaper.FailOpen, "allow": shaper.FailOpen, "fail_open": shaper.FailOpen,
		"deny": shaper.FailClosed, "fail_closed": shaper.FailClosed, "local": shaper.FailLocal} {
		got, err := shaper.ParseOnRedisError(in)
		if err != nil || got != want {
			t.Errorf("ParseOnRedisError(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := shaper.ParseOnRedisError("maybe"); err == nil || !strings.Contains(err.Error(), "allow, deny or local") {
		t.Errorf("got %v, want an error listing the choices", err)
	}
	if shaper.FailClosed.String() != "deny" {
		t.Errorf("FailClosed.String() = %q", shaper.FailClosed.String())
	}
}

// A Redis-backed limiter behind an explicit policy: when Redis is down,
// admission fails open, logs at ERROR and lets you count it.
func ExampleFallible() {
	down := broken{errors.New("connection refused")}
	failOpens := 0
	f := &shaper.Fallible{
		Limiter: down,
		Policy:  shaper.FailOpen,
		Name:    "admission",
		Logger:  slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)),
		Observe: func(shaper.OnRedisError, error) { failOpens++ },
	}
	res, err := f.Allow(context.Background(), "api-key-1", 1)
	fmt.Println(res.Allowed, err, failOpens)
	// Output: true <nil> 1
}

func ExampleResult_String() {
	fmt.Println(shaper.Result{Allowed: false, Limit: 10, RetryAfter: 300 * time.Millisecond, ResetAfter: 2 * time.Second})
	// Output: denied (0/10 left, retry in 300ms, reset in 2s)
}
