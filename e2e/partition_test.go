package e2e

// Acceptance tests for issue 8 (dispatch at scale): partitions, fair share
// between tenants, slow upstreams that hold no worker, an idle fleet that
// costs Redis nothing per upstream, and fast pickup with many upstreams.
// They use only what PRODUCT.md promises: the config keys partition_limits,
// partition_overrides and fairness, a job's partition, API keys with
// tenants, and what the upstream and Redis observe from outside.
//
// Every job here is sent to /GROUP/N, GROUP being its partition, tenant or
// upstream, so the fake upstream's records can be split by it (see group).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper/fakeupstream"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/internal/testsupport/stall"
	"github.com/shaperhq/shaper/queue"
)

// group is the first segment of a request's path.
func group(path string) string {
	g, _, _ := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	return g
}

// arrivalsBy splits the upstream's arrivals by group.
func arrivalsBy(recs []fakeupstream.Record) map[string][]time.Duration {
	by := map[string][]time.Duration{}
	for _, r := range recs {
		g := group(r.Path)
		by[g] = append(by[g], r.At)
	}
	return by
}

// sentBy is, by group, when each job (each path) was first let through by
// the upstream: how many jobs got through, retries not counted twice.
func sentBy(recs []fakeupstream.Record) map[string][]time.Duration {
	seen := map[string]bool{}
	by := map[string][]time.Duration{}
	for _, r := range recs {
		if r.Admitted && !seen[r.Path] {
			seen[r.Path] = true
			g := group(r.Path)
			by[g] = append(by[g], r.At)
		}
	}
	return by
}

// between keeps the times in [from, to).
func between(times []time.Duration, from, to time.Duration) []time.Duration {
	var out []time.Duration
	for _, at := range times {
		if at >= from && at < to {
			out = append(out, at)
		}
	}
	return out
}

// fakeClock is t on the fake upstream's clock, the one Record.At is read
// on: the time since it started. Both are monotonic readings on this host.
func (e *env) fakeClock(t time.Time) time.Duration {
	return t.Sub(e.fake.Report().Since)
}

// upstreamsYAML configures n upstreams u0000… at the fake upstream, each
// with its own limit, for the tests of many upstreams.
func upstreamsYAML(n int) string {
	var b strings.Builder
	b.WriteString("upstreams:\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "  u%04d: {base_url: \"{{UPSTREAM}}\", limits: [{rate: 100, per: 1s}]}\n", i)
	}
	return b.String()
}

// enqueueBatch enqueues n jobs for tenant's key through POST /v1/jobs/batch,
// each to /GROUP/N, and fails the test unless every one is accepted with 202.
func enqueueBatch(t *testing.T, api, key, upstream, grp string, n int) {
	t.Helper()
	type jobReq struct {
		Upstream string `json:"upstream"`
		Method   string `json:"method"`
		Path     string `json:"path"`
	}
	var req struct {
		Jobs []jobReq `json:"jobs"`
	}
	for i := 0; i < n; i++ {
		req.Jobs = append(req.Jobs, jobReq{Upstream: upstream, Method: "POST", Path: "/" + grp + "/" + strconv.Itoa(i)})
	}
	body, _ := json.Marshal(req)
	hr, _ := http.NewRequest("POST", api+"/v1/jobs/batch", bytes.NewReader(body))
	hr.Header.Set("Authorization", "Bearer "+key)
	hr.Header.Set("Content-Type", "application/json")
	resp, err := checkedClient(t).Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("batch of %d for %s: %s\n%s", n, grp, resp.Status, out)
	}
	var got struct {
		Results []struct {
			Status int `json:"status"`
		} `json:"results"`
	}
	if err := json.Unmarshal(out, &got); err != nil || len(got.Results) != n {
		t.Fatalf("batch of %d for %s answered %s", n, grp, out)
	}
	for i, r := range got.Results {
		if r.Status != http.StatusAccepted {
			t.Fatalf("batch for %s: job %d got %d, want 202\n%s", grp, i, r.Status, out)
		}
	}
}

