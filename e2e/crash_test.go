package e2e

import (
	"strconv"
	"testing"
	"time"

	"github.com/shaperhq/shaper/fakeupstream"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/queue"
)

const crashConfig = `
redis: {url: "{{REDIS}}"}
work: {shutdown_timeout: 5s}
upstreams:
  api:
    base_url: "{{UPSTREAM}}"
    limits: [{rate: 20, per: 1s}]
    workers: 8
    retry: {max_attempts: 5, min_backoff: 100ms, max_backoff: 1s}
`

// checkDelivered asserts that every job succeeded and reached the upstream
// under its own idempotency key, and returns how many keys arrived twice
// with a success.
func checkDelivered(t *testing.T, e *env, done map[string]*queue.Info) int {
	t.Helper()
	for id, info := range done {
		if info.State != queue.StateSucceeded {
			t.Errorf("job %s: %s (%s)", id, info.State, info.LastError)
		}
	}
	seen := map[string]int{}
	for _, r := range e.fake.Records() {
		if r.Status/100 == 2 {
			seen[r.IdempotencyKey]++
		}
	}
	dups := 0
	for id := range done {
		switch n := seen[id]; {
		case n == 0:
			t.Errorf("job %s never reached the upstream", id)
		case n > 1:
			dups++
		}
	}
	if len(seen) != len(done) {
		t.Errorf("the upstream saw %d distinct idempotency keys for %d jobs", len(seen), len(done))
	}
	return dups
}

// TestKillWorkerMidRun kills -9 one of two workers mid-run and restarts it.
// Every accepted job must be delivered; a duplicate is allowed only for a job
// in flight at the kill, and it carries the job's idempotency key.
func TestKillWorkerMidRun(t *testing.T) {
	if testing.Short() {
		t.Skip("kills shaper work processes: multi-process, runs in make test")
	}
	t.Parallel()
	e := newEnv(t, fakeupstream.Config{}, redistest.Options{})
	e.writeConfig(crashConfig)
	ids := e.enqueue(300, func(i int) *queue.Job { return &queue.Job{Upstream: "api", Path: "/k/" + strconv.Itoa(i)} })
	victim := e.startWorker()
	e.startWorker()
	waitUntil(t, 30*time.Second, "40 deliveries", func() bool { return e.fake.Report().Total >= 40 })
	victim.kill()
	t.Logf("killed a worker after %d deliveries", e.fake.Report().Total)
	e.startWorker()
	// asynq gives a dead worker's jobs back once their lease has been
	// expired for 30s, checking every minute: allow for that.
	done := e.waitDone(ids, 4*time.Minute)
	dups := checkDelivered(t, e, done)
	t.Logf("%d jobs delivered, %d delivered twice", len(done), dups)
	// The victim held at most its 8 workers' jobs; only a request it had
	// already sent can arrive twice.
	if dups > 8 {
		t.Errorf("%d jobs arrived twice, more than the killed worker could have had in flight (8)", dups)
	}
}

// TestRedisRestartMidRun restarts Redis (AOF on) while two workers drain.
// No job may be lost, and dispatch must resume by itself.
func TestRedisRestartMidRun(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts redis-server under shaper work: multi-process, runs in make test")
	}
	t.Parallel()
	e := newEnv(t, fakeupstream.Config{}, redistest.Options{AppendOnly: true})
	e.writeConfig(crashConfig)
	ids := e.enqueue(200, func(i int) *queue.Job { return &queue.Job{Upstream: "api", Path: "/r/" + strconv.Itoa(i)} })
	e.startWorker()
	e.startWorker()
	waitUntil(t, 30*time.Second, "40 deliveries", func() bool { return e.fake.Report().Total >= 40 })
	if err := e.redis.Stop(); err != nil {
		t.Fatal(err)
	}
	before := e.fake.Report().Total
	time.Sleep(2 * time.Second)
	if err := e.redis.Restart(); err != nil {
		t.Fatal(err)
	}
	t.Logf("restarted Redis after %d deliveries", before)
	done := e.waitDone(ids, 4*time.Minute)
	dups := checkDelivered(t, e, done)
	t.Logf("%d jobs delivered, %d delivered twice", len(done), dups)
	if after := e.fake.Report().Total; after <= before {
		t.Fatalf("no deliveries after the restart")
	}
}
