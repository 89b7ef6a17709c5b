package redistest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestServerStartRestart(t *testing.T) {
	s := New(t, Options{AppendOnly: true})
	ctx := context.Background()
	c := s.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if s.Running() {
		t.Fatal("got running after Kill, want stopped")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	got, err := c.Get(ctx, "k").Result()
	if err != nil || got != "v" {
		t.Fatalf("after restart with AOF got %q, %v; want %q", got, err, "v")
	}
}

func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-master Redis Cluster takes seconds to start: runs in make test")
	}
	cl := NewCluster(t)
	if len(cl.Nodes) != 3 {
		t.Fatalf("got %d nodes, want 3", len(cl.Nodes))
	}
	c := cl.Client(t)
	ctx := context.Background()
	// Keys spread over all three masters.
	for i := 0; i < 30; i++ {
		if err := c.Set(ctx, fmt.Sprintf("key%d", i), i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var sizes []int64
	var mu sync.Mutex
	err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		n, err := m.DBSize(ctx).Result()
		mu.Lock()
		sizes = append(sizes, n)
		mu.Unlock()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range sizes {
		if n == 0 {
			t.Fatalf("got key counts per master %v, want keys on every master", sizes)
		}
	}
}

func TestMissingBinaryIsAnError(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := Start(Options{})
	if err == nil || !strings.Contains(err.Error(), "redis-server not found") || !strings.Contains(err.Error(), "apt-get install") {
		t.Fatalf("got %v, want an error naming redis-server and how to install it", err)
	}
	_, err = StartCluster(3)
	if err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("got %v, want an error for the missing binaries", err)
	}
}
