package schedule

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

// On Redis Cluster every schedule key shares one slot: the scripts and
// the reads work as on one server.
func TestOnRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	rdb := redistest.NewCluster(t).Client(t)
	start := time.Unix(1_800_000_000, 0).UTC()
	clk := newClock(start)
	st := NewStore(rdb, Config{Now: clk.now})
	ctx := context.Background()
	for _, name := range []string{"a", "b"} {
		if _, err := st.Create(ctx, &Schedule{Name: name, Tenant: "acme", Cron: "@every 1m", Job: []byte(`{"upstream":"u"}`)}); err != nil {
			t.Fatal(err)
		}
	}
	l := newLedger()
	rn := NewRunner(st, l, RunnerConfig{})
	clk.add(time.Minute)
	rn.Pass(ctx)
	if got, want := l.sortedKeys(), keysOf("a", start.Add(time.Minute)); !slices.Contains(got, want[0]) || len(got) != 2 {
		t.Errorf("got runs %v, want one each of a and b", got)
	}
	if _, err := st.Pause(ctx, "acme", "a"); err != nil {
		t.Fatal(err)
	}
	vs, err := st.List(ctx, "acme")
	if err != nil || len(vs) != 2 || !vs[0].Paused || vs[1].LastJobID == "" {
		t.Fatalf("list: got %+v, %v", vs, err)
	}
	if err := st.Sync(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := st.Delete(ctx, "acme", "b"); err != nil {
		t.Fatal(err)
	}
}
