// Command schedules measures what schedules cost an idle fleet: Redis
// commands per second with 10 and with 10,000 schedules (none due in the
// window), over real `shaper serve` and `shaper work` processes. Every
// replica asks Redis for due schedules once per pass (a calendar: one
// sorted set by next tick), so the figure should not move with the
// number of schedules.
//
//	cd bench && flock /tmp/shaper-bench.lock go run ./cmd/schedules
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/bench/internal/fleet"
	"github.com/shaperhq/shaper/bench/internal/machine"
	"github.com/shaperhq/shaper/bench/internal/redisproc"
	"github.com/shaperhq/shaper/bench/internal/redisstats"
	"github.com/shaperhq/shaper/schedule"
)

type options struct {
	counts   []int
	work     int
	serve    int
	window   time.Duration
	settle   time.Duration
	schedule string
}

func main() {
	fleet.ServeChild()
	var o options
	var counts string
	flag.StringVar(&counts, "schedules", "0,10,10000", "numbers of schedules, comma-separated")
	flag.IntVar(&o.work, "work", 2, "shaper work replicas")
	flag.IntVar(&o.serve, "serve", 1, "shaper serve replicas")
	flag.DurationVar(&o.window, "window", 30*time.Second, "measurement window")
	flag.DurationVar(&o.settle, "settle", 5*time.Second, "wait after the replicas are ready, before measuring")
	flag.StringVar(&o.schedule, "cron", "0 3 1 1 *", "every schedule's cron (not due within the window)")
	flag.Parse()
	for _, c := range strings.Split(counts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil {
			fmt.Fprintln(os.Stderr, "-schedules:", err)
			os.Exit(2)
		}
		o.counts = append(o.counts, n)
	}
	if err := run(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "schedules:", err)
		os.Exit(1)
	}
}

type result struct {
	n         int
	perSecond float64
	scripts   float64
	cpu       time.Duration
	busiest   string
}

func run(ctx context.Context, o options) error {
	dir, err := os.MkdirTemp("", "shaper-bench-schedules-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sh, err := fleet.Build(ctx, dir)
	if err != nil {
		return err
	}
	loadBefore := machine.Load()
	var rows []result
	var version string
	for _, n := range o.counts {
		r, v, err := measure(ctx, o, sh, dir, n)
		if err != nil {
			return err
		}
		version = v
		rows = append(rows, r)
	}
	fmt.Printf("| schedules | commands/s | script calls/s | Redis CPU | busiest commands (per s) |\n| ---: | ---: | ---: | ---: | --- |\n")
	for _, r := range rows {
		fmt.Printf("| %d | %.1f | %.1f | %.2f%% | %s |\n", r.n, r.perSecond, r.scripts,
			100*r.cpu.Seconds()/o.window.Seconds(), r.busiest)
	}
	fmt.Printf("\n%d × `shaper serve` + %d × `shaper work`, nothing queued, every schedule %q (none due), measured over %v after %v; %s; load %s before, %s after.\n",
		o.serve, o.work, o.schedule, o.window, o.settle, machine.Describe(version), loadBefore, machine.Load())
	fmt.Printf("Command: `cd bench && flock /tmp/shaper-bench.lock go run ./cmd/schedules %s`\n", strings.Join(os.Args[1:], " "))
	return nil
}

func measure(ctx context.Context, o options, sh *fleet.Shaper, dir string, n int) (result, string, error) {
	res := result{n: n}
	srv, err := redisproc.Start()
	if err != nil {
		return res, "", err
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	cfg := filepath.Join(dir, fmt.Sprintf("schedules-%d.yaml", n))
	yaml := fmt.Sprintf(`redis: {url: "redis://%s/0"}
api: {keys: [{name: bench, tenant: bench, key_env: SHAPER_KEY_BENCH}]}
work: {metrics_listen: "", shutdown_timeout: 5s}
upstreams:
  reports: {base_url: "http://127.0.0.1:9", limits: [{rate: 10, per: 1s}]}
`, srv.Addr)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		return res, "", err
	}
	st := schedule.NewStore(rdb, schedule.Config{})
	job, _ := json.Marshal(map[string]string{"upstream": "reports", "method": "POST", "path": "/v1/run"})
	for i := range n {
		if _, err := st.Create(ctx, &schedule.Schedule{Name: fmt.Sprintf("s%05d", i), Tenant: "bench", Cron: o.schedule, Job: job}); err != nil {
			return res, "", err
		}
	}
	var procs []*fleet.Proc
	defer func() { fleet.StopAll(10*time.Second, procs...) }()
	for i := range o.serve {
		port, err := fleet.FreePort()
		if err != nil {
			return res, "", err
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		p, err := sh.Start(fmt.Sprintf("serve-%d-%d", n, i), []string{"SHAPER_KEY_BENCH=bench-key"},
			"serve", "--config", cfg, "--listen", addr, "--log-level", "warn")
		if err != nil {
			return res, "", err
		}
		procs = append(procs, p)
		if err := fleet.WaitReady(ctx, http.DefaultClient, addr, p); err != nil {
			return res, "", err
		}
	}
	for i := range o.work {
		p, err := sh.Start(fmt.Sprintf("work-%d-%d", n, i), nil, "work", "--config", cfg, "--log-level", "warn", "--metrics-listen", "off")
		if err != nil {
			return res, "", err
		}
		procs = append(procs, p)
	}
	time.Sleep(o.settle)
	before, err := redisstats.Take(srv)
	if err != nil {
		return res, "", err
	}
	time.Sleep(o.window)
	after, err := redisstats.Take(srv)
	if err != nil {
		return res, "", err
	}
	d := after.Since(before)
	secs := o.window.Seconds()
	res.perSecond = float64(d.Total()) / secs
	res.scripts = float64(d.Scripts()) / secs
	res.cpu = d.CPU
	var parts []string
	for i, name := range d.Commands() {
		if i == 5 {
			break
		}
		parts = append(parts, fmt.Sprintf("%s %.1f", name, float64(d.Calls[name])/secs))
	}
	res.busiest = strings.Join(parts, ", ")
	if got, _ := rdb.ZCard(ctx, "shaper:{schedules}:cal").Result(); got != int64(n) {
		return res, "", fmt.Errorf("%d schedules made, %d in the calendar", n, got)
	}
	return res, srv.Version, nil
}
