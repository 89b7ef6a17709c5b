package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper/fakeupstream"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

const scheduleConfig = `
redis: {url: "{{REDIS}}"}
work: {shutdown_timeout: 2s}
api:
  keys: [{name: billing, key_env: SHAPER_KEY_BILLING}]
upstreams:
  api:
    base_url: "{{UPSTREAM}}"
    limits: [{rate: 50, per: 1s}]
    workers: 4
    retry: {max_attempts: 5, min_backoff: 100ms, max_backoff: 1s}
`

// TestScheduleRunsEachTickOnceThroughKills: three replicas (two serve,
// one work) run an @every 1s schedule for 30 s while replicas are killed
// with SIGKILL and restarted, one at a time, so at least one always runs.
// Every tick in the span gets exactly one job: the upstream sees every
// second's idempotency key schedule:NAME:UNIXTIME, none missing, and the
// queue holds one job per tick.
func TestScheduleRunsEachTickOnceThroughKills(t *testing.T) {
	if testing.Short() {
		t.Skip("kills shaper processes: multi-process, runs in make test")
	}
	t.Parallel()
	e := newEnv(t, fakeupstream.Config{}, redistest.Options{})
	e.writeConfig(scheduleConfig)
	key := []string{"SHAPER_KEY_BILLING=k-billing"}
	apis := []string{e.startServe(key...), e.startServe(key...)}
	procs := map[string]*worker{}
	e.mu.Lock()
	procs["serve0"], procs["serve1"] = e.workers[0], e.workers[1]
	e.mu.Unlock()
	procs["work"] = e.startWorker()

	call := func(base, method, path, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer k-billing")
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := e.api.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		var out map[string]any
		json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	code, made := call(apis[0], "POST", "/v1/schedules", `{"name":"tick","cron":"@every 1s","job":{"upstream":"api","method":"POST","path":"/tick"}}`)
	if code != http.StatusCreated {
		t.Fatalf("create: got %d %v", code, made)
	}
	first, _ := time.Parse(time.RFC3339, made["next_run_at"].(string))
	start := time.Now()

	// One replica at a time is killed and, a few seconds later, restarted.
	plan := []struct {
		at   time.Duration
		proc string
		kill bool
	}{
		{4 * time.Second, "work", true}, {8 * time.Second, "work", false},
		{11 * time.Second, "serve0", true}, {15 * time.Second, "serve0", false},
		{18 * time.Second, "serve1", true}, {22 * time.Second, "serve1", false},
		{25 * time.Second, "work", true}, {27 * time.Second, "work", false},
	}
	live := 1 // the API to talk to: a serve replica that is running
	for _, p := range plan {
		time.Sleep(time.Until(start.Add(p.at)))
		switch {
		case p.kill:
			procs[p.proc].kill()
			t.Logf("%5.1fs killed %s", time.Since(start).Seconds(), p.proc)
		case p.proc == "work":
			procs[p.proc] = e.startWorker()
		default:
			i, _ := strconv.Atoi(strings.TrimPrefix(p.proc, "serve"))
			apis[i] = e.startServe(key...)
			e.mu.Lock()
			procs[p.proc] = e.workers[len(e.workers)-1]
			e.mu.Unlock()
		}
		if p.proc == "serve1" {
			live = 0
		} else if p.proc == "serve0" {
			live = 1
		}
	}
	time.Sleep(time.Until(start.Add(30 * time.Second)))
	code, paused := call(apis[live], "POST", "/v1/schedules/tick/pause", "")
	if code != http.StatusOK {
		t.Fatalf("pause: got %d %v", code, paused)
	}
	// A run a replica began just before the pause may still land after the
	// schedule's last recorded run: the span ends at the last tick seen.
	time.Sleep(time.Second)
	_, view := call(apis[live], "GET", "/v1/schedules/tick", "")
	recorded, _ := time.Parse(time.RFC3339, view["last_run_at"].(string))
	if n := int(recorded.Sub(first)/time.Second) + 1; n < 25 {
		t.Fatalf("the span %v..%v holds %d ticks, want about 30", first, recorded, n)
	}

	// Every job reaches the upstream (a job sent twice, by a worker killed
	// mid-send, is one key seen twice).
	seen := map[int64]bool{}
	waitUntil(t, 60*time.Second, "every tick's job at the upstream", func() bool {
		for _, r := range e.fake.Records() {
			if tk, ok := strings.CutPrefix(r.IdempotencyKey, "schedule:tick:"); ok && r.Status/100 == 2 {
				n, _ := strconv.ParseInt(tk, 10, 64)
				seen[n] = true
			}
		}
		return len(seen) >= int(recorded.Sub(first)/time.Second)+1
	})
	last := recorded.Unix()
	for tk := range seen {
		last = max(last, tk)
	}
	want := int(last-first.Unix()) + 1
	var missing, outside []int64
	for tk := first.Unix(); tk <= last; tk++ {
		if !seen[tk] {
			missing = append(missing, tk)
		}
		delete(seen, tk)
	}
	for tk := range seen {
		outside = append(outside, tk)
	}
	if len(missing) > 0 || len(outside) > 0 || last > recorded.Unix()+1 {
		t.Errorf("ticks %d..%d (last recorded %d): missing %v, outside the span %v", first.Unix(), last, recorded.Unix(), missing, outside)
	}
	counts, err := e.q.Counts(context.Background(), "api")
	if err != nil {
		t.Fatal(err)
	}
	var jobs int64
	for _, c := range counts {
		jobs += c.Pending + c.Scheduled + c.Retry + c.Active + c.Dead + c.Succeeded
	}
	if jobs != int64(want) {
		t.Errorf("the queue holds %d jobs for %d ticks, want one each", jobs, want)
	}
	t.Logf("%d ticks from %v, one job each", want, first.Format(time.TimeOnly))
}
