package window

import (
	"context"
	"fmt"
	"testing"

	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

// Every script runs on a real 3-master Redis Cluster, for keys spread over
// all masters, with no CROSSSLOT error: each script touches one key, whose
// hash tag is the caller's key. Denials and Reset work there too, and so do
// Redis's own clock and EVALSHA's fallback to EVAL on each master.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-master Redis Cluster takes seconds to start: runs in make test")
	}
	noLeaks(t)
	cluster := redistest.NewCluster(t)
	rdb := cluster.Client(t)
	ctx := context.Background()
	for _, a := range algorithms() {
		clk := &clock{now: testNow}
		lim, err := a.new(rdb, PerMinute(2), Config{Prefix: uniquePrefix("cluster"), Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		onRedisClock, err := a.new(rdb, PerMinute(2), Config{Prefix: uniquePrefix("cluster-time")})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 12 {
			key := fmt.Sprintf("tenant-%d", i)
			for j, want := range []bool{true, true, false} {
				res, err := lim.Allow(ctx, key, 1)
				if err != nil {
					t.Fatalf("%s: key %s call %d: %v", a.name, key, j, err)
				}
				if res.Allowed != want {
					t.Fatalf("%s: key %s call %d: got %v, want allowed=%v", a.name, key, j, res, want)
				}
			}
			if err := lim.Reset(ctx, key); err != nil {
				t.Fatalf("%s: reset %s: %v", a.name, key, err)
			}
			if res, err := lim.Allow(ctx, key, 2); err != nil || !res.Allowed {
				t.Fatalf("%s: key %s after reset: got %v, %v; want allowed", a.name, key, res, err)
			}
			if _, err := onRedisClock.Allow(ctx, key, 1); err != nil {
				t.Fatalf("%s: key %s on Redis's clock: %v", a.name, key, err)
			}
		}
	}
	// The keys did land on every master, so every master ran the scripts.
	for _, node := range cluster.Nodes {
		c := node.Client(t)
		if n := c.DBSize(ctx).Val(); n == 0 {
			t.Errorf("master %s: got no keys, want some of the limiters'", node.Addr)
		}
	}
}
