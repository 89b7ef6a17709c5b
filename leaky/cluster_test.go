package leaky

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

// TestScriptsOnCluster runs every script on a real 3-master Redis Cluster,
// over buckets whose keys land on different masters.
func TestScriptsOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-master Redis Cluster takes seconds to start: runs in make test")
	}
	cl := redistest.NewCluster(t)
	rdb := cl.Client(t)
	ctx := context.Background()
	p := New(rdb, Config{})
	for i := 0; i < 6; i++ {
		b, err := p.Bucket(fmt.Sprintf("upstream-%d", i), BucketConfig{
			Limits:      []Limit{{Rate: 100, Per: time.Second, Adaptive: true}, {Rate: 1000, Per: time.Minute, Cost: "tokens"}},
			Concurrency: 2,
		})
		if err != nil {
			t.Fatal(err)
		}
		r, err := b.Reserve(ctx, Costs{"tokens": 5})
		if err != nil || !r.OK {
			t.Fatalf("reserve on %s: %+v, %v", b.Name(), r, err)
		}
		if _, err := b.Cancel(ctx, r); err != nil {
			t.Fatalf("cancel: %v", err)
		}
		r, err = b.Take(ctx, Costs{"tokens": 5})
		if err != nil {
			t.Fatalf("take: %v", err)
		}
		if _, err := b.ExtendLease(ctx, r.Lease, time.Second); err != nil {
			t.Fatalf("extend: %v", err)
		}
		if err := b.Release(ctx, r); err != nil {
			t.Fatalf("release: %v", err)
		}
		if _, err := b.Block(ctx, time.Second, "test"); err != nil {
			t.Fatalf("block: %v", err)
		}
		if _, err := b.State(ctx); err != nil {
			t.Fatalf("state: %v", err)
		}
		if err := b.Unblock(ctx); err != nil {
			t.Fatalf("unblock: %v", err)
		}
		// The dynamic limits: stated, adaptive, settled, bare pushback.
		if _, err := b.Learn(ctx, []Limit{PerSecond(40)}); err != nil {
			t.Fatalf("learn: %v", err)
		}
		if _, err := b.Feedback(ctx, true); err != nil {
			t.Fatalf("feedback: %v", err)
		}
		if r, err := b.Reserve(ctx, Costs{"tokens": 5}); err != nil || !r.OK {
			t.Fatalf("reserve under stated and adaptive limits: %+v, %v", r, err)
		}
		if err := b.Settle(ctx, "tokens", 5, 1, "acme.example", []Limit{{Rate: 100, Per: time.Second, Cost: "tokens"}}); err != nil {
			t.Fatalf("settle: %v", err)
		}
		if _, _, _, err := b.Pushback(ctx, time.Millisecond, time.Second, 0, "429", time.Time{}); err != nil {
			t.Fatalf("pushback: %v", err)
		}
		if st, err := b.State(ctx); err != nil || len(st.Limits) != 3 {
			t.Fatalf("state with a stated limit: %+v, %v", st.Limits, err)
		}
	}
	// The buckets really were spread over the masters.
	var spread []int64
	for _, n := range cl.Nodes {
		c := n.Client(t)
		keys, err := c.Keys(ctx, "shaper:leaky:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		spread = append(spread, int64(len(keys)))
		for _, k := range keys {
			if !strings.Contains(k, "{upstream-") {
				t.Fatalf("key %s lacks the bucket's hash tag", k)
			}
		}
	}
	empty := 0
	for _, n := range spread {
		if n == 0 {
			empty++
		}
	}
	if empty > 1 {
		t.Fatalf("keys per master %v: want buckets on at least two masters", spread)
	}
}
