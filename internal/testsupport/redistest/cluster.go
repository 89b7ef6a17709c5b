package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of masters with no replicas, each a real
// redis-server with --cluster-enabled, joined by `redis-cli --cluster create`.
type Cluster struct {
	Nodes []*Server
}

// StartCluster launches n (at least 3) masters and waits until every node
// reports cluster_state:ok.
func StartCluster(n int) (*Cluster, error) {
	if n < 3 {
		return nil, fmt.Errorf("a Redis Cluster needs at least 3 masters, got %d", n)
	}
	if _, err := exec.LookPath("redis-cli"); err != nil {
		return nil, fmt.Errorf("redis-cli not found in PATH: %s", InstallHint)
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("redis-server not found in PATH: %s", InstallHint)
	}
	c := &Cluster{}
	for i := 0; i < n; i++ {
		s, err := startClusterNode()
		if err != nil {
			c.Close()
			return nil, err
		}
		c.Nodes = append(c.Nodes, s)
	}
	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.Command("redis-cli", args...).CombinedOutput()
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("redis-cli --cluster create: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if err := c.waitOK(30 * time.Second); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// NewCluster starts a 3-master cluster for one test and stops it afterwards.
func NewCluster(tb testing.TB) *Cluster {
	tb.Helper()
	c, err := StartCluster(3)
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

func startClusterNode() (*Server, error) {
	dir, err := os.MkdirTemp("", "shaper-redis-cluster-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 10; attempt++ {
		port, err := freePort(true)
		if err != nil {
			return nil, err
		}
		s := &Server{Dir: dir, Port: port, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), cluster: true}
		if lastErr = s.start(); lastErr == nil {
			return s, nil
		}
	}
	os.RemoveAll(dir)
	return nil, lastErr
}

// Addrs lists the masters' host:port addresses.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr
	}
	return addrs
}

// Client returns a cluster client, closed when the test ends.
func (c *Cluster) Client(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	tb.Cleanup(func() { cc.Close() })
	return cc
}

// Close stops every node and removes their directories.
func (c *Cluster) Close() error {
	for _, n := range c.Nodes {
		n.Close()
	}
	return nil
}

func (c *Cluster) waitOK(d time.Duration) error {
	ctx := context.Background()
	deadline := time.Now().Add(d)
	for _, n := range c.Nodes {
		cl := redis.NewClient(&redis.Options{Addr: n.Addr})
		for {
			info, err := cl.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				cl.Close()
				return fmt.Errorf("cluster node %s not ok after %v: %v %s", n.Addr, d, err, firstLine(info))
			}
			time.Sleep(50 * time.Millisecond)
		}
		cl.Close()
	}
	// Every node agrees on the slots; make sure a cluster client sees them too.
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	defer cc.Close()
	for {
		err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			return m.Ping(ctx).Err()
		})
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster client cannot reach every master: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return strings.TrimSpace(s[:i])
	}
	return s
}