// TestNoHeadOfLineBlocking: 150 jobs of one partition limited to 2/s are
// queued ahead of 3 jobs each for 40 other partitions. The 120 must finish
// in the time their own limits allow (3 jobs at 2/s: about a second), not
// behind the 150 (75 s), and no partition may exceed its limit.
func TestNoHeadOfLineBlocking(t *testing.T) {
	if testing.Short() {
		t.Skip("shaper work against a saturated partition: multi-process, runs in make test")
	}
	t.Parallel()
	e := newEnv(t, fakeupstream.Config{Rate: 200, Per: time.Second}, redistest.Options{})
	e.writeConfig(`
redis: {url: "{{REDIS}}"}
work: {shutdown_timeout: 3s}
upstreams:
  mail:
    base_url: "{{UPSTREAM}}"
    limits: [{rate: 200, per: 1s}]
    partition_limits: [{rate: 2, per: 1s}]
`)
	const slow = "slow.example"
	e.enqueue(150, func(i int) *queue.Job {
		return &queue.Job{Upstream: "mail", Partition: slow, Method: "POST", Path: "/" + slow + "/" + strconv.Itoa(i)}
	})
	others := e.enqueue(120, func(i int) *queue.Job {
		p := fmt.Sprintf("d%02d.example", i/3)
		return &queue.Job{Upstream: "mail", Partition: p, Method: "POST", Path: "/" + p + "/" + strconv.Itoa(i)}
	})
	e.startWorker()
	waitUntil(t, 30*time.Second, "the first request", func() bool { return e.fake.Report().Total > 0 })
	first := arrivals(e.fake)[0]

	// The bound is generous: each partition's own 3 jobs take 1 s at 2/s
	// and all 41 first sends fit in a quarter second of the 200/s upstream.
	const bound = 8 * time.Second
	othersSent := func() []time.Duration {
		var out []time.Duration
		for g, ats := range sentBy(e.fake.Records()) {
			if g != slow {
				out = append(out, ats...)
			}
		}
		return out
	}
	deadline := e.fake.Report().Since.Add(first + bound)
	for len(othersSent()) < len(others) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	sent := othersSent()
	by := arrivalsBy(e.fake.Records())
	if len(sent) < len(others) {
		t.Fatalf("%v after the first send, %d of the %d jobs of the 40 other partitions reached the upstream (and %d of %s's 150): they are blocked behind %s",
			bound, len(sent), len(others), len(by[slow]), slow, slow)
	}
	took := slices.Max(sent) - first
	t.Logf("the 120 jobs of 40 partitions were sent within %v of the first send; %s had sent %d of its 150 by then", took, slow, len(between(by[slow], 0, slices.Max(sent)+1)))
	if took > bound {
		t.Errorf("the 120 jobs of the 40 other partitions took %v from the first send, want at most %v", took, bound)
	}
	e.waitDone(others, 10*time.Second)

	for p, ats := range by {
		if most := fakeupstream.MaxInWindow(ats, time.Second); most > 2 {
			t.Errorf("partition %s: %d requests in one second, want at most 2 (partition_limits)", p, most)
		}
	}
	if rep := e.fake.Report(); rep.Rejected != 0 || rep.MaxInWindow > 200 {
		t.Errorf("the upstream rejected %d and saw %d in one second, want none and at most 200", rep.Rejected, rep.MaxInWindow)
	}
}

