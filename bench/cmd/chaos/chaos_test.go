package main

import (
	"context"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestSmallRun runs the whole command at a small scale: 300 jobs, one
// worker killed, Redis crashed and restarted on its AOF. The run ends at
// its deadline, well before asynq would give the killed worker's jobs back
// (55s at least), so it also checks that those jobs are accounted for:
// still active in Redis, neither missing nor dead.
func TestSmallRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and five shaper processes")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not in PATH")
	}
	var out, log strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := run(ctx, []string{"-jobs", "300", "-rate", "100", "-kill-every", "1s", "-max-kills", "1",
		"-redis-crash-at", "1500ms", "-deadline", "12s"}, &out, io.MultiWriter(&log, testWriter{t}))
	if err != nil {
		t.Fatal(err)
	}
	if res.Accepted != 300 {
		t.Errorf("accepted %d jobs, want 300 (not accepted: %v)", res.Accepted, res.NotAccepted)
	}
	if got := res.Delivered + res.Lost; got != res.Accepted {
		t.Errorf("delivered %d + lost %d = %d, want the %d accepted", res.Delivered, res.Lost, got, res.Accepted)
	}
	if res.Kills != 1 || res.RedisCrashAt == 0 || res.RedisBackAt == 0 {
		t.Errorf("kills %d, Redis crashed at %v and back at %v; want 1 kill and one crash", res.Kills, res.RedisCrashAt, res.RedisBackAt)
	}
	if res.WorstWindow > res.Rate {
		t.Errorf("the upstream saw %d requests in one 1s window, over its limit of %d", res.WorstWindow, res.Rate)
	}
	// Every job not delivered must be one asynq has not given back yet:
	// the killed worker held at most its 10 workers' jobs.
	if res.Lost > 10 {
		t.Errorf("%d jobs undelivered, more than the killed worker could hold (10)", res.Lost)
	}
	if res.LostLookedUp != res.Lost {
		t.Errorf("looked up %d of %d undelivered jobs", res.LostLookedUp, res.Lost)
	}
	for state, n := range res.LostStates {
		if state != "active" {
			t.Errorf("%d undelivered jobs are %q in Redis, want active (held by the killed worker)", n, state)
		}
	}
	for _, want := range []string{"| **lost** (accepted, never delivered) |", "| worst 1s window at the upstream", "kill -9 redis-server"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, out.String())
		}
	}
}

// testWriter sends the run's progress lines to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func TestOverLimit(t *testing.T) {
	ms := func(xs ...int) []time.Duration {
		out := make([]time.Duration, len(xs))
		for i, x := range xs {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	tests := []struct {
		name  string
		times []time.Duration
		limit int
		want  []overWindow
	}{
		{"none", nil, 2, nil},
		{"at the limit", ms(0, 500, 1000, 1500), 2, nil},
		// 0 and 1000 are a whole window apart, so never in one window.
		{"exactly a window apart", ms(0, 999, 1000, 1999), 2, nil},
		{"one over", ms(0, 10, 20), 2, []overWindow{{End: 20 * time.Millisecond, Count: 3, Arrivals: 1}}},
		{"one stretch, worst kept", ms(0, 10, 20, 30, 900), 2,
			[]overWindow{{End: 900 * time.Millisecond, Count: 5, Arrivals: 3}}},
		{"two stretches", ms(0, 10, 20, 5000, 5010, 5020, 5030), 2, []overWindow{
			{End: 20 * time.Millisecond, Count: 3, Arrivals: 1},
			{End: 5030 * time.Millisecond, Count: 4, Arrivals: 2},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := overLimit(tt.times, time.Second, tt.limit)
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("stretch %d: got %+v, want %+v", i, got[i], tt.want[i])
				}
			}
		})
	}
}
