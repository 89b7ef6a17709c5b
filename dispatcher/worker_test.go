package dispatcher

import (
	"bytes"
	"context"
	"runtime"
	"sync"
	"testing"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/fakeupstream"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// goroutineID is the running goroutine's number, from its stack's header.
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	id, _, _ := bytes.Cut(bytes.TrimPrefix(buf, []byte("goroutine ")), []byte(" "))
	return string(id)
}

// A worker goroutine runs the next job handed to it rather than ending
// after one: jobs one after another on one worker run on few goroutines.
func TestWorkersRunJobAfterJob(t *testing.T) {
	h := newHarness(t, fakeupstream.Config{}, shaper.Upstream{Name: "mail"}, 4)
	var mu sync.Mutex
	seen := map[string]int{}
	h.start(Config{Upstreams: []shaper.Upstream{{Name: "mail", Workers: 1, Limits: []leaky.Limit{leaky.PerSecond(1000)}}}},
		map[string]Handler{"mail": func(ctx context.Context, job *queue.Job) (*queue.Response, error) {
			mu.Lock()
			seen[goroutineID()]++
			mu.Unlock()
			return &queue.Response{Status: 200}, nil
		}})
	var ids []string
	for range 10 {
		ids = append(ids, h.enqueue(&queue.Job{Upstream: "mail", Task: "t"}).ID)
	}
	h.waitFor(ids, queue.StateSucceeded)
	mu.Lock()
	defer mu.Unlock()
	if len(seen) >= len(ids) {
		t.Errorf("%d jobs ran on %d goroutines, want fewer (a worker runs job after job): %v", len(ids), len(seen), seen)
	}
}
