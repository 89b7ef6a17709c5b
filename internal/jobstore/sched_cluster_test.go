package jobstore_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/leaky"
)

// TestScriptsOnCluster runs every sched script (enqueue, take, requeue,
// cancel, run_now) on a real 3-master Redis Cluster, for upstreams whose
// hash slots are served by different masters, with partition limits, so
// that the take script writes partition TAT keys it builds itself from a
// prefix (not declared in KEYS). A partition named with braces must not
// move them to another slot: the hash tag is the first {...} of the key,
// which is the upstream's.
func TestScriptsOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-master Redis Cluster takes seconds to start")
	}
	ctx := context.Background()
	cl := redistest.NewCluster(t)
	rdb := cl.Client(t)

	// Pick upstreams until every master serves at least one.
	slotOwner := map[int64]string{}
	slots, err := rdb.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	owner := func(slot int64) string {
		for _, s := range slots {
			if int64(s.Start) <= slot && slot <= int64(s.End) {
				return s.Nodes[0].Addr
			}
		}
		t.Fatalf("no master serves slot %d", slot)
		return ""
	}
	var names []string
	masters := map[string]bool{}
	for i := 0; len(masters) < 3 || len(names) < 4; i++ {
		if i > 200 {
			t.Fatalf("200 upstream names and masters covered %v", masters)
		}
		name := fmt.Sprintf("api%d", i)
		slot, err := rdb.ClusterKeySlot(ctx, "{"+jobstore.QueueName(name)+"}").Result()
		if err != nil {
			t.Fatal(err)
		}
		m := owner(slot)
		if masters[m] && len(masters) < 3 {
			continue
		}
		masters[m] = true
		slotOwner[slot] = m
		names = append(names, name)
	}
	t.Logf("upstreams %v over masters %v", names, slotOwner)

	braces := "{b}r}a{ces}.example"
	for i, name := range names {
		u := shaper.Upstream{Name: name, Limits: []leaky.Limit{leaky.PerSecond(100000)},
			PartitionLimits: []leaky.Limit{{Rate: 1, Per: time.Second}}}
		if i%2 == 1 {
			u.Fairness.By = shaper.FairByPartition
		}
		r := newRigNamed(t, rdb, u, 100*time.Millisecond)
		tag := "{" + r.space.Queue + "}"
		wantSlot, err := rdb.ClusterKeySlot(ctx, tag).Result()
		if err != nil {
			t.Fatal(err)
		}
		r.add(job{id: "j1", tenant: "a", partition: braces}, job{id: "j2", tenant: "a", partition: braces},
			job{id: "j3", tenant: "b", partition: "plain.example"}, job{id: "j4", tenant: "b"},
			job{id: "j5", tenant: "c", partition: braces, at: time.Now().Add(time.Hour)})
		r.check("enqueue")
		got := r.takeIDs(10)
		slices.Sort(got)
		if !slices.Equal(got, []string{"j1", "j3", "j4"}) {
			t.Fatalf("%s: took %v, want j1 j3 j4 (j2 waits for its partition, j5 is scheduled)", name, got)
		}
		r.check("take")
		// What holds the waiting jobs, read in the upstream's slot: j2's
		// partition is parked for its limit.
		h, err := r.space.ReadHolds(ctx, rdb, r.bucket.Layout().Block)
		if err != nil || h.Parked["default"] != 1 {
			t.Fatalf("%s: holds: parked %v, %v; want j2 parked", name, h.Parked, err)
		}
		jh, err := r.space.ReadJobHold(ctx, rdb, r.bucket.Layout().Block, "j2")
		if err != nil || jh.ParkedUntil.IsZero() || jh.State != "aggregating" {
			t.Fatalf("%s: j2's hold: %+v, %v; want parked", name, jh, err)
		}
		for _, p := range []string{braces, "plain.example"} {
			key := r.bucket.Layout().PartitionPrefix + p + ":" + leaky.LimitID(u.PartitionLimits[0])
			slot, err := rdb.ClusterKeySlot(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			if slot != wantSlot {
				t.Errorf("%s: partition TAT key %s is in slot %d, the upstream's is %d", name, key, slot, wantSlot)
			}
			if !r.exists(key) {
				t.Errorf("%s: partition TAT key %s was not written", name, key)
			}
		}
		if n, err := r.space.Requeue(ctx, rdb, r.bucket.Layout().Leases, "j3"); err != nil || n != 1 {
			t.Fatalf("%s: requeue: %d, %v", name, n, err)
		}
		r.check("requeue")
		if err := r.space.Cancel(ctx, rdb, "j2"); err != nil {
			t.Fatalf("%s: cancel: %v", name, err)
		}
		if err := r.space.Cancel(ctx, rdb, "j5"); err != nil {
			t.Fatalf("%s: cancel of a scheduled job: %v", name, err)
		}
		r.check("cancel")
		// j3's partition booked a slot for it a moment ago; it goes again
		// within a second.
		deadline := time.Now().Add(2 * time.Second)
		for got = nil; !slices.Equal(got, []string{"j3"}); {
			if time.Now().After(deadline) || len(got) > 1 {
				t.Fatalf("%s: took %v, want the requeued j3 within 2s", name, got)
			}
			got = append(got, r.takeIDs(10)...)
			time.Sleep(20 * time.Millisecond)
		}
		r.check("take after requeue")
		r.finish(jobstore.Retry, time.Now().Add(time.Hour), "j1", "j4")
		r.check("retry")
		if n, err := r.space.RunNow(ctx, rdb, "j1", "j4"); err != nil || n != 2 {
			t.Fatalf("%s: run now: %d, %v", name, n, err)
		}
		r.check("run now")
		got = nil
		deadline = time.Now().Add(3 * time.Second)
		for len(got) < 2 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: took %v of j1 j4 after run now within 3s", name, got)
			}
			got = append(got, r.takeIDs(10)...)
			time.Sleep(20 * time.Millisecond)
		}
		r.finish(jobstore.Succeeded, time.Time{}, "j1", "j3", "j4")
		r.check("finish")
		// Empty takes clean up as they meet what cancel left (a calendar
		// entry for j2's partition, due within a second); then nothing of
		// the ready structure is left.
		for {
			tk := r.take(10)
			if len(tk.Jobs) != 0 {
				t.Fatalf("%s: took %v with nothing waiting", name, ids(tk))
			}
			if tk.Next <= 0 {
				break
			}
			if tk.Next > 2*time.Second {
				t.Fatalf("%s: next %v with nothing waiting", name, tk.Next)
			}
			time.Sleep(tk.Next)
		}
		for _, k := range []string{r.space.FairKeysKey(), r.space.CalendarKey(), r.store.Groups(), r.space.BacklogKey(), r.space.ParkedKey()} {
			if r.exists(k) {
				t.Errorf("%s: %s left with nothing waiting", name, k)
			}
		}
	}
	// The upstreams' keys really are on different masters.
	used := map[string]bool{}
	for _, n := range cl.Nodes {
		c := redis.NewClient(&redis.Options{Addr: n.Addr})
		keys, err := c.Keys(ctx, "*{shaper.api*").Result()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) > 0 {
			used[n.Addr] = true
		}
	}
	if len(used) != 3 {
		t.Errorf("keys on masters %v, want all 3", used)
	}
}
