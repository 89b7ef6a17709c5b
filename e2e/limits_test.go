package e2e

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper/fakeupstream"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/internal/testsupport/stall"
	"github.com/shaperhq/shaper/queue"
)

// TestLimitsSetLive: two `shaper work` replicas drain a backlog at 40 per
// second; `shaper limits set` lowers the limit to 10 per second, and later
// `shaper limits reset` puts the 40 back, with no restart. The upstream's
// arrivals are counted in every window of a second: none holds more than
// 40 while slots booked under it drain, none more than 10 from one per (a
// second) after the set (nothing is booked under 40 once the set is
// written, and slots are booked at most the horizon ahead), and the drain
// runs at the new rate one per after that; after the reset, windows that
// still hold slots booked under 10 per second hold no more than 10, and
// the drain comes back to 40.
func TestLimitsSetLive(t *testing.T) {
	if testing.Short() {
		t.Skip("shaper work processes and the shaper limits command: multi-process, runs in make test")
	}
	t.Parallel()
	const high, low = 40, 10
	// The upstream itself refuses nothing: the windows are counted here.
	e := newEnv(t, fakeupstream.Config{Algorithm: fakeupstream.SlidingLog, Rate: 10000, Per: time.Second}, redistest.Options{})
	e.writeConfig(`
redis: {url: "{{REDIS}}"}
upstreams:
  api:
    base_url: "{{UPSTREAM}}"
    limits: [{rate: 40, per: 1s}]
`)
	e.enqueue(600, func(i int) *queue.Job {
		return &queue.Job{Upstream: "api", Method: "POST", Path: "/v1/things/" + strconv.Itoa(i)}
	})
	e.startWorker()
	e.startWorker()
	waitUntil(t, 30*time.Second, "the first request", func() bool { return e.fake.Report().Total > 0 })
	host := stall.Start()
	since := func() time.Duration { return time.Since(e.fake.Started()) }
	limits := func(args ...string) (before, after time.Duration) {
		t.Helper()
		before = since()
		out, err := exec.Command(shaperBin, append(append([]string{"limits"}, args...), "--config", e.cfg)...).CombinedOutput()
		after = since()
		if err != nil {
			t.Fatalf("shaper limits %v: %v\n%s", args, err, out)
		}
		t.Logf("shaper limits %s: %s(%v)", strings.Join(args, " "), out, (after - before).Round(time.Millisecond))
		return before, after
	}
	time.Sleep(3 * time.Second)
	setFrom, setAt := limits("set", "api", "--limit", "10/1s")
	// The status shows the operator's limit.
	out, err := exec.Command(shaperBin, "status", "--json", "--config", e.cfg).Output()
	if err != nil {
		t.Fatalf("shaper status: %v", err)
	}
	if compact := strings.Join(strings.Fields(string(out)), ""); !strings.Contains(compact, `"source":"operator"`) {
		t.Errorf("shaper status --json after the set: want a limit with source operator, got %s", out)
	}
	time.Sleep(6 * time.Second)
	resetFrom, resetAt := limits("reset", "api")
	time.Sleep(6 * time.Second)
	_, _, stalls := hostRan(since(), host)
	events := host.Events()
	e.stopAll()
	arr := arrivals(e.fake)
	t.Logf("%d requests; %s", len(arr), stalls)

	// One per after the change: slots are booked at most the horizon
	// (250ms) ahead, and none under the old limits once the change is
	// written, whether a replica has heard of it or not.
	const settle = time.Second
	at := func(d time.Duration) time.Time { return e.fake.Started().Add(d) }
	check := func(what string, from, to time.Duration, bound int) {
		t.Helper()
		for i, s := range arr {
			if s < from || s >= to {
				continue
			}
			n := 0
			for _, u := range arr[i:] {
				if u >= s+time.Second {
					break
				}
				n++
			}
			if n <= bound {
				continue
			}
			if evs := stall.Overlapping(events, tripSlack, at(s-tripSlack), at(s+time.Second)); len(evs) > 0 {
				t.Logf("excused: %d requests in the second from %v, during a host stall of %v", n, s.Round(time.Millisecond), evs[0].Dur.Round(time.Millisecond))
				continue
			}
			t.Errorf("%s: %d requests in the second from %v, want at most %d", what, n, s.Round(time.Millisecond), bound)
			return
		}
	}
	count := func(from, to time.Duration) float64 {
		n := 0
		for _, s := range arr {
			if s >= from && s < to {
				n++
			}
		}
		return float64(n) / (to - from).Seconds()
	}
	check("at 40/s and while its slots drain", 0, setAt+settle, high)
	check("from the set on", setAt+settle, resetFrom, low)
	// The reset raises the limit: windows holding slots booked at 10/s
	// still hold no more than 10.
	check("while the 10/s slots drain", setAt+settle, resetFrom+250*time.Millisecond, low)
	check("after the reset", resetFrom, since(), high)

	before := count(arr[0]+time.Second, setFrom)
	lowRate := count(setAt+settle+time.Second, resetFrom)
	highRate := count(resetAt+settle+2*time.Second, resetAt+settle+4*time.Second)
	t.Logf("drain: %.1f/s before the set, %.1f/s from %v after it, %.1f/s after the reset", before, lowRate, settle+time.Second, highRate)
	if before < 0.9*high {
		t.Errorf("before the set: drained at %.1f/s, want about %d", before, high)
	}
	if lowRate < 0.85*low || lowRate > low {
		t.Errorf("after the set: drained at %.1f/s, want about %d", lowRate, low)
	}
	if highRate < 0.85*high {
		t.Errorf("after the reset: drained at %.1f/s, want about %d", highRate, high)
	}
}
