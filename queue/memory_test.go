package queue

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/taskstore"
)

// usedMemory is Redis's used_memory.
func usedMemory(t *testing.T, rdb redis.UniversalClient) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatal("no used_memory in INFO memory")
	return 0
}

// TestMemoryEstimateCoversAJob: what a queued and a finished job really
// cost in Redis is at most what shaper.MemoryCosts says (the estimate
// `shaper config validate` prints must not fall short), measured over
// 2,000 jobs with 100-byte bodies and 50-byte responses.
func TestMemoryEstimateCoversAJob(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	const n, body, resp = 2000, 100, 50
	q := newQueue(t, rdb, upstreams(0))
	// One job first, so that the keys every job shares exist already.
	q.Enqueue(ctx, &Job{Tenant: "t", Upstream: "stripe", Path: "/x", Body: []byte(strings.Repeat("b", body))})
	before := usedMemory(t, rdb)
	for i := range n {
		_, _, err := q.Enqueue(ctx, &Job{Tenant: "t", Upstream: "stripe", Method: "POST", Path: "/v1/charges/" + strconv.Itoa(i),
			Headers: map[string]string{"Content-Type": "application/json"}, Body: []byte(strings.Repeat("b", body))})
		if err != nil {
			t.Fatal(err)
		}
	}
	queued := float64(usedMemory(t, rdb)-before) / n
	result, _ := json.Marshal(map[string]any{"status": 200, "headers": map[string][]string{"Content-Type": {"application/json"}},
		"body": strings.Repeat("r", resp)})
	finishAll(t, q, rdb, "stripe", func(string) *taskstore.Finished {
		return &taskstore.Finished{Outcome: taskstore.Succeeded, Result: result, Retention: time.Hour}
	})
	finished := float64(usedMemory(t, rdb)-before) / n
	c := shaper.MemoryCosts()
	t.Logf("per job with a %d-byte body: queued %.0f B (estimate %d), finished with a %d-byte response %.0f B (estimate %d)",
		body, queued, c.QueuedJob+body, resp, finished, c.FinishedJob+body+resp)
	if queued > float64(c.QueuedJob+body) {
		t.Errorf("a queued job costs %.0f B, more than the estimate's %d + its body", queued, c.QueuedJob)
	}
	if finished > float64(c.FinishedJob+body+resp) {
		t.Errorf("a finished job costs %.0f B, more than the estimate's %d + its body and response", finished, c.FinishedJob)
	}
}
