package jobstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/shaperhq/shaper/internal/jobstore"
)

// TestEnqueueInOrderAfterAScriptFlush: a batch keeps its order in its flow
// when Redis has lost its script cache (a restart, a failover) while other
// connections load the script again during the batch's pipeline: an
// EVALSHA answered NOSCRIPT and sent again after the rest would put part of
// the batch behind later jobs (script.RunInOrder sends the first by EVAL).
func TestEnqueueInOrderAfterAScriptFlush(t *testing.T) {
	ctx := context.Background()
	rdb := srv().Client(t)
	loader := rdb // its pool's other connections, as another replica's would
	for round := range 5 {
		rdb.FlushAll(ctx)
		s := jobstore.For("", fmt.Sprintf("up%d", round))
		other := jobstore.For("", fmt.Sprintf("other%d", round))
		rdb.ScriptFlush(ctx)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				m := &jobstore.Message{Type: "t", ID: fmt.Sprintf("o%d", i), Queue: other.Queue}
				if _, err := other.Enqueue(ctx, loader, jobstore.Entry{ID: m.ID, Lane: "default", Msg: m.Marshal()}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
		var calls []jobstore.EnqueueCall
		for i := range 2000 {
			m := &jobstore.Message{Type: "t", ID: fmt.Sprintf("j%04d", i), Queue: s.Queue}
			calls = append(calls, jobstore.EnqueueCall{Space: s, Entry: jobstore.Entry{ID: m.ID, Lane: "default", Msg: m.Marshal()}})
		}
		rs, errs := jobstore.EnqueueInOrder(ctx, rdb, calls)
		close(stop)
		wg.Wait()
		for i, err := range errs {
			if err != nil || !rs[i].Created {
				t.Fatalf("round %d, job %d: created %v, %v", round, i, rs[i].Created, err)
			}
		}
		ids, err := rdb.ZRange(ctx, s.GroupKey("default", "", ""), 0, -1).Result()
		if err != nil || len(ids) != len(calls) {
			t.Fatalf("round %d: flow holds %d jobs, %v; want %d", round, len(ids), err, len(calls))
		}
		for i, id := range ids {
			if want := fmt.Sprintf("j%04d", i); id != want {
				t.Fatalf("round %d: place %d holds %s, want %s", round, i, id, want)
			}
		}
	}
}
