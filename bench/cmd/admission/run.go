package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/bench/internal/redisproc"
	"github.com/shaperhq/shaper/bench/internal/redisstats"
	"github.com/shaperhq/shaper/bench/internal/stats"
	"github.com/shaperhq/shaper/tokenbucket"
)

type options struct {
	duration   time.Duration
	rounds     int
	callers    []int
	keys       []int
	memoryKeys int
	capacity   int
	refill     int
	tb         tokenbucket.Config
}

func parseFlags(args []string) (options, error) {
	fs := flag.NewFlagSet("admission", flag.ContinueOnError)
	var o options
	var callers, keys string
	fs.DurationVar(&o.duration, "duration", 800*time.Millisecond, "length of one measurement")
	fs.IntVar(&o.rounds, "rounds", 7, "rounds; each measures every case for both limiters, alternating which goes first")
	fs.StringVar(&callers, "callers", "1,8,64,256", "concurrent callers, comma-separated")
	fs.StringVar(&keys, "keys", "1,100000", "key-space sizes, comma-separated")
	fs.IntVar(&o.memoryKeys, "memory-keys", 100000, "keys created to measure memory per idle key")
	fs.IntVar(&o.capacity, "capacity", 1000, "bucket capacity (redis_rate burst)")
	fs.IntVar(&o.refill, "refill", 1000, "refill per second (redis_rate rate)")
	fs.IntVar(&o.tb.MaxBatch, "tb-max-batch", 0, "tokenbucket Config.MaxBatch (0: its default; 1: no coalescing)")
	fs.IntVar(&o.tb.MaxInFlight, "tb-max-in-flight", 0, "tokenbucket Config.MaxInFlight (0: its default)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	var err error
	if o.callers, err = stats.Counts(callers); err != nil {
		return o, fmt.Errorf("-callers: %w", err)
	}
	if o.keys, err = stats.Counts(keys); err != nil {
		return o, fmt.Errorf("-keys: %w", err)
	}
	if o.rounds < 1 || o.duration <= 0 {
		return o, fmt.Errorf("-rounds and -duration must be positive")
	}
	return o, nil
}

// decide is one admission decision by one of the limiters under test.
type decide func(ctx context.Context, key string) error

type contender struct {
	name string
	make func(rdb *redis.Client) decide
}

func run(ctx context.Context, args []string, out io.Writer) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	srv, err := redisproc.Start()
	if err != nil {
		return err
	}
	defer srv.Stop()

	maxKeys := slices.Max(o.keys)
	names := make([]string, maxKeys)
	for i := range names {
		names[i] = "k" + strconv.Itoa(i)
	}
	tbLimit := tokenbucket.PerSecond(int64(o.refill), int64(o.capacity))
	rrLimit := redis_rate.Limit{Rate: o.refill, Burst: o.capacity, Period: time.Second}
	contenders := []contender{
		{name: "shaper tokenbucket", make: func(rdb *redis.Client) decide {
			lim, err := tokenbucket.New(rdb, tbLimit, o.tb)
			if err != nil {
				panic(err) // the limit is a constant above
			}
			return func(ctx context.Context, key string) error { _, err := lim.Allow(ctx, key, 1); return err }
		}},
		{name: "redis_rate v10", make: func(rdb *redis.Client) decide {
			lim := redis_rate.NewLimiter(rdb)
			return func(ctx context.Context, key string) error { _, err := lim.Allow(ctx, key, rrLimit); return err }
		}},
	}

	type caseKey struct{ callers, keys, contender int }
	results := map[caseKey][]float64{}
	costs := map[caseKey][]cost{}
	start := time.Now()
	for round := 0; round < o.rounds; round++ {
		for _, callers := range o.callers {
			for _, keys := range o.keys {
				order := []int{0, 1}
				if round%2 == 1 {
					order = []int{1, 0}
				}
				for _, ci := range order {
					rate, c, err := measure(ctx, srv, contenders[ci], names[:keys], callers, o.duration)
					if err != nil {
						return fmt.Errorf("%s, %d callers, %d keys: %w", contenders[ci].name, callers, keys, err)
					}
					k := caseKey{callers, keys, ci}
					results[k] = append(results[k], rate)
					costs[k] = append(costs[k], c)
				}
			}
		}
		fmt.Fprintf(os.Stderr, "round %d/%d done after %v\n", round+1, o.rounds, time.Since(start).Round(time.Second))
	}

	tbMem, err := memoryPerKey(ctx, srv.Addr, contenders[0], o.memoryKeys)
	if err != nil {
		return err
	}
	rrMem, err := memoryPerKey(ctx, srv.Addr, contenders[1], o.memoryKeys)
	if err != nil {
		return err
	}

	fmt.Fprintf(out, "Admission decisions per second, median of %d rounds of %v each (limit: capacity %d, refill %d/s; one go-redis client per limiter, default pool of %d connections).\n\n",
		o.rounds, o.duration, o.capacity, o.refill, 10*runtime.GOMAXPROCS(0))
	// The paired ratio compares the two measurements of one round, taken
	// back to back, so load from elsewhere on the machine mostly cancels.
	fmt.Fprintf(out, "| callers | keys | %s | %s | ratio of medians | paired ratio: median (min–max) |\n| ---: | ---: | ---: | ---: | ---: | ---: |\n",
		contenders[0].name, contenders[1].name)
	for _, callers := range o.callers {
		for _, keys := range o.keys {
			as, bs := results[caseKey{callers, keys, 0}], results[caseKey{callers, keys, 1}]
			ratios := make([]float64, len(as))
			for i := range as {
				ratios[i] = as[i] / bs[i]
			}
			a, b := stats.Median(as), stats.Median(bs)
			fmt.Fprintf(out, "| %d | %d | %.0f | %.0f | %.2f× | %.2f× (%.2f–%.2f) |\n",
				callers, keys, a, b, a/b, stats.Median(ratios), slices.Min(ratios), slices.Max(ratios))
		}
	}
	fmt.Fprintf(out, "\nPer decision, medians over the rounds: script calls, Redis commands (those inside scripts included), bytes on the wire (sent + received, from Redis's counters), client allocations, and CPU time of the Redis server and of this process.\n\n")
	fmt.Fprintf(out, "| callers | keys | limiter | script calls | Redis commands | bytes | allocs | Redis CPU | client CPU |\n| ---: | ---: | :--- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, callers := range o.callers {
		for _, keys := range o.keys {
			for ci, c := range contenders {
				cs := costs[caseKey{callers, keys, ci}]
				med := func(f func(cost) float64) float64 {
					xs := make([]float64, len(cs))
					for i, c := range cs {
						xs[i] = f(c)
					}
					return stats.Median(xs)
				}
				fmt.Fprintf(out, "| %d | %d | %s | %.3f | %.2f | %.0f | %.1f | %.1f µs | %.1f µs |\n", callers, keys, c.name,
					med(func(c cost) float64 { return c.scripts }), med(func(c cost) float64 { return c.commands }),
					med(func(c cost) float64 { return c.bytes }), med(func(c cost) float64 { return c.allocs }),
					med(func(c cost) float64 { return c.redisCPU }), med(func(c cost) float64 { return c.clientCPU }))
			}
		}
	}
	fmt.Fprintf(out, "\nRedis memory per idle key (used_memory delta / %d keys): %s %.0f B, %s %.0f B.\n",
		o.memoryKeys, contenders[0].name, tbMem, contenders[1].name, rrMem)
	fmt.Fprintf(out, "\nMachine: %d CPUs (GOMAXPROCS %d), %s, %s. Total time %v.\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), srv.Version, time.Since(start).Round(time.Second))
	fmt.Fprintf(out, "Command: `cd bench && go run ./cmd/admission %s`\n", strings.Join(args, " "))
	return nil
}

// cost is what one measurement spent per decision.
type cost struct {
	scripts, commands float64 // Redis script calls and commands
	bytes             float64 // Redis's network input plus output
	allocs            float64 // heap allocations in this process
	redisCPU          float64 // µs of the Redis server's CPU time
	clientCPU         float64 // µs of this process's CPU time
}

// counters are the totals a cost is the difference of.
type counters struct {
	redis  redisstats.Snapshot
	bytes  int64
	allocs uint64
	cpu    time.Duration
}

func readCounters(srv *redisproc.Server) (counters, error) {
	var c counters
	var err error
	if c.redis, err = redisstats.Take(srv); err != nil {
		return c, err
	}
	st, err := srv.Info("stats")
	if err != nil {
		return c, err
	}
	for _, f := range []string{"total_net_input_bytes", "total_net_output_bytes"} {
		n, err := strconv.ParseInt(st[f], 10, 64)
		if err != nil {
			return c, fmt.Errorf("INFO stats %s: %q", f, st[f])
		}
		c.bytes += n
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	c.allocs = ms.Mallocs
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return c, err
	}
	c.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return c, nil
}

func (c counters) per(before counters, decisions int64) cost {
	d := c.redis.Since(before.redis)
	n := float64(decisions)
	return cost{
		scripts:   float64(d.Scripts()) / n,
		commands:  float64(d.Total()) / n,
		bytes:     float64(c.bytes-before.bytes) / n,
		allocs:    float64(c.allocs-before.allocs) / n,
		redisCPU:  float64(d.CPU.Microseconds()) / n,
		clientCPU: float64((c.cpu - before.cpu).Microseconds()) / n,
	}
}

// measure runs callers goroutines deciding on random keys for d against a
// fresh key space and returns decisions per second and what they cost.
func measure(ctx context.Context, srv *redisproc.Server, c contender, keys []string, callers int, d time.Duration) (float64, cost, error) {
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		return 0, cost{}, err
	}
	allow := c.make(rdb)
	if err := allow(ctx, "warm-up"); err != nil {
		return 0, cost{}, err
	}
	before, err := readCounters(srv)
	if err != nil {
		return 0, cost{}, err
	}
	var ops atomic.Int64
	var firstErr atomic.Value
	var stop atomic.Bool
	var wg sync.WaitGroup
	begin := time.Now()
	for i := 0; i < callers; i++ {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(i), 7))
			n := int64(0)
			for !stop.Load() {
				if err := allow(ctx, keys[r.IntN(len(keys))]); err != nil {
					firstErr.CompareAndSwap(nil, err)
					break
				}
				n++
			}
			ops.Add(n)
		})
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(begin)
	after, err := readCounters(srv)
	if err != nil {
		return 0, cost{}, err
	}
	if err, _ := firstErr.Load().(error); err != nil {
		return 0, cost{}, err
	}
	return float64(ops.Load()) / elapsed.Seconds(), after.per(before, ops.Load()), nil
}

