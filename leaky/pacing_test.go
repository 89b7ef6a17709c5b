package leaky

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/fakeupstream"
	"github.com/shaperhq/shaper/internal/testsupport/childproc"
	"github.com/shaperhq/shaper/internal/testsupport/stall"
)

// runChild is the body of a child process: a pacer replica that takes slots
// from a shared bucket until its end time and prints each send's wall-clock
// time in nanoseconds, one per line.
func runChild(role string) int {
	switch role {
	case "pacer":
	case "leaseholder":
		return holdLease()
	case "spacer":
		return runSpacer()
	default:
		fmt.Fprintf(os.Stderr, "unknown child role %q\n", role)
		return 2
	}
	env := func(k string) int64 {
		n, err := strconv.ParseInt(os.Getenv(k), 10, 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", k, err)
			os.Exit(2)
		}
		return n
	}
	rate, per, workers := env("PACE_RATE"), time.Duration(env("PACE_PER")), int(env("PACE_WORKERS"))
	start, end := time.Unix(0, env("PACE_START")), time.Unix(0, env("PACE_END"))
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("PACE_REDIS"), PoolSize: workers + 2})
	defer rdb.Close()
	b, err := New(rdb, Config{}).Bucket(os.Getenv("PACE_BUCKET"), BucketConfig{
		Limits: []Limit{{Rate: rate, Per: per}},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	// Warm the pool so the first reservations do not pay for dialing.
	for i := 0; i < workers; i++ {
		rdb.Ping(context.Background())
	}
	time.Sleep(time.Until(start))
	ctx, cancel := context.WithDeadline(context.Background(), end)
	defer cancel()

	var mu sync.Mutex
	var sends []int64
	var lateness []time.Duration
	late := 0
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []int64
			for {
				r, err := b.Reserve(ctx, nil)
				if err != nil {
					break
				}
				if !r.OK {
					if sleep(ctx, r.RetryAfter) != nil {
						break
					}
					continue
				}
				err = r.Wait(ctx)
				mu.Lock()
				lateness = append(lateness, r.Late())
				mu.Unlock()
				if errors.Is(err, ErrLate) {
					mu.Lock()
					late++
					mu.Unlock()
					continue
				}
				if err != nil {
					break
				}
				mine = append(mine, time.Now().UnixNano())
			}
			mu.Lock()
			sends = append(sends, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	var sb strings.Builder
	for _, s := range sends {
		sb.WriteString(strconv.FormatInt(s, 10))
		sb.WriteByte('\n')
	}
	os.Stdout.WriteString(sb.String())
	slices.Sort(lateness)
	pct := func(p float64) time.Duration {
		if len(lateness) == 0 {
			return 0
		}
		return lateness[int(p*float64(len(lateness)-1))]
	}
	fmt.Fprintf(os.Stderr, "sent %d, late slots skipped %d; lateness bound p50 %v p90 %v p99 %v max %v\n",
		len(sends), late, pct(0.5), pct(0.9), pct(0.99), pct(1))
	return 0
}

// TestPacingAcrossProcesses runs 4 OS processes taking slots from one bucket
// for 10 seconds: no window of length per may hold more than rate sends, and
// at least 97% of rate must be delivered.
func TestPacingAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("4 processes pacing for 10 s: multi-process, runs in make test")
	}
	for _, tc := range []struct {
		rate    int64
		workers int
	}{
		{200, 4},
		{2000, 8},
	} {
		t.Run(fmt.Sprintf("%d_per_s", tc.rate), func(t *testing.T) {
			const procs = 4
			duration := 10 * time.Second
			per := time.Second
			start := time.Now().Add(2 * time.Second)
			end := start.Add(duration)
			bucket := uniqueName(t)
			type result struct {
				out []string
				err error
			}
			results := make([]result, procs)
			host := stall.Start()
			var wg sync.WaitGroup
			for i := 0; i < procs; i++ {
				cmd := childproc.Command(t, "pacer",
					"PACE_REDIS="+srv.Addr, "PACE_BUCKET="+bucket,
					fmt.Sprintf("PACE_RATE=%d", tc.rate), fmt.Sprintf("PACE_PER=%d", per),
					fmt.Sprintf("PACE_WORKERS=%d", tc.workers),
					fmt.Sprintf("PACE_START=%d", start.UnixNano()), fmt.Sprintf("PACE_END=%d", end.UnixNano()))
				stdout, err := cmd.StdoutPipe()
				if err != nil {
					t.Fatal(err)
				}
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					lines, err := childproc.Lines(stdout)
					if werr := cmd.Wait(); err == nil {
						err = werr
					}
					results[i] = result{lines, err}
				}()
			}
			wg.Wait()
			stalled, longest, stalls := host.Stop()
			var sends []time.Duration
			for i, r := range results {
				if r.err != nil {
					t.Fatalf("child %d: %v", i, r.err)
				}
				for _, l := range r.out {
					n, err := strconv.ParseInt(l, 10, 64)
					if err != nil {
						t.Fatalf("child %d printed %q", i, l)
					}
					sends = append(sends, time.Duration(n))
				}
			}
			most := fakeupstream.MaxInWindow(sends, per)
			tenth := fakeupstream.MaxInWindow(sends, per/10)
			achieved := float64(len(sends)) / duration.Seconds()
			t.Logf("rate %d/s: %d sends in %v (%.1f/s, %.1f%%), most in any %v: %d, in any %v: %d",
				tc.rate, len(sends), duration, achieved, 100*achieved/float64(tc.rate), per, most, per/10, tenth)
			if most > int(tc.rate) {
				t.Errorf("got %d sends in one window of %v, want at most %d", most, per, tc.rate)
			}
			// The machine itself stopping (a virtual machine descheduled by
			// its host) stops every replica: the 97% is owed for the time the
			// machine ran, not for the time it stood still.
			ran := max(0, duration-stalled+time.Duration(stalls)*stall.Threshold)
			t.Logf("host stalls: %d, %v in all, longest %v; owed 97%% of %d/s over %v", stalls, stalled, longest, tc.rate, ran)
			if min := 0.97 * float64(tc.rate) * ran.Seconds() / duration.Seconds(); achieved < min {
				t.Errorf("got %.1f sends/s, want at least 97%% of %d over the %v the host ran (%.1f)", achieved, tc.rate, ran, min)
			}
		})
	}
}

