package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/bench/internal/fleet"
	"github.com/shaperhq/shaper/bench/internal/machine"
	"github.com/shaperhq/shaper/bench/internal/redisproc"
	"github.com/shaperhq/shaper/bench/internal/stats"
)

// The contenders, in the order each cell runs them.
const (
	shaperWork   = "shaper"
	asynqDefault = "asynq-default"
	asynq10ms    = "asynq-10ms"
)

var allContenders = []string{shaperWork, asynqDefault, asynq10ms}

// shaperPoll is shaper's work.poll_interval default, which it hands asynq
// as TaskCheckInterval.
const shaperPoll = 10 * time.Millisecond

// Above these, a figure says more about the machine than about the code:
// Redis (single-threaded) is busy all the time, or the measured processes
// (Redis and the replicas) fill every core, so the pollers are held back
// and the true demand is higher than what was served. The machine is
// shared, so it may also be saturated by others, which is noted apart.
const (
	redisSaturated   = 0.90 // of one core
	fleetSaturated   = 0.90 // Redis plus replicas, of all cores
	machineSaturated = 0.95 // whoever used them, of all cores
)

type options struct {
	upstreams   []int
	replicas    []int
	contenders  []string
	settle      time.Duration
	window      time.Duration
	cellTimeout time.Duration
	json        bool
}

func parseFlags(args []string) (options, error) {
	fs := flag.NewFlagSet("idle", flag.ContinueOnError)
	var o options
	var ups, reps, conts string
	fs.StringVar(&ups, "upstreams", "1,10,100,1000", "numbers of configured upstreams (asynq: queues), comma-separated")
	fs.StringVar(&reps, "replicas", "1,4", "numbers of worker processes, comma-separated")
	fs.StringVar(&conts, "contenders", strings.Join(allContenders, ","), "what to measure, comma-separated: shaper, asynq-default, asynq-10ms")
	fs.DurationVar(&o.settle, "settle", 5*time.Second, "wait after every server has registered, before measuring")
	fs.DurationVar(&o.window, "window", 10*time.Second, "measuring window")
	fs.DurationVar(&o.cellTimeout, "cell-timeout", 60*time.Second, "longest wait for every asynq server of a measurement to register; what has not by then is measured as it is, and marked")
	fs.BoolVar(&o.json, "json", false, "print the measurements as JSON instead of markdown")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	var err error
	if o.upstreams, err = stats.Counts(ups); err != nil {
		return o, fmt.Errorf("-upstreams: %w", err)
	}
	if o.replicas, err = stats.Counts(reps); err != nil {
		return o, fmt.Errorf("-replicas: %w", err)
	}
	for _, c := range strings.Split(conts, ",") {
		if !slices.Contains(allContenders, c) {
			return o, fmt.Errorf("-contenders: %q: want shaper, asynq-default or asynq-10ms", c)
		}
		o.contenders = append(o.contenders, c)
	}
	if o.settle < 0 || o.window <= 0 || o.cellTimeout <= 0 {
		return o, errors.New("-window and -cell-timeout must be positive, -settle not negative")
	}
	return o, nil
}

// result is one measurement: a contender with so many upstreams and
// replicas, idle.
type result struct {
	Contender string `json:"contender"`
	Upstreams int    `json:"upstreams"`
	Replicas  int    `json:"replicas"`
	// Servers is how many asynq servers had registered (asynq:servers)
	// when the window opened, of Expected (upstreams × replicas).
	Servers  int64 `json:"servers"`
	Expected int64 `json:"expected"`
	// CommandsPerSec is total_commands_processed over the window, per
	// second, the benchmark's own INFO calls left out.
	CommandsPerSec float64 `json:"commands_per_sec"`
	// Top are the most frequent commands (INFO commandstats; commands run
	// inside scripts count under their own names too), per second.
	Top []commandRate `json:"top"`
	// RedisCPU is Redis's user+sys CPU over the window, in cores (1 = one
	// core busy all the time).
	RedisCPU float64 `json:"redis_cpu"`
	// WorkersCPU is the replicas' CPU in cores, summed.
	WorkersCPU float64 `json:"workers_cpu"`
	// WorkerRSSMB is the mean resident memory of one replica, in MB.
	WorkerRSSMB float64 `json:"worker_rss_mb"`
	// MachineBusy is the share of all the machine's cores busy over the
	// window (/proc/stat), whoever used them.
	MachineBusy float64 `json:"machine_busy"`
	// StartTime is from starting the replicas to every server registered.
	StartTime time.Duration `json:"start_ns"`
	// HeldBack is set when each server sent far fewer commands than in
	// the contender's smallest cell (see markHeldBack).
	HeldBack bool `json:"held_back"`
	// Notes say why a figure may not be faithful.
	Notes []string `json:"notes,omitempty"`
}

