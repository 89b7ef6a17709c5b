package dispatcher

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/fakeupstream"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/internal/script"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// TestDispatchOnCluster drains upstreams whose keys live on different
// masters of a real 3-master Redis Cluster: enqueue, the wake-up over
// pub/sub, the take that books upstream and partition slots in one script,
// and the outcome all work there.
func TestDispatchOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-master Redis Cluster takes seconds to start: runs in make test")
	}
	cl := redistest.NewCluster(t)
	rdb := cl.Client(t)
	fake, err := fakeupstream.New(fakeupstream.Config{})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(fake)
	defer hs.Close()
	var ups []shaper.Upstream
	slots := map[uint16]bool{}
	for i := 0; len(slots) < 3 || len(ups) < 4; i++ {
		name := fmt.Sprintf("api%d", i)
		slots[script.Slot("{"+jobstore.QueueName(name)+"}")/5462] = true
		ups = append(ups, shaper.Upstream{Name: name, BaseURL: hs.URL, Limits: []leaky.Limit{leaky.PerSecond(200)},
			PartitionLimits: []leaky.Limit{leaky.PerSecond(20)}, MaxPending: 1000, ResultRetention: time.Hour})
	}
	q, err := queue.New(rdb, queue.Config{Upstreams: ups})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	d, err := New(rdb, Config{Upstreams: ups, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	time.Sleep(200 * time.Millisecond) // subscribed, asleep
	var ids []string
	for _, u := range ups {
		for i := range 10 {
			info, _, err := q.Enqueue(context.Background(), &queue.Job{Upstream: u.Name, Path: "/x",
				Partition: fmt.Sprintf("p{%d}.example", i%3)})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, info.ID)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, id := range ids {
		for {
			info, err := q.Get(context.Background(), id, "")
			if err != nil {
				t.Fatal(err)
			}
			if info.State == queue.StateSucceeded {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %s is %s (%s) on the cluster, want succeeded", id, info.State, info.LastError)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, u := range ups {
		c, err := q.Counts(context.Background(), u.Name)
		if err != nil {
			t.Fatal(err)
		}
		if got := c["default"]; got.Backlog() != 0 || got.Succeeded != 10 {
			t.Errorf("%s counts %+v, want 10 succeeded and no backlog", u.Name, got)
		}
	}
}
