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

// TestProxyCallsAndJobsShareTheLimit: two `shaper serve` replicas proxy
// calls and two `shaper work` replicas drain a backlog of jobs into one
// upstream that enforces L requests per sliding second. Together they
// never put more than L into any second at the upstream, which refuses
// nothing; every call is answered by the upstream (its slot came within
// its wait), and every call the upstream received was answered to its
// caller.
func TestProxyCallsAndJobsShareTheLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("shaper serve and work replicas: multi-process, runs in make test")
	}
	t.Parallel()
	const L = 20
	const runFor = 6 * time.Second
	e := newEnv(t, fakeupstream.Config{Algorithm: fakeupstream.SlidingLog, Rate: L, Per: time.Second}, redistest.Options{})
	e.writeConfig(`
redis: {url: "{{REDIS}}"}
api:
  keys: [{name: billing, key_env: E2E_KEY}]
  admission: {capacity: 1000, refill_per_second: 1000}
upstreams:
  api:
    base_url: "{{UPSTREAM}}"
    limits: [{rate: 20, per: 1s}]
    headers: {Authorization: "Bearer upstream-key"}
    proxy: {max_wait: 10s}
`)
	e.enqueue(int(L*runFor.Seconds()*2), func(i int) *queue.Job {
		return &queue.Job{Upstream: "api", Method: "POST", Path: "/v1/jobs/" + strconv.Itoa(i)}
	})
	urls := []string{e.startServe("E2E_KEY=k-e2e"), e.startServe("E2E_KEY=k-e2e")}
	for i := 0; i < 2; i++ {
		e.startWorker()
	}
	waitUntil(t, 30*time.Second, "the first job at the upstream", func() bool { return e.fake.Report().Total > 0 })

	// Four callers, each one call after another, over both replicas.
	hc := &http.Client{Timeout: 30 * time.Second}
	var mu sync.Mutex
	answered := map[string]int{}
	codes := map[int]int{}
	var wg sync.WaitGroup
	stop := time.Now().Add(runFor)
	for c := 0; c < 4; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(stop); i++ {
				path := fmt.Sprintf("/v1/calls/%d-%d", c, i)
				req, _ := http.NewRequest("POST", urls[(c+i)%2]+"/proxy/api"+path, strings.NewReader(`{}`))
				req.Header.Set("Authorization", "Bearer k-e2e")
				req.Header.Set("Content-Type", "application/json")
				resp, err := hc.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				codes[resp.StatusCode]++
				if resp.StatusCode == 200 {
					answered[path]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	e.stopAll()

	var all []time.Duration
	calls := 0
	for _, r := range e.fake.Records() {
		all = append(all, r.At)
		if strings.HasPrefix(r.Path, "/v1/calls/") {
			calls++
			if answered[r.Path] != 1 {
				t.Errorf("the upstream received call %s, answered to its caller %d times, want 1", r.Path, answered[r.Path])
			}
		}
	}
	rep := e.fake.Report()
	most := fakeupstream.MaxInWindow(all, time.Second)
	t.Logf("upstream received %d (%d calls, %d jobs), most in any 1s %d, rejected %d; callers got %v",
		len(all), calls, len(all)-calls, most, rep.Rejected, codes)
	if most > L {
		t.Errorf("the upstream received %d requests in one second, want at most %d", most, L)
	}
	if rep.Rejected > 0 {
		t.Errorf("the upstream refused %d requests, want none", rep.Rejected)
	}
	if codes[200] == 0 || len(codes) != 1 {
		t.Errorf("callers got %v, want only 200s", codes)
	}
	if calls != codes[200] {
		t.Errorf("the upstream received %d calls, callers were answered %d, want the same", calls, codes[200])
	}
	if calls == len(all) {
		t.Errorf("no job reached the upstream while the calls went through")
	}
}