type commandRate struct {
	Name    string  `json:"name"`
	PerSec  float64 `json:"per_sec"`
	Percent float64 `json:"percent"`
}

// run measures the grid the flags ask for, prints it to out and returns
// every measurement.
func run(ctx context.Context, args []string, out io.Writer) ([]result, error) {
	o, err := parseFlags(args)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "shaper-bench-idle-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var sh *fleet.Shaper
	if slices.Contains(o.contenders, shaperWork) {
		fmt.Fprintln(os.Stderr, "building shaper…")
		if sh, err = fleet.Build(ctx, dir); err != nil {
			return nil, err
		}
	}
	srv, err := redisproc.Start()
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()

	start := time.Now()
	loadBefore := machine.Load()
	var results []result
	for _, n := range o.upstreams {
		cfg := ""
		if sh != nil {
			if cfg, err = writeConfig(dir, srv.Addr, n); err != nil {
				return nil, err
			}
		}
		for _, r := range o.replicas {
			for _, c := range o.contenders {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				if err := rdb.FlushAll(ctx).Err(); err != nil {
					return nil, err
				}
				res, err := measure(ctx, o, srv, rdb, sh, cfg, c, n, r)
				if err != nil {
					return nil, fmt.Errorf("%s, %d upstreams × %d replicas: %w", c, n, r, err)
				}
				fmt.Fprintf(os.Stderr, "%s %d×%d: %.0f commands/s, Redis CPU %.0f%%, machine busy %.0f%% %s\n",
					c, n, r, res.CommandsPerSec, 100*res.RedisCPU, 100*res.MachineBusy, strings.Join(res.Notes, "; "))
				results = append(results, res)
			}
		}
	}
	markHeldBack(results)
	loadAfter := machine.Load()
	command := strings.TrimSpace("cd bench && go run ./cmd/idle " + strings.Join(args, " "))
	if o.json {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return results, enc.Encode(map[string]any{
			"results": results, "machine": machine.Describe(srv.Version),
			"load_before": loadBefore, "load_after": loadAfter, "command": command,
		})
	}
	report(out, o, results)
	fmt.Fprintf(out, "Machine: %s. Load average before: %s; after: %s. Total time %v.\n",
		machine.Describe(srv.Version), loadBefore, loadAfter, time.Since(start).Round(time.Second))
	fmt.Fprintf(out, "Command: `%s`\n", command)
	return results, nil
}

// writeConfig writes a shaper config with n HTTP upstreams, as a user
// would. Their base URL is a loopback port nothing listens on: nothing is
// queued, so nothing is ever sent.
func writeConfig(dir, redisAddr string, n int) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "redis: {url: \"redis://%s/0\"}\n", redisAddr)
	b.WriteString("work: {metrics_listen: \"\", shutdown_timeout: 5s}\n")
	b.WriteString("upstreams:\n")
	for i := range n {
		fmt.Fprintf(&b, "  %s:\n    base_url: \"http://127.0.0.1:9\"\n    limits: [{rate: 10, per: 1s}]\n", queueName(i))
	}
	path := filepath.Join(dir, fmt.Sprintf("idle-%d.yaml", n))
	return path, os.WriteFile(path, []byte(b.String()), 0o600)
}

