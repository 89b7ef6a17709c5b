package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shaperhq/shaper/fakeupstream"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

// TestLongPollWakeLatency: with a real `shaper serve` and `shaper work`, a
// long poll (GET /v1/jobs/{id}?wait=30s) answers within 50 ms of its job
// becoming final, measured from the moment the worker's finish script
// announced it (this test subscribes to the same channel); and an enqueue
// with Prefer: wait answers 200 with the final job.
func TestLongPollWakeLatency(t *testing.T) {
	if testing.Short() {
		t.Skip("shaper serve and work: multi-process, runs in make test")
	}
	t.Parallel()
	// The upstream takes 200 ms, so every long poll is waiting before its
	// job finishes.
	e := newEnv(t, fakeupstream.Config{Latency: 200 * time.Millisecond}, redistest.Options{})
	e.writeConfig(`
redis: {url: "{{REDIS}}"}
api:
  keys: [{name: billing, key_env: E2E_KEY}]
  admission: {capacity: 1000, refill_per_second: 1000}
upstreams:
  api:
    base_url: "{{UPSTREAM}}"
    limits: [{rate: 50, per: 1s}]
`)
	base := e.startServe("E2E_KEY=k-e2e")
	e.startWorker()

	// When each job became final: the announcement, as any subscriber
	// hears it.
	ctx := context.Background()
	ps := e.rdb.Subscribe(ctx, jobstore.FinalChannel(""))
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	final := map[string]time.Time{}
	go func() {
		for m := range ps.Channel() {
			at := time.Now()
			mu.Lock()
			for _, id := range strings.Split(m.Payload, "\n") {
				final[id] = at
			}
			mu.Unlock()
		}
	}()

	post := func(prefer string) (*http.Response, map[string]any) {
		req, _ := http.NewRequest("POST", base+"/v1/jobs", strings.NewReader(`{"upstream":"api","method":"POST","path":"/v1/x"}`))
		req.Header.Set("Authorization", "Bearer k-e2e")
		req.Header.Set("Content-Type", "application/json")
		if prefer != "" {
			req.Header.Set("Prefer", prefer)
		}
		resp, err := e.api.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		json.NewDecoder(resp.Body).Decode(&out)
		return resp, out
	}

	const n = 20
	lags := make([]time.Duration, n)
	var wg sync.WaitGroup
	for i := range n {
		_, job := post("")
		id, _ := job["id"].(string)
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("GET", base+"/v1/jobs/"+id+"?wait=30s", nil)
			req.Header.Set("Authorization", "Bearer k-e2e")
			resp, err := e.api.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			var got map[string]any
			json.NewDecoder(resp.Body).Decode(&got)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			answered := time.Now()
			if got["state"] != "succeeded" {
				t.Errorf("job %s: got %v, want succeeded", id, got["state"])
				return
			}
			// The announcement reaches serve and this test at the same
			// moment; this test's reader may note it after serve has
			// answered (a lag below zero).
			var at time.Time
			for wait := time.Now().Add(2 * time.Second); at.IsZero() && time.Now().Before(wait); time.Sleep(time.Millisecond) {
				mu.Lock()
				at = final[id]
				mu.Unlock()
			}
			if at.IsZero() {
				t.Errorf("job %s answered succeeded, and its announcement was never heard", id)
				return
			}
			lags[i] = max(answered.Sub(at), 0)
		}()
		time.Sleep(50 * time.Millisecond)
	}
	wg.Wait()
	slices.Sort(lags)
	t.Logf("long poll answered after the job became final: median %v, max %v (n=%d)", lags[n/2], lags[n-1], n)
	if lags[n-1] > 50*time.Millisecond {
		t.Errorf("slowest long poll answered %v after its job became final, want within 50ms (all: %v)", lags[n-1], lags)
	}

	start := time.Now()
	resp, got := post("wait=10")
	if resp.StatusCode != 200 || got["state"] != "succeeded" || resp.Header.Get("Preference-Applied") != "wait=10" || got["response"] == nil {
		t.Fatalf("Prefer: wait=10: got %d %v (Preference-Applied %q), want 200 with the final job",
			resp.StatusCode, got, resp.Header.Get("Preference-Applied"))
	}
	t.Logf("Prefer: wait=10 answered the final job after %v", time.Since(start))
}