// holdLease takes a concurrency lease, says so on stdout, and hangs until
// killed: a worker that dies mid-send.
func holdLease() int {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("PACE_REDIS")})
	b, err := New(rdb, Config{}).Bucket(os.Getenv("PACE_BUCKET"), leaseBucketConfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	r, err := b.Take(context.Background(), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println(r.Lease)
	select {}
}

var leaseBucketConfig = BucketConfig{Limits: []Limit{PerSecond(1000)}, Concurrency: 1, LeaseTTL: 300 * time.Millisecond}

// TestLeaseOfKilledHolderExpires kills -9 a process holding the only
// concurrency lease: the fleet gets the lease back after LeaseTTL.
func TestLeaseOfKilledHolderExpires(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a child process: multi-process, runs in make test")
	}
	ctx := context.Background()
	name := uniqueName(t)
	cmd := childproc.Command(t, "leaseholder", "PACE_REDIS="+srv.Addr, "PACE_BUCKET="+name)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 25)
	if _, err := io.ReadFull(stdout, line); err != nil {
		t.Fatalf("child did not report its lease: %v", err)
	}
	b, err := New(srv.Client(t), Config{}).Bucket(name, leaseBucketConfig)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := b.Reserve(ctx, nil); err != nil || r.OK || r.Reason != ReasonConcurrency {
		t.Fatalf("while the child holds the lease: got %+v, %v; want refused for concurrency", r, err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	// LeaseTTL is 300ms; ten seconds means "never".
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := b.Take(tctx, nil)
	if err != nil {
		t.Fatalf("the dead holder's lease never came back: %v", err)
	}
	b.Release(ctx, r)
}
