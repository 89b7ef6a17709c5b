package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/bench/internal/fleet"
	"github.com/shaperhq/shaper/bench/internal/machine"
	"github.com/shaperhq/shaper/bench/internal/redisproc"
	"github.com/shaperhq/shaper/bench/internal/stats"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

type options struct {
	sections      []string
	rates         []int
	replicas      []int
	window        time.Duration
	ceilingJobs   int
	rounds        int
	workers       int
	pacingWorkers int
	pickupSamples int
	pickupUps     []int
	asynqSamples  int
	pickupGap     time.Duration
	enqueuers     int
	profileDir    string
	contenders    []string // ceiling: those to run, in table order
	fair          bool     // ceiling: the Go handler's jobs spread over tenants and limited partitions
}

func parseFlags(args []string) (options, error) {
	fs := flag.NewFlagSet("dispatch", flag.ContinueOnError)
	var o options
	var sections, rates, replicas, pickupUps, contenders string
	fs.StringVar(&sections, "sections", "pacing,ceiling,pickup", "sections to run, comma-separated")
	fs.StringVar(&rates, "rates", "50,500,2000", "pacing: limits in requests per second, comma-separated")
	fs.StringVar(&replicas, "replicas", "1,4", "numbers of worker replicas, comma-separated")
	fs.DurationVar(&o.window, "window", 10*time.Second, "pacing: measuring window, from the first arrival")
	fs.IntVar(&o.ceilingJobs, "ceiling-jobs", 15000, "ceiling: jobs drained per measurement")
	fs.IntVar(&o.rounds, "rounds", 3, "ceiling: rounds, each measuring every contender in a rotated order")
	fs.IntVar(&o.workers, "workers", 10, "ceiling: jobs in flight per replica (shaper workers, asynq Concurrency); 10 is shaper's default")
	fs.IntVar(&o.pacingWorkers, "pacing-workers", 0, "pacing: workers per replica (0: shaper's default, 10)")
	fs.IntVar(&o.pickupSamples, "pickup-samples", 200, "pickup: jobs timed per shaper case")
	fs.StringVar(&pickupUps, "pickup-upstreams", "1,1000", "pickup: numbers of upstreams configured, comma-separated; each job goes to one of them at random")
	fs.IntVar(&o.asynqSamples, "pickup-asynq-samples", 20, "pickup: jobs timed for asynq at its default 1s polling")
	fs.DurationVar(&o.pickupGap, "pickup-gap", 100*time.Millisecond, "pickup: most idle time before each job (uniformly random)")
	fs.IntVar(&o.enqueuers, "enqueuers", 16, "goroutines filling the backlog")
	fs.StringVar(&contenders, "contenders", strings.Join(allContenders, ","), "ceiling: contenders to run, comma-separated")
	fs.BoolVar(&o.fair, "fair", false, "ceiling: the Go handler's jobs spread over "+strconv.Itoa(fairTenants)+" tenants and "+strconv.Itoa(fairPartitions)+
		" partitions, with fair share by tenant and a partition limit (too high to hold anything back), so that every step of the take's pick runs")
	fs.StringVar(&o.profileDir, "profile", "", "ceiling: write CPU profiles of every drainer and of this process into this directory (shaper then runs inside this executable)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.sections = strings.Split(sections, ",")
	for _, s := range o.sections {
		if !slices.Contains([]string{"pacing", "ceiling", "pickup"}, s) {
			return o, fmt.Errorf("-sections: %q: want pacing, ceiling or pickup", s)
		}
	}
	o.contenders = strings.Split(contenders, ",")
	for _, c := range o.contenders {
		if !slices.Contains(allContenders, c) {
			return o, fmt.Errorf("-contenders: %q: want some of %s", c, strings.Join(allContenders, ", "))
		}
	}
	var err error
	if o.rates, err = stats.Counts(rates); err != nil {
		return o, fmt.Errorf("-rates: %w", err)
	}
	if o.replicas, err = stats.Counts(replicas); err != nil {
		return o, fmt.Errorf("-replicas: %w", err)
	}
	if o.pickupUps, err = stats.Counts(pickupUps); err != nil {
		return o, fmt.Errorf("-pickup-upstreams: %w", err)
	}
	if o.window <= 0 || o.ceilingJobs < 100 || o.rounds < 1 || o.workers < 1 || o.pickupSamples < 1 || o.asynqSamples < 0 || o.enqueuers < 1 {
		return o, errors.New("-window, -rounds, -workers, -pickup-samples and -enqueuers must be positive, -ceiling-jobs at least 100")
	}
	return o, nil
}

// bench is one run's world: a Redis, the shaper binary, the fake upstream.
type bench struct {
	o      options
	redis  *redisproc.Server
	rdb    *redis.Client
	shaper *fleet.Shaper
	up     *upstream
	dir    string
	bullmq *bullmq // nil without node and npm
}

func run(ctx context.Context, args []string, out io.Writer) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "shaper-bench-dispatch-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintln(os.Stderr, "building shaper…")
	shaper, err := fleet.Build(ctx, dir)
	if err != nil {
		return err
	}
	if o.profileDir != "" {
		if o.profileDir, err = filepath.Abs(o.profileDir); err != nil {
			return err
		}
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			return err
		}
	}
	srv, err := redisproc.Start()
	if err != nil {
		return err
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 4 * o.enqueuers})
	defer rdb.Close()
	up, err := startUpstream()
	if err != nil {
		return err
	}
	defer up.close()
	b := &bench{o: o, redis: srv, rdb: rdb, shaper: shaper, up: up, dir: dir}

	start := time.Now()
	loadBefore := machine.Load()
	for _, s := range o.sections {
		var err error
		switch s {
		case "pacing":
			err = b.pacing(ctx, out)
		case "ceiling":
			err = b.ceiling(ctx, out)
		case "pickup":
			err = b.pickup(ctx, out)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	fmt.Fprintf(out, "Machine: %s. Load average before: %s; after: %s. Total time %v.\n",
		machine.Describe(srv.Version), loadBefore, machine.Load(), time.Since(start).Round(time.Second))
	fmt.Fprintf(out, "Command: `%s`\n", strings.TrimSpace("cd bench && go run ./cmd/dispatch "+strings.Join(args, " ")))
	return nil
}

func (b *bench) flush(ctx context.Context) error { return b.rdb.FlushAll(ctx).Err() }

// redisURL is the Redis's address as a URL, for BullMQ.
func (b *bench) redisURL() string { return "redis://" + b.redis.Addr + "/0" }

// upstreamConfig is one upstream's part of a shaper config.
type upstreamConfig struct {
	name    string
	baseURL string
	rate    int
	workers int // 0: shaper's default
}

// writeConfig writes a shaper config as a user would and returns its path.
func (b *bench) writeConfig(file string, ups ...upstreamConfig) (string, error) {
	var y strings.Builder
	fmt.Fprintf(&y, "redis: {url: \"redis://%s/0\"}\nwork: {metrics_listen: \"\", shutdown_timeout: 10s}\nupstreams:\n", b.redis.Addr)
	for _, u := range ups {
		fmt.Fprintf(&y, "  %s:\n    base_url: \"%s\"\n    limits: [{rate: %d, per: 1s}]\n    max_pending: 100000000\n", u.name, u.baseURL, u.rate)
		if u.workers > 0 {
			fmt.Fprintf(&y, "    workers: %d\n", u.workers)
		}
	}
	path := filepath.Join(b.dir, file)
	return path, os.WriteFile(path, []byte(y.String()), 0o600)
}

// startWorkers starts n `shaper work` replicas on a config. With metrics,
// each serves /metrics on a loopback port, listed in the same order.
func (b *bench) startWorkers(n int, cfg, label string, metrics bool) ([]*fleet.Proc, []string, error) {
	var ps []*fleet.Proc
	var addrs []string
	for i := 0; i < n; i++ {
		listen := "off"
		if metrics {
			port, err := fleet.FreePort()
			if err != nil {
				fleet.StopAll(10*time.Second, ps...)
				return nil, nil, err
			}
			listen = "127.0.0.1:" + strconv.Itoa(port)
			addrs = append(addrs, listen)
		}
		p, err := b.shaper.Start(fmt.Sprintf("%s-%d", label, i+1), nil, "work", "--config", cfg, "--log-level", "warn", "--metrics-listen", listen)
		if err != nil {
			fleet.StopAll(10*time.Second, ps...)
			return nil, nil, err
		}
		ps = append(ps, p)
	}
	return ps, addrs, nil
}

// scrape sums a counter's series over the replicas' /metrics.
func scrape(addrs []string, metric string) (float64, error) {
	var sum float64
	for _, a := range addrs {
		resp, err := http.Get("http://" + a + "/metrics")
		if err != nil {
			return 0, err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return 0, err
		}
		for _, line := range strings.Split(string(body), "\n") {
			if !strings.HasPrefix(line, metric+"{") && !strings.HasPrefix(line, metric+" ") {
				continue
			}
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %q", metric, line)
			}
			sum += v
		}
	}
	return sum, nil
}

