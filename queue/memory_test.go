package queue

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper/internal/testsupport/redistest"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
)

// TestMemoryEstimateCoversAJob: what a queued and a finished job really
// cost in Redis is at most what shaper.MemoryCosts says (the estimate
// `shaper config validate` prints must not fall short), measured over
// 2,000 jobs with 100-byte bodies and 50-byte responses: a succeeded job
// is kept with its response only (SucceededMessage), a dead one with its
// request and its response.
func TestMemoryEstimateCoversAJob(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	const n, body, resp = 2000, 100, 50
	c := shaper.MemoryCosts()
	result, _ := EncodeResponse(&Response{Status: 200, Headers: map[string][]string{"Content-Type": {"application/json"}},
		Body: []byte(strings.Repeat("r", resp))})
	for _, tc := range []struct {
		outcome        jobstore.Outcome
		estimate, kept int64 // per finished job, and the bytes it keeps
	}{
		{jobstore.Succeeded, c.FinishedJob + resp, resp},
		{jobstore.Dead, c.FinishedJob + body + resp, body + resp},
	} {
		rdb.FlushAll(ctx)
		q := newQueue(t, rdb, upstreams(0))
		// One job first, so that the keys every job shares exist already.
		q.Enqueue(ctx, &Job{Tenant: "t", Upstream: "stripe", Path: "/x", Body: []byte(strings.Repeat("b", body))})
		before := redistest.UsedMemory(t, rdb)
		for i := range n {
			_, _, err := q.Enqueue(ctx, &Job{Tenant: "t", Upstream: "stripe", Method: "POST", Path: "/v1/charges/" + strconv.Itoa(i),
				Headers: map[string]string{"Content-Type": "application/json"}, Body: []byte(strings.Repeat("b", body))})
			if err != nil {
				t.Fatal(err)
			}
		}
		queued := float64(redistest.UsedMemory(t, rdb)-before) / n
		finishAll(t, q, rdb, "stripe", func(string) *jobstore.Finished {
			return &jobstore.Finished{Outcome: tc.outcome, Result: result, Retention: time.Hour, ErrMsg: "upstream said 400"}
		})
		finished := float64(redistest.UsedMemory(t, rdb)-before) / n
		t.Logf("per job with a %d-byte body: queued %.0f B (estimate %d); %s with a %d-byte response %.0f B (estimate %d)",
			body, queued, c.QueuedJob+body, tc.outcome, resp, finished, tc.estimate)
		if queued > float64(c.QueuedJob+body) {
			t.Errorf("a queued job costs %.0f B, more than the estimate's %d + its body", queued, c.QueuedJob)
		}
		if finished > float64(tc.estimate) {
			t.Errorf("a %s job costs %.0f B, more than the estimate's %d + the %d bytes it keeps", tc.outcome, finished, c.FinishedJob, tc.kept)
		}
	}
}
