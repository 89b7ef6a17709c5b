package config

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

func TestRedisOptions(t *testing.T) {
	cases := []struct {
		name, yaml, override string
		check                func(t *testing.T, o *redis.UniversalOptions)
	}{
		{"default", "", "", func(t *testing.T, o *redis.UniversalOptions) {
			expectSlice(t, "addrs", o.Addrs, []string{"127.0.0.1:6379"})
			expect(t, "cluster mode", o.IsClusterMode, false)
		}},
		{"url with options", "redis: {url: 'rediss://u:p@r.example:6380/2?dial_timeout=3s&pool_size=7'}", "", func(t *testing.T, o *redis.UniversalOptions) {
			expectSlice(t, "addrs", o.Addrs, []string{"r.example:6380"})
			expect(t, "db", o.DB, 2)
			expect(t, "user", o.Username+":"+o.Password, "u:p")
			expect(t, "dial timeout", o.DialTimeout, 3*time.Second)
			expect(t, "pool size", o.PoolSize, 7)
			expect(t, "tls server name", o.TLSConfig != nil && o.TLSConfig.ServerName == "r.example", true)
		}},
		{"url without credentials takes password", "redis: {url: 'redis://r.example:6379/0', password: 'p@ss/word'}", "", func(t *testing.T, o *redis.UniversalOptions) {
			expect(t, "password", o.Password, "p@ss/word")
		}},
		{"cluster of one seed", "redis: {cluster: ['c1:7000'], password: pw, tls: true}", "", func(t *testing.T, o *redis.UniversalOptions) {
			expectSlice(t, "addrs", o.Addrs, []string{"c1:7000"})
			expect(t, "cluster mode", o.IsClusterMode, true)
			expect(t, "password", o.Password, "pw")
			expect(t, "tls", o.TLSConfig != nil, true)
		}},
		{"sentinel", "redis: {sentinel: {master: mm, addrs: ['s1:26379'], password: sp}, password: dp, db: 4}", "", func(t *testing.T, o *redis.UniversalOptions) {
			expect(t, "master", o.MasterName, "mm")
			expectSlice(t, "addrs", o.Addrs, []string{"s1:26379"})
			expect(t, "sentinel password", o.SentinelPassword, "sp")
			expect(t, "password", o.Password, "dp")
			expect(t, "db", o.DB, 4)
		}},
		{"override replaces cluster", "redis: {cluster: ['c1:7000', 'c2:7000'], password: pw}", "redis://o.example:6390/5", func(t *testing.T, o *redis.UniversalOptions) {
			expectSlice(t, "addrs", o.Addrs, []string{"o.example:6390"})
			expect(t, "cluster mode", o.IsClusterMode, false)
			expect(t, "db", o.DB, 5)
			expect(t, "password", o.Password, "")
		}},
		{"unix socket", "redis: {url: 'unix:///run/redis.sock?db=3'}", "", func(t *testing.T, o *redis.UniversalOptions) {
			expectSlice(t, "addrs", o.Addrs, []string{"/run/redis.sock"})
			expect(t, "db", o.DB, 3)
			expect(t, "dialer", o.Dialer != nil, true)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := mustParse(t, tc.yaml+oneUpstream, nil)
			o, err := c.Redis.Options(tc.override)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, o)
		})
	}

	c := mustParse(t, oneUpstream, nil)
	for _, bad := range []string{"http://h:1", "redis://:secret@h:notaport", "redis://h:6379/x"} {
		_, err := c.Redis.Options(bad)
		if err == nil || !strings.HasPrefix(err.Error(), "redis URL override: ") {
			t.Errorf("override %q: got %v, want an error", bad, err)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("override error shows the password: %v", err)
		}
	}
}

func expect[T comparable](t *testing.T, what string, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("%s: got %v, want %v", what, got, want)
	}
}

func expectSlice(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("%s: got %v, want %v", what, got, want)
	}
}

// roundTrip writes keys in many hash slots, which only a client of the
// right kind for the deployment can do.
func roundTrip(t *testing.T, rdb redis.UniversalClient) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 20 {
		key := fmt.Sprintf("config-test-%d", i)
		if err := rdb.Set(ctx, key, i, time.Minute).Err(); err != nil {
			t.Fatalf("SET %s: %v", key, err)
		}
		if got, err := rdb.Get(ctx, key).Int(); err != nil || got != i {
			t.Fatalf("GET %s: got %d, %v; want %d", key, got, err, i)
		}
	}
}

