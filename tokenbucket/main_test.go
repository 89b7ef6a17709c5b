package tokenbucket

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

var srv *redistest.Server

// childEnv, when set, turns the test binary into one of the separate
// processes of the burst test instead of running tests.
const childEnv = "SHAPER_TOKENBUCKET_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(burstChild())
	}
	redistest.Main(m, &srv)
}

// RedisAddr lets the external examples reach the test server.
func RedisAddr() string { return srv.Addr }

// noLeaks fails the test if it leaves goroutines behind. It must be called
// first so that its cleanup runs after every other (clients closing).
func noLeaks(t *testing.T) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
}

// clientFor is a client that gives up at once when Redis is gone, so that
// tests of the failure policy do not wait through retries.
func clientFor(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, DialerRetries: 1})
	t.Cleanup(func() { c.Close() })
	return c
}

// fakeClock is a settable clock for Config.Now and NewLocal.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.UnixMicro(1_800_000_000_000_000)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// burstChild is one process of TestBurstAcrossProcesses: it connects, says
// "ready", waits for "go" on stdin, fires its callers all at once and
// prints how many were allowed.
func burstChild() int {
	get := func(name string) int64 {
		n, err := strconv.ParseInt(os.Getenv(childEnv+"_"+name), 10, 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "child: %s: %v\n", name, err)
			os.Exit(2)
		}
		return n
	}
	addr := os.Getenv(childEnv)
	key := os.Getenv(childEnv + "_KEY")
	capacity, callers, maxBatch := get("CAPACITY"), get("CALLERS"), get("BATCH")
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: int(callers)})
	defer rdb.Close()
	lim, err := New(rdb, Limit{Capacity: capacity, Refill: 1, Per: time.Hour}, Config{MaxBatch: int(maxBatch)})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	for _, s := range []*redis.Script{allowScript, allowOneScript} {
		if err := s.Load(ctx, rdb).Err(); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 2
		}
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var allowed int
	var firstErr error
	for i := int64(0); i < callers; i++ {
		wg.Go(func() {
			<-start
			res, err := lim.Allow(ctx, key, 1)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			if res.Allowed {
				allowed++
			}
		})
	}
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fmt.Fprintln(os.Stderr, "child: waiting for go:", err)
		return 2
	}
	close(start)
	wg.Wait()
	if firstErr != nil {
		fmt.Fprintln(os.Stderr, "child:", firstErr)
		return 1
	}
	fmt.Printf("allowed %d\n", allowed)
	return 0
}