// measure starts r replicas of contender c with n upstreams, waits for
// their servers to register and settle, counts Redis's work over the
// window, and stops them.
func measure(ctx context.Context, o options, srv *redisproc.Server, rdb *redis.Client, sh *fleet.Shaper, cfg, c string, n, r int) (result, error) {
	res := result{Contender: c, Upstreams: n, Replicas: r, Expected: int64(n) * int64(r)}
	var procs []*fleet.Proc
	defer func() {
		// A replica that needs SIGKILL to stop is no fault of the figure.
		if err := fleet.StopAll(15*time.Second, procs...); err != nil {
			fmt.Fprintf(os.Stderr, "stopping %s %d×%d: %v\n", c, n, r, err)
		}
	}()
	began := time.Now()
	for i := range r {
		name := fmt.Sprintf("%s-%dx%d-%d", c, n, r, i+1)
		var p *fleet.Proc
		var err error
		switch c {
		case shaperWork:
			p, err = sh.Start(name, nil, "work", "--config", cfg, "--log-level", "warn", "--metrics-listen", "off")
		case asynqDefault:
			p, err = startAsynq(name, srv.Addr, n, 0)
		case asynq10ms:
			p, err = startAsynq(name, srv.Addr, n, shaperPoll)
		}
		if err != nil {
			return res, err
		}
		procs = append(procs, p)
	}
	// Every asynq server writes its first heartbeat to asynq:servers as
	// it starts; all of them there means all are polling.
	deadline := began.Add(o.cellTimeout)
	for {
		for _, p := range procs {
			if p.Exited() {
				return res, fmt.Errorf("%s exited while starting; log:\n%s", p.Name, p.Log())
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		got, err := rdb.ZCard(cctx, "asynq:servers").Result()
		cancel()
		if err == nil {
			res.Servers = got
		}
		if res.Servers >= res.Expected {
			res.StartTime = time.Since(began)
			break
		}
		if time.Now().After(deadline) {
			res.StartTime = time.Since(began)
			res.Notes = append(res.Notes, fmt.Sprintf("only %d of %d servers registered within %v", res.Servers, res.Expected, o.cellTimeout))
			break
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return res, err
		}
	}
	if err := sleep(ctx, o.settle); err != nil {
		return res, err
	}

	before, err := take(srv, procs)
	if err != nil {
		return res, err
	}
	if err := sleep(ctx, o.window); err != nil {
		return res, err
	}
	after, err := take(srv, procs)
	if err != nil {
		return res, err
	}
	for _, p := range procs {
		if p.Exited() {
			return res, fmt.Errorf("%s exited while measured; log:\n%s", p.Name, p.Log())
		}
	}
	res.fill(before, after)
	if res.RedisCPU >= redisSaturated {
		res.Notes = append(res.Notes, fmt.Sprintf("Redis saturated (%.0f%% of a core): demand exceeds what it served", 100*res.RedisCPU))
	}
	if own := (res.RedisCPU + res.WorkersCPU) / float64(runtime.NumCPU()); own >= fleetSaturated {
		res.Notes = append(res.Notes, fmt.Sprintf("Redis and the replicas fill the machine (%.0f%% of all cores): demand exceeds what was served", 100*own))
	} else if res.MachineBusy >= machineSaturated {
		res.Notes = append(res.Notes, fmt.Sprintf("machine busy (%.0f%% of all cores, other work included): the pollers may have been held back", 100*res.MachineBusy))
	}
	return res, nil
}

// heldBack is the share of its smallest cell's rate per server below
// which a cell's servers are taken not to have polled at their interval.
const heldBack = 0.75

// markHeldBack notes the cells whose servers each sent far fewer commands
// than the same contender's servers did in its smallest cell: idle polling
// costs the same per server however many there are, so a drop means the
// pollers could not keep their interval (CPU, connection pool or Redis),
// and what the cell would ask of a bigger machine is the smallest cell's
// rate per server times its servers.
func markHeldBack(results []result) {
	base := map[string]result{}
	for _, r := range results {
		if b, ok := base[r.Contender]; !ok || r.Expected < b.Expected {
			base[r.Contender] = r
		}
	}
	for i := range results {
		r := &results[i]
		b := base[r.Contender]
		if r.Expected == b.Expected || b.CommandsPerSec <= 0 {
			continue
		}
		per, bper := r.CommandsPerSec/float64(r.Expected), b.CommandsPerSec/float64(b.Expected)
		if per < heldBack*bper {
			r.HeldBack = true
			r.Notes = append(r.Notes, fmt.Sprintf("pollers held back: %.0f commands/s per server against %.0f with %d × %d, so polling at its interval would ask about %s/s",
				per, bper, b.Upstreams, b.Replicas, thousands(bper*float64(r.Expected))))
		}
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