// TestPartitionLimitsAcrossReplicas: three `shaper work` replicas drain a
// backlog of four partitions at 5/s and one overridden to 20/s, under a
// 50/s limit on the whole upstream. No partition may get more than its own
// limit in any 1 s window, the upstream no more than 50, and each
// partition must drain at no less than 90% of its own rate (a floor
// judged unless the hypervisor took over 10% of the CPUs' time meanwhile:
// rateFloor).
func TestPartitionLimitsAcrossReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("three shaper work processes for 12 s: multi-process, runs in make test")
	}
	// Not parallel: it measures drain rates.
	const whole = 50
	e := newEnv(t, fakeupstream.Config{Rate: whole, Per: time.Second}, redistest.Options{})
	e.writeConfig(`
redis: {url: "{{REDIS}}"}
work: {shutdown_timeout: 3s}
upstreams:
  mail:
    base_url: "{{UPSTREAM}}"
    limits: [{rate: 50, per: 1s}]
    partition_limits: [{rate: 5, per: 1s}]
    partition_overrides:
      vip.example: [{rate: 20, per: 1s}]
`)
	rates := map[string]int{"a.example": 5, "b.example": 5, "c.example": 5, "d.example": 5, "vip.example": 20}
	names := slices.Sorted(maps.Keys(rates))
	// 16 s of backlog for every partition, interleaved so that none is
	// queued ahead of another; the run lasts 12 s.
	var jobs []*queue.Job
	for sec := 0; sec < 16; sec++ {
		for _, p := range names {
			for k := 0; k < rates[p]; k++ {
				jobs = append(jobs, &queue.Job{Upstream: "mail", Partition: p, Method: "POST", Path: "/" + p + "/" + strconv.Itoa(len(jobs))})
			}
		}
	}
	e.enqueue(len(jobs), func(i int) *queue.Job { return jobs[i] })
	for i := 0; i < 3; i++ {
		e.startWorker()
	}
	waitUntil(t, 30*time.Second, "the first request", func() bool { return e.fake.Report().Total > 0 })
	first := arrivals(e.fake)[0]
	// The host's pressure is read over the span judged below.
	time.Sleep(time.Second)
	mark := stall.MarkPressure()
	time.Sleep(10 * time.Second)
	host := mark.Since()
	time.Sleep(time.Second)
	e.stopAll()

	// Steady state: the 10 s after the first second, when every replica
	// is up and every partition has backlog to the end.
	from, to := first+time.Second, first+11*time.Second
	by := arrivalsBy(e.fake.Records())
	judged := true
	for _, p := range names {
		r := rates[p]
		most := fakeupstream.MaxInWindow(by[p], time.Second)
		got := float64(len(between(by[p], from, to))) / (to - from).Seconds()
		t.Logf("partition %s at %d/s: drained %.1f/s, most in any 1 s %d", p, r, got, most)
		if most > r {
			t.Errorf("partition %s: %d requests in one second, want at most %d", p, most, r)
		}
		if !rateFloor(t, host, got, 0.9*float64(r), "partition "+p+" drained", fmt.Sprintf("90%% of %d/s", r)) {
			judged = false
		}
	}
	rep := e.fake.Report()
	t.Logf("upstream: %d requests, most in any 1 s %d, rejected %d; %v", rep.Total, rep.MaxInWindow, rep.Rejected, host)
	if rep.MaxInWindow > whole || rep.Rejected != 0 {
		t.Errorf("the upstream saw %d requests in one second and rejected %d, want at most %d and none", rep.MaxInWindow, rep.Rejected, whole)
	}
	if !judged {
		floorUnjudged(t, host)
	}
}

// fairShare starts `shaper serve` with API keys of tenants a and b and two
// `shaper work` replicas, for an upstream at 50/s with the given fairness
// line ("" for the default), and returns the env and the API's URL.
func fairShare(t *testing.T, fairness string) (*env, string) {
	t.Helper()
	e := newEnv(t, fakeupstream.Config{Rate: 50, Per: time.Second}, redistest.Options{})
	e.writeConfig(`
redis: {url: "{{REDIS}}"}
work: {shutdown_timeout: 3s}
api:
  keys:
    - {name: a, tenant: a, key_env: E2E_KEY_A}
    - {name: b, tenant: b, key_env: E2E_KEY_B}
  admission: {capacity: 5000, refill_per_second: 1000}
upstreams:
  api:
    base_url: "{{UPSTREAM}}"
    limits: [{rate: 50, per: 1s}]
` + fairness)
	keys := []string{"E2E_KEY_A=key-a", "E2E_KEY_B=key-b"}
	api := e.startServe(keys...)
	for i := 0; i < 2; i++ {
		e.startProc(keys, "work", "--config", e.cfg, "--metrics-listen", "off", "--log-level", "warn")
	}
	return e, api
}