func newClient(t *testing.T, c *Config, override string) redis.UniversalClient {
	t.Helper()
	rdb, err := c.Redis.NewClient(override)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// srv is the Redis shared by tests that only need one to talk to.
var srv *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &srv) }

func TestRedisClientSingle(t *testing.T) {
	c := mustParse(t, "redis: {url: '"+srv.URL()+"'}"+oneUpstream, nil)
	rdb := newClient(t, c, "")
	if _, ok := rdb.(*redis.Client); !ok {
		t.Errorf("got %T, want *redis.Client", rdb)
	}
	roundTrip(t, rdb)

	// The override wins over a config that points elsewhere.
	elsewhere := mustParse(t, "redis: {cluster: ['127.0.0.1:1']}"+oneUpstream, nil)
	roundTrip(t, newClient(t, elsewhere, srv.URL()))
}

func TestRedisClientUnixSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "redis.sock")
	redistest.New(t, redistest.Options{Args: []string{"--unixsocket", sock, "--unixsocketperm", "700"}})
	c := mustParse(t, "redis: {url: 'unix://"+sock+"'}"+oneUpstream, nil)
	roundTrip(t, newClient(t, c, ""))
}

func TestRedisClientCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-master Redis Cluster takes seconds to start: runs in make test")
	}
	cl := redistest.NewCluster(t)
	// One seed is enough: the client discovers the other masters.
	c := mustParse(t, "redis: {cluster: ['"+cl.Addrs()[0]+"']}"+oneUpstream, nil)
	rdb := newClient(t, c, "")
	if _, ok := rdb.(*redis.ClusterClient); !ok {
		t.Errorf("got %T, want *redis.ClusterClient", rdb)
	}
	roundTrip(t, rdb)
}

func TestRedisClientSentinel(t *testing.T) {
	primary := redistest.New(t)
	addr := startSentinel(t, "shaper-primary", primary.Port)
	c := mustParse(t, "redis: {sentinel: {master: shaper-primary, addrs: ['"+addr+"']}}"+oneUpstream, nil)
	rdb := newClient(t, c, "")
	roundTrip(t, rdb)
	ctx := context.Background()
	if got, err := primary.Client(t).Get(ctx, "config-test-3").Result(); err != nil || got != "3" {
		t.Errorf("primary has config-test-3 = %q, %v; want 3", got, err)
	}
}

// startSentinel runs a Redis Sentinel watching the primary on 127.0.0.1.
func startSentinel(t *testing.T, master string, primaryPort int) string {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server not found: %s", redistest.InstallHint)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s 127.0.0.1 %d 1\n", port, dir, master, primaryPort)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("redis-server", conf, "--sentinel")
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	sc := redis.NewSentinelClient(&redis.Options{Addr: addr})
	defer sc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := sc.GetMasterAddrByName(ctx, master).Result()
		cancel()
		if err == nil {
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("sentinel on %s did not come up: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestFailFast(t *testing.T) {
	for _, tc := range []struct {
		url         string
		dial        time.Duration
		maxRetries  int
		readTimeout time.Duration
	}{
		{"redis://127.0.0.1:6379/0", 250 * time.Millisecond, 1, time.Second},
		// What a URL sets itself is kept.
		{"redis://127.0.0.1:6379/0?dial_timeout=2s&max_retries=5&read_timeout=3s", 2 * time.Second, 5, 3 * time.Second},
	} {
		r := Redis{URL: tc.url}
		o, err := r.Options("")
		if err != nil {
			t.Fatal(err)
		}
		FailFast(o)
		if o.DialTimeout != tc.dial || o.MaxRetries != tc.maxRetries || o.ReadTimeout != tc.readTimeout ||
			o.DialerRetries != 1 || o.PoolTimeout != 250*time.Millisecond || !o.ContextTimeoutEnabled {
			t.Errorf("%s: got dial %v, retries %d, read %v, dialer retries %d, pool %v, ctx %v; want dial %v, retries %d, read %v, 1, 250ms, true",
				tc.url, o.DialTimeout, o.MaxRetries, o.ReadTimeout, o.DialerRetries, o.PoolTimeout, o.ContextTimeoutEnabled, tc.dial, tc.maxRetries, tc.readTimeout)
		}
	}
}