// memoryPerKey creates n buckets that stay idle (a slow refill keeps them
// from expiring while we look) and divides the growth of used_memory by n.
func memoryPerKey(ctx context.Context, addr string, c contender, n int) (float64, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		return 0, err
	}
	slow := c
	switch c.name {
	case "shaper tokenbucket":
		lim, err := tokenbucket.New(rdb, tokenbucket.Limit{Capacity: 100, Refill: 100, Per: time.Hour}, tokenbucket.Config{})
		if err != nil {
			return 0, err
		}
		slow.make = func(*redis.Client) decide {
			return func(ctx context.Context, key string) error { _, err := lim.Allow(ctx, key, 1); return err }
		}
	default:
		lim := redis_rate.NewLimiter(rdb)
		slow.make = func(*redis.Client) decide {
			return func(ctx context.Context, key string) error {
				_, err := lim.Allow(ctx, key, redis_rate.PerHour(100))
				return err
			}
		}
	}
	allow := slow.make(rdb)
	if err := allow(ctx, "warm-up"); err != nil {
		return 0, err
	}
	before, err := usedMemory(ctx, rdb)
	if err != nil {
		return 0, err
	}
	var wg sync.WaitGroup
	var firstErr atomic.Value
	const workers = 64
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				if err := allow(ctx, "m"+strconv.Itoa(i)); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return 0, err
	}
	after, err := usedMemory(ctx, rdb)
	if err != nil {
		return 0, err
	}
	if size, err := rdb.DBSize(ctx).Result(); err != nil || size < int64(n) {
		return 0, fmt.Errorf("memory: got %d keys (%v), want at least %d", size, err, n)
	}
	return float64(after-before) / float64(n), nil
}

func usedMemory(ctx context.Context, rdb *redis.Client) (int64, error) {
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("no used_memory in INFO memory")
}