// TestFairShareBetweenTenants: tenant a queues 1,000 jobs at an upstream
// limited to 50/s (20 s of work), then tenant b queues 50. With the default
// fairness b's 50 must be sent in about 2 s (we allow 3 s), not after a's
// 20 s, while the upstream still receives at least 97% of its limit (see
// rateFloor).
func TestFairShareBetweenTenants(t *testing.T) {
	if testing.Short() {
		t.Skip("shaper serve and work processes under two tenants: multi-process, runs in make test")
	}
	// Not parallel: it measures a drain rate to within 3%.
	e, api := fairShare(t, "")
	enqueueBatch(t, api, "key-a", "api", "a", 1000)
	waitUntil(t, 30*time.Second, "tenant a's first send", func() bool { return e.fake.Report().Total > 0 })
	time.Sleep(time.Second) // a's backlog is being drained at the limit
	enqueueBatch(t, api, "key-b", "api", "b", 50)
	bAt := e.fakeClock(time.Now())
	mark := stall.MarkPressure()

	const bound = 3 * time.Second
	deadline := time.Now().Add(bound + 500*time.Millisecond)
	for len(sentBy(e.fake.Records())["b"]) < 50 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	by := sentBy(e.fake.Records())
	if len(by["b"]) < 50 {
		t.Fatalf("%v after tenant b enqueued 50 jobs behind tenant a's 1,000, %d of b's had been sent (and %d of a's): b waits behind a",
			bound+500*time.Millisecond, len(by["b"]), len(by["a"]))
	}
	lastB := slices.Max(by["b"])
	took := lastB - bAt
	both := between(arrivals(e.fake), bAt, lastB+1)
	rate := fakeupstream.RatePerSecond(both)
	host := mark.Since()
	t.Logf("tenant b's 50 sent within %v of enqueueing; meanwhile a got %d sends; the upstream received %.1f/s; %v", took, len(between(by["a"], bAt, lastB+1)), rate, host)
	if took > bound {
		t.Errorf("tenant b's 50 jobs took %v to be sent behind tenant a's backlog, want at most %v (about 2 s at an equal share of 50/s)", took, bound)
	}
	judged := rateFloor(t, host, rate, 0.97*50, "while both tenants had backlog the upstream received", "97% of 50/s")
	if rep := e.fake.Report(); rep.Rejected != 0 || rep.MaxInWindow > 50 {
		t.Errorf("the upstream rejected %d and saw %d in one second, want none and at most 50", rep.Rejected, rep.MaxInWindow)
	}
	if !judged {
		floorUnjudged(t, host)
	}
}

// TestWeightedFairShare: with fairness weights {b: 3}, while both tenants
// have backlog tenant b gets about three times tenant a's sends.
func TestWeightedFairShare(t *testing.T) {
	if testing.Short() {
		t.Skip("shaper serve and work processes under two tenants: multi-process, runs in make test")
	}
	// Not parallel: it measures shares of a drain rate.
	e, api := fairShare(t, "    fairness: {by: tenant, weights: {b: 3}}\n")
	enqueueBatch(t, api, "key-a", "api", "a", 1000)
	waitUntil(t, 30*time.Second, "tenant a's first send", func() bool { return e.fake.Report().Total > 0 })
	time.Sleep(time.Second)
	// 200 jobs: at least 4 s of backlog for b even if it got every slot.
	enqueueBatch(t, api, "key-b", "api", "b", 200)
	bAt := e.fakeClock(time.Now())
	// The host's pressure is read over the span judged below.
	time.Sleep(500 * time.Millisecond)
	mark := stall.MarkPressure()
	time.Sleep(4 * time.Second)
	host := mark.Since()
	time.Sleep(500 * time.Millisecond)

	// Both have backlog from b's enqueue to at least 4 s later; the first
	// half second lets the scheduler see b.
	from, to := bAt+500*time.Millisecond, bAt+4500*time.Millisecond
	by := arrivalsBy(e.fake.Records())
	a, b := len(between(by["a"], from, to)), len(between(by["b"], from, to))
	rate := fakeupstream.RatePerSecond(between(arrivals(e.fake), from, to))
	t.Logf("over 4 s with both backlogged: a %d sends, b %d (%.2f×), upstream %.1f/s; %v", a, b, float64(b)/float64(max(a, 1)), rate, host)
	if a == 0 || float64(b) < 2.5*float64(a) || float64(b) > 3.5*float64(a) {
		t.Errorf("tenant b (weight 3) got %d sends to tenant a's %d (weight 1), want about 3× (2.5× to 3.5×)", b, a)
	}
	if !rateFloor(t, host, rate, 0.97*50, "while both tenants had backlog the upstream received", "97% of 50/s") {
		floorUnjudged(t, host)
	}
}

