package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/bench/internal/fleet"
	"github.com/shaperhq/shaper/bench/internal/machine"
	"github.com/shaperhq/shaper/bench/internal/redisproc"
	"github.com/shaperhq/shaper/bench/internal/stats"
	"github.com/shaperhq/shaper/internal/jobstore"
)

// The contenders, in the order each cell runs them.
const (
	shaperWork   = "shaper"
	asynqDefault = "asynq-default"
	asynq10ms    = "asynq-10ms"
)

var allContenders = []string{shaperWork, asynqDefault, asynq10ms}

// oldShaperPoll is the work.poll_interval shaper had before issue 8, which
// it handed asynq as TaskCheckInterval: the asynq-10ms contender.
const oldShaperPoll = 10 * time.Millisecond

// shaperWindow is the default window for shaper. An idle `shaper work`
// replica does nothing on a timer but two things: each upstream's fetch
// loop looks once per work.poll_interval (30 s) in case a wake-up was lost,
// and the dead-job trimmer calls one script per upstream every minute. A
// window of a whole minute counts each of them exactly its share; a shorter
// one can miss the trimmer or catch it whole.
const shaperWindow = 2 * shaper.DefaultPollInterval

// stopGrace is how long a replica may take to stop after SIGTERM before it
// is killed; how long each took is reported.
const stopGrace = 15 * time.Second

// apiKey is the key of the one API key the serve process is configured
// with; nothing calls the API.
const apiKey = "idle-bench-key"

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
	shaperWin   time.Duration
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
	fs.DurationVar(&o.window, "window", 10*time.Second, "measuring window of the asynq contenders")
	fs.DurationVar(&o.shaperWin, "shaper-window", shaperWindow, "measuring window of shaper: a multiple of its periodic work, so that each periodic call is counted its share (see shaperWindow)")
	fs.DurationVar(&o.cellTimeout, "cell-timeout", 60*time.Second, "longest wait for every process of a measurement to be ready (asynq: every server registered; shaper: every replica subscribed and every upstream asleep); what is not by then is measured as it is, and marked")
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
	if o.settle < 0 || o.window <= 0 || o.shaperWin <= 0 || o.cellTimeout <= 0 {
		return o, errors.New("-window, -shaper-window and -cell-timeout must be positive, -settle not negative")
	}
	return o, nil
}

// result is one measurement: a contender with so many upstreams and
// replicas, idle.
type result struct {
	Contender string `json:"contender"`
	Upstreams int    `json:"upstreams"`
	Replicas  int    `json:"replicas"`
	// Servers is what was ready when the window opened, of Expected.
	// asynq: servers registered in asynq:servers, of upstreams × replicas.
	// shaper: replicas subscribed to the wake-up channel plus upstreams
	// whose ready structure says a worker sleeps on them, of replicas +
	// upstreams (nothing registers per upstream any more).
	Servers  int64 `json:"servers"`
	Expected int64 `json:"expected"`
	// Window is how long the counts were taken over.
	Window time.Duration `json:"window_ns"`
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
	// ServeCPU is the CPU of shaper's one serve process, in cores.
	ServeCPU float64 `json:"serve_cpu,omitempty"`
	// StopMax is the longest any replica took to exit after SIGTERM (all
	// are sent it at once); Killed counts those still running after
	// stopGrace, which were killed.
	StopMax time.Duration `json:"stop_max_ns"`
	Killed  int           `json:"killed"`
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

// writeConfig writes a shaper config with n HTTP upstreams and one API
// key, as a user would, with shaper's defaults otherwise (work.poll_interval
// 30s). Their base URL is a loopback port nothing listens on: nothing is
// queued, so nothing is ever sent.
func writeConfig(dir, redisAddr string, n int) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "redis: {url: \"redis://%s/0\"}\n", redisAddr)
	b.WriteString("api: {keys: [{name: idle, tenant: idle, key_env: SHAPER_KEY_IDLE}]}\n")
	b.WriteString("work: {metrics_listen: \"\", shutdown_timeout: 5s}\n")
	b.WriteString("upstreams:\n")
	for i := range n {
		fmt.Fprintf(&b, "  %s:\n    base_url: \"http://127.0.0.1:9\"\n    limits: [{rate: 10, per: 1s}]\n", queueName(i))
	}
	path := filepath.Join(dir, fmt.Sprintf("idle-%d.yaml", n))
	return path, os.WriteFile(path, []byte(b.String()), 0o600)
}

