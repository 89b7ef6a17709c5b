package jobstore_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/leaky"
)

// domains makes n distinct domain-like partition names of 15 to 30 bytes.
func domains(n int) []string {
	words := []string{"northwind", "contoso", "fabrikam", "adventure-works", "tailspin", "wingtip", "litware", "proseware"}
	tlds := []string{"com", "co.uk", "de", "io", "example.org", "net"}
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d.%s", words[i%len(words)], i, tlds[i/len(words)%len(tlds)])
		for len(out[i]) < 15 {
			out[i] = "mx." + out[i]
		}
	}
	return out
}

// usedMemory reads INFO memory's used_memory once it has settled: Redis
// shrinks its dictionaries from a timer after mass deletes.
func usedMemory(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	read := func() int64 { return redistest.UsedMemory(t, rdb) }
	last := read()
	for range 30 {
		time.Sleep(200 * time.Millisecond)
		n := read()
		if d := n - last; d > -1024 && d < 1024 {
			return n
		}
		last = n
	}
	return last
}

// TestIdlePartitionsExpire enqueues one job for each of 100,000 partitions
// on an upstream with partition limits, takes and finishes them all, and
// then requires that every key left expires (but the upstream's few fixed
// keys) and that an idle partition costs at most 300 bytes of Redis
// memory until its state expires. The figure goes in BENCHMARKS.md.
func TestIdlePartitionsExpire(t *testing.T) {
	if testing.Short() {
		t.Skip("100,000 partitions take tens of seconds")
	}
	const n = 100_000
	parts := domains(n)
	for _, by := range []string{shaper.FairByTenant, shaper.FairByPartition} {
		t.Run("fair by "+by, func(t *testing.T) {
			ctx := context.Background()
			s := redistest.New(t)
			rdb := s.Client(t)
			u := shaper.Upstream{Name: "mail", Limits: []leaky.Limit{leaky.PerSecond(100000)},
				PartitionLimits: []leaky.Limit{leaky.PerMinute(100)}, Fairness: shaper.Fairness{By: by}}
			r := newRigNamed(t, rdb, u, 250*time.Millisecond)
			before := usedMemory(t, rdb)
			start := time.Now()

			// One plain call loads the script; pipelines of EVALSHA do the rest.
			tenants := []string{"acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "tyrell"}
			entry := func(i int) job {
				return job{id: fmt.Sprintf("m%06d", i), tenant: tenants[i%len(tenants)], partition: parts[i]}
			}
			r.add(entry(0))
			r.ids = nil // Check reads every job; at this size the test counts instead
			for lo := 1; lo < n; lo += 1000 {
				pipe := rdb.Pipeline()
				for i := lo; i < min(lo+1000, n); i++ {
					if _, err := r.space.Enqueue(ctx, pipe, r.entry(entry(i))); err != nil {
						t.Fatal(err)
					}
				}
				cmds, err := pipe.Exec(ctx)
				if err != nil {
					t.Fatalf("enqueue pipeline: %v", err)
				}
				for _, c := range cmds {
					if v, _ := c.(*redis.Cmd).Int64(); v != 1 {
						t.Fatalf("enqueue: %v, want 1 (stored ready)", c)
					}
				}
			}
			enqueued := time.Since(start)

			seen := make([]bool, n)
			taken, takes := 0, 0
			for {
				tk := r.take(64)
				takes++
				if len(tk.Jobs) > 0 {
					var items []jobstore.Finished
					for _, j := range tk.Jobs {
						i, err := strconv.Atoi(j.ID[1:])
						if err != nil || seen[i] {
							t.Fatalf("took %s (seen before: %v)", j.ID, err == nil)
						}
						seen[i] = true
						msg, err := jobstore.Unmarshal(j.Msg)
						if err != nil {
							t.Fatal(err)
						}
						items = append(items, jobstore.Finished{ID: j.ID, Lane: shaper.DefaultLane, Partition: parts[i],
							Msg: msg, Outcome: jobstore.Succeeded})
					}
					errs, err := jobstore.Finish(ctx, rdb, r.store, r.space.CountsKey(), r.space.BacklogKey(), items)
					if err != nil {
						t.Fatal(err)
					}
					for i, e := range errs {
						if e != nil {
							t.Fatalf("finish %s: %v", items[i].ID, e)
						}
					}
					taken += len(tk.Jobs)
					continue
				}
				if tk.Wait > 0 {
					time.Sleep(tk.Wait)
					continue
				}
				// As the dispatcher does: a take that says to come back at
				// once is followed by another; anything else means idle.
				if tk.Next > 0 && tk.Next <= time.Millisecond {
					continue
				}
				break
			}
			if taken != n {
				t.Fatalf("took %d jobs, want %d", taken, n)
			}
			drained := time.Since(start) - enqueued
			after := usedMemory(t, rdb)
			per := float64(after-before) / n
			t.Logf("BENCHMARK idle partition memory (fair by %s): %.0f B per partition: used_memory %d before enqueue, %d after %d partitions each took and finished one job (partition_limits 100/1m); enqueue %v, %d takes + finishes %v",
				by, per, before, after, n, enqueued.Round(time.Millisecond), takes, drained.Round(time.Millisecond))

			// Every key left expires, but the upstream's fixed keys:
			//   P:s:{Q}:v         virtual time, FIFO sequence, sleep flag: the
			//                     sequence must never restart while jobs wait,
			//                     and it is one small hash per upstream;
			//   asynq:{Q}:processed  asynq's all-time processed count, which
			//                     asynq's own server keeps forever too.
			fixed := []string{r.space.VKey(), r.store.ProcessedTotal()}
			var noTTL []string
			kinds := map[string]int{}
			var cursor uint64
			total := 0
			for {
				keys, next, err := rdb.Scan(ctx, cursor, "*", 1000).Result()
				if err != nil {
					t.Fatal(err)
				}
				pipe := rdb.Pipeline()
				ttls := make([]*redis.DurationCmd, len(keys))
				for i, k := range keys {
					ttls[i] = pipe.PTTL(ctx, k)
				}
				if _, err := pipe.Exec(ctx); err != nil {
					t.Fatal(err)
				}
				for i, k := range keys {
					total++
					switch d := ttls[i].Val(); {
					case d == -1 && !slices.Contains(fixed, k):
						noTTL = append(noTTL, k)
					case d > 0 && strings.HasPrefix(k, r.bucket.Layout().PartitionPrefix):
						kinds["partition TAT"]++
						if d > 2*time.Minute {
							t.Errorf("%s expires in %v, want within its window (1m) and level", k, d)
						}
					case d > 0:
						kinds[k]++
					}
				}
				if cursor = next; cursor == 0 {
					break
				}
			}
			var sizes []string
			for _, k := range fixed {
				sizes = append(sizes, fmt.Sprintf("%s %d B", k, rdb.MemoryUsage(ctx, k).Val()))
			}
			t.Logf("keys left: %d: %v (with a TTL), fixed: %v", total, kinds, sizes)
			if len(noTTL) > 0 {
				slices.Sort(noTTL)
				t.Errorf("%d keys without a TTL after every partition went idle, e.g. %v", len(noTTL), noTTL[:min(10, len(noTTL))])
			}
			if kinds["partition TAT"] != n {
				t.Errorf("%d partition TAT keys, want %d (one per partition until it expires)", kinds["partition TAT"], n)
			}
			if per > 300 {
				t.Errorf("an idle partition costs %.0f B of Redis memory, want at most 300", per)
			}
			if c := r.counts(); len(c) != 0 {
				t.Errorf("counts %v with every job finished", c)
			}
		})
	}
}
