package jobstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/leaky"
)

// srv is the Redis server the package's internal tests start (TestMain).
func srv() *redistest.Server { return jobstore.RedisServer() }

type fixture struct {
	t      *testing.T
	rdb    *redis.Client
	space  jobstore.Space
	taker  *jobstore.Taker
	bucket *leaky.Bucket
	u      shaper.Upstream
}

func newFixture(t *testing.T, u shaper.Upstream) *fixture {
	t.Helper()
	rdb := srv().Client(t)
	prefix := fmt.Sprintf("t%d", time.Now().UnixNano())
	u = u.WithDefaults()
	b, err := leaky.New(rdb, leaky.Config{Prefix: prefix}).Bucket(jobstore.QueueName(u.Name), leaky.BucketConfig{
		Limits: u.Limits, Guard: u.Guard, Concurrency: u.Concurrency})
	if err != nil {
		t.Fatal(err)
	}
	s := jobstore.For(prefix, u.Name+prefix)
	tk, err := jobstore.NewTaker(rdb, s, jobstore.TakerConfig{Upstream: u, Bucket: b, Lookahead: 100 * time.Millisecond,
		Lease: 30 * time.Second, ConcurrencyLease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, rdb: rdb, space: s, taker: tk, bucket: b, u: u}
}

func (f *fixture) enqueue(id, lane, tenant, partition string) {
	f.t.Helper()
	ok, err := f.space.Enqueue(context.Background(), f.rdb, jobstore.Entry{ID: id, Lane: lane,
		FairKey: jobstore.FairKey(f.u, tenant, partition), Partition: partition, Msg: []byte("m-" + id)})
	if err != nil || !ok {
		f.t.Fatalf("enqueue %s: created %v, err %v", id, ok, err)
	}
}

func (f *fixture) take(n int) jobstore.Take {
	f.t.Helper()
	tk, err := f.taker.Take(context.Background(), n)
	if err != nil {
		f.t.Fatal(err)
	}
	return tk
}

func ids(tk jobstore.Take) []string {
	var out []string
	for _, j := range tk.Jobs {
		out = append(out, j.ID)
	}
	return out
}

func fast(name string) shaper.Upstream {
	return shaper.Upstream{Name: name, Limits: []leaky.Limit{leaky.PerSecond(100000)}}
}

func TestTakeIsFIFOAndCounts(t *testing.T) {
	f := newFixture(t, fast("fifo"))
	for i := range 3 {
		f.enqueue(fmt.Sprintf("j%d", i), "default", "a", "")
	}
	if created, err := f.space.Enqueue(context.Background(), f.rdb, jobstore.Entry{ID: "j0", Lane: "default", Msg: []byte("x")}); err != nil || created {
		t.Fatalf("repeat enqueue: created %v, err %v; want false, nil", created, err)
	}
	tk := f.take(10)
	if got := fmt.Sprint(ids(tk)); got != "[j0 j1 j2]" {
		t.Fatalf("took %s, want [j0 j1 j2]", got)
	}
	if string(tk.Jobs[0].Msg) != "m-j0" {
		t.Errorf("msg %q, want m-j0", tk.Jobs[0].Msg)
	}
	c, err := f.space.ReadCounts(context.Background(), f.rdb)
	if err != nil {
		t.Fatal(err)
	}
	if c["default"]["active"] != 3 || c["default"]["pending"] != 0 {
		t.Errorf("counts %v, want 3 active, 0 pending", c)
	}
	if tk2 := f.take(10); len(tk2.Jobs) != 0 || tk2.Wait > 0 {
		t.Errorf("second take %v, want nothing and no wait", tk2)
	}
	if v, _ := f.rdb.HGet(context.Background(), f.space.CountsKey()[:len(f.space.CountsKey())-1]+"v", "sleep").Result(); v != "1" {
		t.Errorf("sleep flag %q after an empty take, want 1", v)
	}
	// A requeued job goes back to the head of its flow.
	if n, err := f.space.Requeue(context.Background(), f.rdb, f.bucket.Layout().Leases, "j1"); err != nil || n != 1 {
		t.Fatalf("requeue: %d, %v", n, err)
	}
	f.enqueue("j3", "default", "a", "")
	if got := fmt.Sprint(ids(f.take(10))); got != "[j1 j3]" {
		t.Errorf("after requeue took %s, want [j1 j3]", got)
	}
}

func TestSaturatedPartitionParksWithoutBlocking(t *testing.T) {
	u := fast("part")
	u.PartitionLimits = []leaky.Limit{{Rate: 1, Per: 10 * time.Second}}
	f := newFixture(t, u)
	for i := range 5 {
		f.enqueue(fmt.Sprintf("a%d", i), "default", "t", "slow.example")
	}
	for _, p := range []string{"b", "c", "d"} {
		f.enqueue(p+"0", "default", "t", p+".example")
	}
	got := ids(f.take(10))
	if fmt.Sprint(got) != "[a0 b0 c0 d0]" {
		t.Fatalf("took %v, want [a0 b0 c0 d0]: one of the saturated partition, then the others", got)
	}
	tk := f.take(10)
	if len(tk.Jobs) != 0 {
		t.Fatalf("took %v while the partition is saturated", ids(tk))
	}
	if tk.Next < 9*time.Second || tk.Next > 11*time.Second {
		t.Errorf("next %v, want the parked partition's next slot (~10s)", tk.Next)
	}
}

func TestFairShareBetweenTenants(t *testing.T) {
	for _, tc := range []struct {
		weights map[string]int
		wantB   int // of the first 8 taken
	}{
		{nil, 4},
		{map[string]int{"b": 3}, 6},
	} {
		u := fast("fair")
		u.Fairness.Weights = tc.weights
		f := newFixture(t, u)
		for i := range 100 {
			f.enqueue(fmt.Sprintf("a%03d", i), "default", "a", "")
		}
		for i := range 20 {
			f.enqueue(fmt.Sprintf("b%03d", i), "default", "b", "")
		}
		b := 0
		for range 8 {
			tk := f.take(1)
			if len(tk.Jobs) != 1 {
				t.Fatalf("took %d", len(tk.Jobs))
			}
			if tk.Jobs[0].ID[0] == 'b' {
				b++
			}
		}
		if b != tc.wantB {
			t.Errorf("weights %v: b got %d of the first 8 sends, want %d", tc.weights, b, tc.wantB)
		}
	}
}

func TestScheduledJobComesDue(t *testing.T) {
	f := newFixture(t, fast("sched"))
	ok, err := f.space.Enqueue(context.Background(), f.rdb, jobstore.Entry{ID: "s1", Lane: "default", Msg: []byte("x"),
		ProcessAt: time.Now().Add(300 * time.Millisecond)})
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	tk := f.take(10)
	if len(tk.Jobs) != 0 || tk.Next <= 0 || tk.Next > 300*time.Millisecond {
		t.Fatalf("take %+v, want nothing yet and next within 300ms", tk)
	}
	time.Sleep(tk.Next)
	if got := ids(f.take(10)); fmt.Sprint(got) != "[s1]" {
		t.Errorf("after the wait took %v, want [s1]", got)
	}
}

func TestCancelWaitingJob(t *testing.T) {
	f := newFixture(t, fast("cancel"))
	f.enqueue("c1", "default", "a", "p1")
	f.enqueue("c2", "default", "a", "p1")
	ctx := context.Background()
	if err := f.space.Cancel(ctx, f.rdb, "c1"); err != nil {
		t.Fatal(err)
	}
	if got := ids(f.take(10)); fmt.Sprint(got) != "[c2]" {
		t.Errorf("took %v, want [c2]", got)
	}
	if err := f.space.Cancel(ctx, f.rdb, "c2"); err == nil {
		t.Errorf("cancel of an active job succeeded")
	}
	if err := f.space.Cancel(ctx, f.rdb, "nope"); err != redis.Nil {
		t.Errorf("cancel of a missing job: %v, want redis.Nil", err)
	}
	n, top, err := f.space.Partitions(ctx, f.rdb, 10)
	if err != nil || n != 1 || len(top) != 1 || top[0].Backlog != 1 {
		t.Errorf("partitions %d %v %v, want p1 with 1 (the active one)", n, top, err)
	}
}
