package dispatcher

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/fakeupstream"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// TestRepeatAfterTheDropIsNotSent: a worker that keeps one result drops
// a finished job with an idempotency key when the next finishes; a repeat
// of the key then answers the job's id and final state, and the handler
// never sees it again.
func TestRepeatAfterTheDropIsNotSent(t *testing.T) {
	up := shaper.Upstream{Name: "mail", Limits: []leaky.Limit{leaky.PerSecond(100)}, ResultMaxCount: 1}
	h := newHarness(t, fakeupstream.Config{}, up, 1)
	var mu sync.Mutex
	sent := map[string]int{}
	h.start(Config{Upstreams: []shaper.Upstream{up}}, map[string]Handler{"mail": func(ctx context.Context, job *queue.Job) (*queue.Response, error) {
		mu.Lock()
		sent[job.IdempotencyKey]++
		mu.Unlock()
		return &queue.Response{Status: 200}, nil
	}})
	first := h.enqueue(&queue.Job{Tenant: "billing", Upstream: "mail", Task: "welcome", IdempotencyKey: "welcome-42"})
	h.waitFor([]string{first.ID}, queue.StateSucceeded)
	next := h.enqueue(&queue.Job{Upstream: "mail", Task: "other"})
	h.waitFor([]string{next.ID}, queue.StateSucceeded)
	if _, err := h.q.Get(context.Background(), first.ID, "billing"); !errors.Is(err, queue.ErrNoLongerKept) {
		t.Fatalf("the first job after the next finished: got %v, want no longer kept", err)
	}
	info, created, err := h.q.Enqueue(context.Background(), &queue.Job{Tenant: "billing", Upstream: "mail", Task: "welcome", IdempotencyKey: "welcome-42"})
	if err != nil || created || info.ID != first.ID || info.State != queue.StateSucceeded {
		t.Fatalf("repeat: got %+v, created %v, %v; want %s succeeded, not created", info, created, err, first.ID)
	}
	// A job enqueued after the repeat and sent shows the worker had its
	// chance to send anything the repeat might have queued.
	last := h.enqueue(&queue.Job{Upstream: "mail", Task: "last"})
	h.waitFor([]string{last.ID}, queue.StateSucceeded)
	time.Sleep(50 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if sent["welcome-42"] != 1 {
		t.Errorf("sends of welcome-42: got %d, want 1", sent["welcome-42"])
	}
}