// TestSlowUpstreamHoldsNoWorker: one replica serves an upstream at 10/min
// with 1,000 jobs queued and a fast one at 100/s with 400. The fast one
// must drain at its rate (over 4 s, so that a stall of the shared
// machine, which costs the slots it spans, weighs half what it did over
// 2 s), proving the slow one's backlog holds no worker; and once the fast one is done, each send of the slow one may cost Redis
// at most 5 commands beyond what the same replica costs idle.
func TestSlowUpstreamHoldsNoWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("counts a shaper work process's Redis commands for 30 s: multi-process, runs in make test")
	}
	// Not parallel: it measures a drain rate to within 3%.
	e := newEnv(t, fakeupstream.Config{}, redistest.Options{})
	// workers: 4 on each upstream: whether the engine gives each upstream
	// its own or pools them per replica, 4 is all there is to hold.
	e.writeConfig(`
redis: {url: "{{REDIS}}"}
work: {shutdown_timeout: 3s}
upstreams:
  slow:
    base_url: "{{UPSTREAM}}"
    limits: [{rate: 10, per: 1m}]
    workers: 4
  fast:
    base_url: "{{UPSTREAM}}"
    limits: [{rate: 100, per: 1s}]
    workers: 4
`)
	e.startWorker()
	// The idle replica's own cost, over a whole multiple of the periods
	// background work usually runs at (1 s, 2 s, 5 s), to subtract below.
	time.Sleep(3 * time.Second)
	const baseFor = 10 * time.Second
	c0 := e.commandsProcessed()
	time.Sleep(baseFor)
	idle := float64(e.commandsProcessed()-c0-1) / baseFor.Seconds()

	e.enqueue(1000, func(i int) *queue.Job { return &queue.Job{Upstream: "slow", Path: "/slow/" + strconv.Itoa(i)} })
	e.enqueue(400, func(i int) *queue.Job { return &queue.Job{Upstream: "fast", Path: "/fast/" + strconv.Itoa(i)} })
	waitUntil(t, 20*time.Second, "the fast upstream's 400 jobs", func() bool { return len(sentBy(e.fake.Records())["fast"]) >= 400 })
	fast := fakeupstream.RatePerSecond(sentBy(e.fake.Records())["fast"])
	t.Logf("the fast upstream drained at %.1f/s beside the slow one's backlog", fast)
	if fast < 0.97*100 {
		t.Errorf("the fast upstream drained at %.1f/s beside a slow upstream's backlog, want at least 97%% of 100/s", fast)
	}

	// Now only the slow upstream has work: its first send (the initial
	// burst) is behind us, and each later one comes 6 s after the last.
	time.Sleep(time.Second)
	const window = 20 * time.Second
	s0, calls0 := e.commandsProcessed(), e.commandCalls()
	stopMonitor := e.monitor()
	from := e.fakeClock(time.Now())
	// Meanwhile, how many of the slow upstream's jobs workers hold, every
	// 50 ms: a job is taken only when its slot is at most the horizon
	// (250 ms) away, so a worker holds one for that and the request, then
	// none for the rest of the 6 s between sends.
	var samples, holding, most int
	sampleEnd := time.Now().Add(window)
	for time.Now().Before(sampleEnd) {
		c, err := e.q.Counts(context.Background(), "slow")
		if err != nil {
			t.Fatal(err)
		}
		samples++
		if a := int(c["default"].Active); a > 0 {
			holding++
			most = max(most, a)
		}
		time.Sleep(50 * time.Millisecond)
	}
	to := e.fakeClock(time.Now())
	clientCmds, luaCmds := stopMonitor()
	s1, calls1 := e.commandsProcessed(), e.commandCalls()
	sends := len(between(arrivalsBy(e.fake.Records())["slow"], from, to))
	all := float64(s1-s0-2) - idle*window.Seconds() // less our own two INFOs
	// The bound is on commands the workers send (round trips, pipelined
	// or not); a script's own calls inside Redis are reported beside it.
	// Less this test's own reads of the counts, one HGETALL a sample.
	clientCmds -= samples
	perSend := (float64(clientCmds) - idle*window.Seconds()) / float64(max(sends, 1))
	t.Logf("idle replica: %.1f commands/s; slow upstream: %d sends in %v: %.1f commands sent per send (%d sent, %d run inside scripts; %.0f in all beyond idle); calls %v",
		idle, sends, window, perSend, clientCmds, luaCmds, all, callsSince(calls0, calls1))
	if sends < 3 {
		t.Errorf("the slow upstream sent %d in %v, want at least 3 at 10/min", sends, window)
	}
	held := time.Duration(holding) * window / time.Duration(max(samples, 1))
	t.Logf("workers held a slow job in %d of %d samples (about %v of %v), at most %d at once", holding, samples, held, window, most)
	if most > 1 || held > time.Duration(sends+1)*time.Second {
		t.Errorf("workers held slow jobs for about %v of %v (at most %d at once) for %d sends, want at most one, for under a second a send",
			held, window, most, sends)
	}
	if perSend > 5 {
		t.Errorf("the slow upstream cost %.1f Redis commands sent per send beyond the idle replica's, want at most 5", perSend)
	}
}