// newQueue opens shaper's queue for the named upstreams with the config
// defaults a user gets. The queue only stores: the limit makes the
// upstream valid to it, and the workers pace by their own.
func (b *bench) newQueue(names ...string) (*queue.Queue, error) {
	var qc queue.Config
	for _, n := range names {
		qc.Upstreams = append(qc.Upstreams, shaper.Upstream{Name: n, Limits: []leaky.Limit{leaky.PerSecond(1000)}, MaxPending: 100_000_000})
	}
	return queue.New(b.rdb, qc)
}

// httpJob is the job every HTTP case sends: a small POST, as to an API.
func httpJob(upstream string, i int) *queue.Job {
	n := strconv.Itoa(i)
	return &queue.Job{Upstream: upstream, Method: "POST", Path: "/v1/things/" + n,
		Headers: map[string]string{"Content-Type": "application/json"}, Body: []byte(`{"n":` + n + `}`)}
}

// fill enqueues n jobs made by mk through the queue, as the API would.
func (b *bench) fill(ctx context.Context, q *queue.Queue, n int, mk func(i int) *queue.Job) error {
	return parallel(b.o.enqueuers, n, func(i int) error {
		_, _, err := q.Enqueue(ctx, mk(i))
		return err
	})
}

// fillAsynq enqueues n tasks with asynq's own client.
func (b *bench) fillAsynq(ctx context.Context, qname string, n int, payload []byte) error {
	c := asynq.NewClientFromRedisClient(b.rdb)
	defer c.Close()
	return parallel(b.o.enqueuers, n, func(int) error {
		_, err := c.EnqueueContext(ctx, asynq.NewTask("bench:noop", payload), asynq.Queue(qname))
		return err
	})
}

// parallel runs f(0…n-1) on g goroutines and returns the first error.
func parallel(g, n int, f func(i int) error) error {
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for w := 0; w < g; w++ {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { first = err })
					next.Store(int64(n))
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// waitFor polls cond every step until it holds or within passes.
func waitFor(within, step time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(within)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("gave up waiting for %s after %v", what, within)
		}
		time.Sleep(step)
	}
}

// ms renders a duration in milliseconds with two decimals.
func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }
