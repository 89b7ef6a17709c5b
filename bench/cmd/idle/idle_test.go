package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper/bench/internal/fleet"
	"github.com/shaperhq/shaper/bench/internal/redisproc"
)

// TestMain lets the test binary serve as the asynq child, as the command's
// own binary does.
func TestMain(m *testing.M) {
	if os.Getenv(fleet.EnvRole) == roleAsynq {
		if err := runAsynqChild(); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestOwnCallsLeftOut measures a Redis nobody talks to: once the
// benchmark's own INFO calls are left out, it must have served nothing.
func TestOwnCallsLeftOut(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not in PATH")
	}
	srv, err := redisproc.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	// Two rounds: the first pair also follows redisproc's readiness INFO calls.
	for round := range 2 {
		before, err := take(srv, nil)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		after, err := take(srv, nil)
		if err != nil {
			t.Fatal(err)
		}
		var r result
		r.fill(before, after)
		if r.CommandsPerSec != 0 || len(r.Top) != 0 {
			t.Errorf("round %d: idle Redis with no clients: got %.1f commands/s (%v), want 0", round, r.CommandsPerSec, r.Top)
		}
	}
}

// TestSmallGrid runs the command on two upstreams and one replica of
// shaper and of asynq at 10 ms: everything must be ready, asynq's polling
// must show up as commands, shaper's idle replica must send next to
// nothing (it sleeps until woken), and both must stop on SIGTERM.
func TestSmallGrid(t *testing.T) {
	if testing.Short() {
		t.Skip("builds shaper and starts redis-server and worker processes")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not in PATH")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out strings.Builder
	results, err := run(ctx, []string{"-upstreams", "2", "-replicas", "1", "-contenders", "shaper,asynq-10ms",
		"-settle", "500ms", "-window", "2s", "-shaper-window", "3s", "-cell-timeout", "20s"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	if len(results) != 2 {
		t.Fatalf("got %d measurements, want 2", len(results))
	}
	for _, r := range results {
		// shaper: 1 replica subscribed + 2 upstreams asleep; asynq: 2 servers.
		want := int64(2)
		if r.Contender == shaperWork {
			want = 3
		}
		if r.Servers != want || r.Expected != want {
			t.Errorf("%s: %d of %d ready, want %d of %d", r.Contender, r.Servers, r.Expected, want, want)
		}
		if r.Killed != 0 || r.StopMax <= 0 || r.StopMax >= stopGrace {
			t.Errorf("%s: stop took %v with %d killed, want a clean stop within %v", r.Contender, r.StopMax, r.Killed, stopGrace)
		}
		switch r.Contender {
		case asynq10ms:
			// Two queues polled every 10 ms is hundreds a second.
			if r.CommandsPerSec < 100 {
				t.Errorf("%s: got %.1f commands/s, want the polling to show (≥ 100)", r.Contender, r.CommandsPerSec)
			}
		case shaperWork:
			// Idle, a replica only pings its two subscriptions now and
			// then; polling, even at asynq's 1 s default, would be more.
			if r.CommandsPerSec > 5 {
				t.Errorf("%s: got %.1f commands/s (%v), want an idle replica to send almost nothing (≤ 5)", r.Contender, r.CommandsPerSec, r.Top)
			}
		}
	}
	if !strings.Contains(out.String(), "| 2 | 1 |") {
		t.Errorf("table lacks the 2 × 1 row:\n%s", out.String())
	}
}