// measure starts r replicas of contender c with n upstreams (shaper: and
// one serve process), waits for them to be ready and settle, counts
// Redis's work over the window, and stops them, timing the stop.
func measure(ctx context.Context, o options, srv *redisproc.Server, rdb *redis.Client, sh *fleet.Shaper, cfg, c string, n, r int) (result, error) {
	res := result{Contender: c, Upstreams: n, Replicas: r, Expected: int64(n) * int64(r), Window: o.window}
	if c == shaperWork {
		res.Expected, res.Window = int64(n+r), o.shaperWin
	}
	var procs []*fleet.Proc
	var serve *fleet.Proc
	stopped := false
	defer func() {
		if !stopped {
			fleet.StopAll(stopGrace, append(procs, serve)...)
		}
	}()
	began := time.Now()
	serveAddr := ""
	if c == shaperWork {
		port, err := fleet.FreePort()
		if err != nil {
			return res, err
		}
		serveAddr = "127.0.0.1:" + strconv.Itoa(port)
		if serve, err = sh.Start(fmt.Sprintf("serve-%dx%d", n, r), []string{"SHAPER_KEY_IDLE=" + apiKey},
			"serve", "--config", cfg, "--listen", serveAddr, "--log-level", "warn"); err != nil {
			return res, err
		}
	}
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
			p, err = startAsynq(name, srv.Addr, n, oldShaperPoll)
		}
		if err != nil {
			return res, err
		}
		procs = append(procs, p)
	}
	deadline := began.Add(o.cellTimeout)
	for {
		for _, p := range append(procs, serve) {
			if p != nil && p.Exited() {
				return res, fmt.Errorf("%s exited while starting; log:\n%s", p.Name, p.Log())
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		got, err := readiness(cctx, rdb, c, n, serveAddr)
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
			res.Notes = append(res.Notes, fmt.Sprintf("only %d of %d ready within %v", res.Servers, res.Expected, o.cellTimeout))
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
	var serveBefore time.Duration
	if serve != nil {
		serveBefore, _ = serve.CPU()
	}
	if err := sleep(ctx, res.Window); err != nil {
		return res, err
	}
	after, err := take(srv, procs)
	if err != nil {
		return res, err
	}
	for _, p := range append(procs, serve) {
		if p != nil && p.Exited() {
			return res, fmt.Errorf("%s exited while measured; log:\n%s", p.Name, p.Log())
		}
	}
	res.fill(before, after)
	if serve != nil {
		serveAfter, _ := serve.CPU()
		res.ServeCPU = (serveAfter - serveBefore).Seconds() / after.at.Sub(before.at).Seconds()
	}
	if res.RedisCPU >= redisSaturated {
		res.Notes = append(res.Notes, fmt.Sprintf("Redis saturated (%.0f%% of a core): demand exceeds what it served", 100*res.RedisCPU))
	}
	if own := (res.RedisCPU + res.WorkersCPU) / float64(runtime.NumCPU()); own >= fleetSaturated {
		res.Notes = append(res.Notes, fmt.Sprintf("Redis and the replicas fill the machine (%.0f%% of all cores): demand exceeds what was served", 100*own))
	} else if res.MachineBusy >= machineSaturated {
		res.Notes = append(res.Notes, fmt.Sprintf("machine busy (%.0f%% of all cores, other work included): the pollers may have been held back", 100*res.MachineBusy))
	}

	// The replicas get SIGTERM together, as in a rolling stop of the
	// fleet; each one's time to exit is timed.
	stopped = true
	res.StopMax, res.Killed = stopTimed(procs)
	if serve != nil {
		if err := serve.Stop(stopGrace); err != nil {
			fmt.Fprintf(os.Stderr, "stopping serve of %d×%d: %v\n", n, r, err)
		}
	}
	if res.Killed > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("%d of %d replicas still ran %v after SIGTERM and were killed", res.Killed, r, stopGrace))
	}
	return res, nil
}

// stopTimed sends SIGTERM to every process at once and reports the longest
// time one took to exit, and how many had to be killed after stopGrace.
func stopTimed(procs []*fleet.Proc) (longest time.Duration, killed int) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Go(func() {
			t0 := time.Now()
			err := p.Stop(stopGrace)
			d := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			longest = max(longest, d)
			if d >= stopGrace {
				killed++
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "stopping %s: %v\n", p.Name, err)
			}
		})
	}
	wg.Wait()
	return longest, killed
}

// readiness counts what of a cell is ready. asynq: servers registered in
// asynq:servers (each writes its first heartbeat as it starts polling).
// shaper: replicas subscribed to the wake-up channel, plus upstreams whose
// ready structure has the "a worker sleeps" flag that an empty take sets
// (so some replica has looked at it and gone to sleep), and nothing if the
// serve process does not answer /healthz yet.
func readiness(ctx context.Context, rdb *redis.Client, c string, n int, serveAddr string) (int64, error) {
	if c != shaperWork {
		return rdb.ZCard(ctx, "asynq:servers").Result()
	}
	resp, err := http.Get("http://" + serveAddr + "/healthz")
	if err != nil {
		return 0, nil
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, nil
	}
	subs, err := rdb.PubSubNumSub(ctx, jobstore.WakeChannel("")).Result()
	if err != nil {
		return 0, err
	}
	ready := subs[jobstore.WakeChannel("")]
	pipe := rdb.Pipeline()
	flags := make([]*redis.BoolCmd, n)
	for i := range n {
		flags[i] = pipe.HExists(ctx, sleepKey(queueName(i)), "sleep")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, err
	}
	for _, f := range flags {
		if f.Val() {
			ready++
		}
	}
	return ready, nil
}

// sleepKey is the hash of an upstream's ready structure that holds the
// "sleep" flag (P:s:{Q}:v in internal/jobstore's layout, beside its counts).
func sleepKey(upstream string) string {
	return strings.TrimSuffix(jobstore.For("", upstream).CountsKey(), "c") + "v"
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
		if r.Contender == shaperWork {
			// Nothing polls: a replica's cost is not per upstream.
			continue
		}
		if b, ok := base[r.Contender]; !ok || r.Expected < b.Expected {
			base[r.Contender] = r
		}
	}
	for i := range results {
		r := &results[i]
		b, ok := base[r.Contender]
		if !ok || r.Expected == b.Expected || b.CommandsPerSec <= 0 {
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