// TestIdleCostsNothingPerUpstream: 200 configured upstreams, two idle
// `shaper work` replicas and `shaper serve`: Redis must serve at most
// 1,000 commands/s in all (today: about 112,000).
func TestIdleCostsNothingPerUpstream(t *testing.T) {
	if testing.Short() {
		t.Skip("counts an idle fleet's Redis commands: multi-process, runs in make test")
	}
	t.Parallel()
	e := newEnv(t, fakeupstream.Config{}, redistest.Options{})
	e.writeConfig(`
redis: {url: "{{REDIS}}"}
work: {shutdown_timeout: 3s}
api:
  keys: [{name: ops, key_env: E2E_KEY}]
` + upstreamsYAML(200))
	e.startServe("E2E_KEY=k-e2e")
	e.startWorker()
	e.startWorker()
	time.Sleep(3 * time.Second)
	const over = 5 * time.Second
	c0, calls0 := e.commandsProcessed(), e.commandCalls()
	time.Sleep(over)
	c1, calls1 := e.commandsProcessed(), e.commandCalls()
	rate := float64(c1-c0-2) / over.Seconds()
	t.Logf("idle fleet of 200 upstreams × 2 replicas + serve: %.0f Redis commands/s", rate)
	if rate > 1000 {
		t.Errorf("an idle fleet of 200 upstreams × 2 replicas costs Redis %.0f commands/s, want at most 1,000; calls %v", rate, callsSince(calls0, calls1))
	}
}

// TestPickupLatency: with 1,000 upstreams configured and one idle replica, a
// job enqueued to an idle upstream reaches it with p50 ≤ 20 ms and p99 ≤
// 100 ms after the enqueue call returns. These are timed bounds, the ones
// issue 8 sets; like every test here they are skipped under -short.
func TestPickupLatency(t *testing.T) {
	if testing.Short() {
		t.Skip("timed bounds on pickup latency with 1,000 upstreams: multi-process, runs in make test")
	}
	// Not parallel: it times milliseconds.
	const ups = 1000
	e := newEnv(t, fakeupstream.Config{}, redistest.Options{})
	e.writeConfig("redis: {url: \"{{REDIS}}\"}\nwork: {shutdown_timeout: 3s}\n" + upstreamsYAML(ups))
	e.startWorker()
	// A first job proves the replica is up; then it goes idle.
	e.enqueue(1, func(int) *queue.Job { return &queue.Job{Upstream: "u0000", Path: "/warm/0"} })
	waitUntil(t, 60*time.Second, "the warm-up job", func() bool { return e.fake.Report().Total > 0 })
	time.Sleep(3 * time.Second)

	rng := rand.New(rand.NewPCG(8, 8))
	var lat []time.Duration
	for i := 1; i <= 100; i++ {
		up := fmt.Sprintf("u%04d", rng.IntN(ups))
		if _, _, err := e.q.Enqueue(context.Background(), &queue.Job{Upstream: up, Path: "/" + up + "/" + strconv.Itoa(i)}); err != nil {
			t.Fatal(err)
		}
		returned := e.fakeClock(time.Now())
		path := "/" + up + "/" + strconv.Itoa(i)
		var at time.Duration
		waitUntil(t, 5*time.Second, "job "+strconv.Itoa(i)+" on "+up, func() bool {
			recs := e.fake.Records()
			for j := len(recs) - 1; j >= 0; j-- {
				if recs[j].Path == path {
					at = recs[j].At
					return true
				}
			}
			return false
		})
		lat = append(lat, at-returned)
		time.Sleep(10 * time.Millisecond) // let the replica go idle again
	}
	p50, p99 := fakeupstream.Percentile(lat, 50), fakeupstream.Percentile(lat, 99)
	t.Logf("pickup with %d upstreams: p50 %v, p99 %v, max %v", ups, p50, p99, slices.Max(lat))
	if p50 > 20*time.Millisecond || p99 > 100*time.Millisecond {
		t.Errorf("pickup latency p50 %v, p99 %v; want at most 20 ms and 100 ms", p50, p99)
	}
}
