package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shaperhq/shaper/fakeupstream"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/queue"
)

// TestProxyCallsInFairShare: tenant a proxies calls through two `shaper
// serve` replicas with 4 callers, one call after another, while tenant b
// has 500 jobs queued for two `shaper work` replicas, into one upstream
// at 50/s that is the bottleneck. Counted at the upstream over the busy
// middle of the run, each tenant gets half of the slots (± 10%), the
// upstream stays at its limit and refuses nothing, and no window of a
// second holds more than 50.
func TestProxyCallsInFairShare(t *testing.T) {
	if testing.Short() {
		t.Skip("shaper serve and work replicas: multi-process, runs in make test")
	}
	t.Parallel()
	testProxyCallsInFairShare(t, 0)
}

// TestProxyCallsInFairShareOfTightPartition: the same, with a's calls
// (Shaper-Partition: p) and b's jobs in one partition whose limit, 25/s,
// is tighter than the upstream's 50/s: each tenant gets half of the
// partition's slots, the partition stays at its limit, and no window of a
// second holds more than 25.
func TestProxyCallsInFairShareOfTightPartition(t *testing.T) {
	if testing.Short() {
		t.Skip("shaper serve and work replicas: multi-process, runs in make test")
	}
	t.Parallel()
	testProxyCallsInFairShare(t, 25)
}

// testProxyCallsInFairShare runs TestProxyCallsInFairShare, with calls
// and jobs in partition p limited to partition per second when it is not
// 0.
func testProxyCallsInFairShare(t *testing.T, partition int64) {
	L := int64(50)
	const runFor = 8 * time.Second
	e := newEnv(t, fakeupstream.Config{Algorithm: fakeupstream.SlidingLog, Rate: L, Per: time.Second}, redistest.Options{})
	parts, part := "", ""
	if partition > 0 {
		parts = fmt.Sprintf("\n    partition_limits: [{rate: %d, per: 1s}]", partition)
		part = "p"
		L = partition
	}
	e.writeConfig(`
redis: {url: "{{REDIS}}"}
api:
  keys: [{name: a, key_env: E2E_KEY}]
  admission: {capacity: 1000, refill_per_second: 1000}
upstreams:
  api:
    base_url: "{{UPSTREAM}}"
    limits: [{rate: 50, per: 1s}]` + parts + `
    headers: {Authorization: "Bearer upstream-key"}
    proxy: {max_wait: 10s}
`)
	e.enqueue(500, func(i int) *queue.Job {
		return &queue.Job{Tenant: "b", Upstream: "api", Method: "POST", Path: "/v1/jobs/" + strconv.Itoa(i), Partition: part}
	})
	urls := []string{e.startServe("E2E_KEY=k-e2e"), e.startServe("E2E_KEY=k-e2e")}
	for i := 0; i < 2; i++ {
		e.startWorker()
	}
	waitUntil(t, 30*time.Second, "the first job at the upstream", func() bool { return e.fake.Report().Total > 0 })

	hc := &http.Client{Timeout: 30 * time.Second}
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	began := time.Now()
	stop := began.Add(runFor)
	for c := 0; c < 4; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(stop); i++ {
				req, _ := http.NewRequest("POST", fmt.Sprintf("%s/proxy/api/v1/calls/%d-%d", urls[(c+i)%2], c, i), strings.NewReader(`{}`))
				req.Header.Set("Authorization", "Bearer k-e2e")
				if part != "" {
					req.Header.Set("Shaper-Partition", part)
				}
				resp, err := hc.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				codes[resp.StatusCode]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	e.stopAll()

	// The busy middle: from a second after the callers began to a second
	// before they stopped, on the upstream's clock.
	recs := e.fake.Records()
	var firstCall time.Duration = -1
	for _, r := range recs {
		if strings.HasPrefix(r.Path, "/v1/calls/") && (firstCall < 0 || r.At < firstCall) {
			firstCall = r.At
		}
	}
	if firstCall < 0 {
		t.Fatalf("no call reached the upstream; callers got %v", codes)
	}
	from, to := firstCall+time.Second, firstCall+runFor-time.Second
	var all []time.Duration
	calls, jobs := 0, 0
	for _, r := range recs {
		all = append(all, r.At)
		if r.At < from || r.At >= to {
			continue
		}
		if strings.HasPrefix(r.Path, "/v1/calls/") {
			calls++
		} else {
			jobs++
		}
	}
	rep := e.fake.Report()
	most := fakeupstream.MaxInWindow(all, time.Second)
	share := float64(calls) / float64(calls+jobs)
	t.Logf("over %v: calls %d, jobs %d (calls %.0f%%); most in any 1s %d, rejected %d; callers got %v",
		to-from, calls, jobs, 100*share, most, rep.Rejected, codes)
	if share < 0.4 || share > 0.6 {
		t.Errorf("tenant a's calls got %d of %d slots (%.0f%%), want 50%% ± 10%%", calls, calls+jobs, 100*share)
	}
	if want := 0.85 * float64(L) * (to - from).Seconds(); float64(calls+jobs) < want {
		t.Errorf("the upstream received %d in %v, want at least %.0f (85%% of the limit, %d/s)", calls+jobs, to-from, want, L)
	}
	if int64(most) > L || rep.Rejected > 0 {
		t.Errorf("most in any second %d (limit %d), refused %d; want within the limit, none refused", most, L, rep.Rejected)
	}
	if len(codes) != 1 || codes[200] == 0 {
		t.Errorf("callers got %v, want only 200s", codes)
	}
}
