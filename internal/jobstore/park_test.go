package jobstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/shaperhq/shaper/leaky"
)

// A take records the parks of all the flows it parks (pk, which status
// reads) in one write: its ZADDs do not grow with the number of
// partitions it parks, and each park is there.
func TestTakeWritesParksOnce(t *testing.T) {
	ctx := context.Background()
	rdb := srv().Client(t)
	zadds := func(n int) int64 {
		u := fast("parkonce-" + strconv.Itoa(n))
		u.PartitionLimits = []leaky.Limit{leaky.PerSecond(1000)}
		r := newRig(t, rdb, u, 50*time.Millisecond)
		for i := range n {
			p := "p" + strconv.Itoa(i)
			r.add(job{id: p + "a", tenant: "t", partition: p}, job{id: p + "b", tenant: "t", partition: p})
		}
		before := commandCalls(t, "zadd")
		// One job of each partition: the second of each waits 1 ms for
		// its partition, a park.
		if got := r.takeIDs(100); len(got) != n {
			t.Fatalf("%d partitions: took %v, want one job of each", n, got)
		}
		zadd := commandCalls(t, "zadd") - before
		if c := rdb.ZCard(ctx, r.space.ParkedKey()).Val(); c != int64(n) {
			t.Fatalf("%d partitions: %d parks recorded, want %d", n, c, n)
		}
		r.check(strconv.Itoa(n))
		return zadd
	}
	if two, six := zadds(2), zadds(6); two != six {
		t.Fatalf("a take parking 2 partitions ran %d ZADDs, parking 6 ran %d; want as many", two, six)
	}
}
