// Command waiters measures what long polls cost: for each number of
// waiters it opens that many GET /v1/jobs/{id}?wait=60s on one `shaper
// serve`, each on a job that stays scheduled (so it waits the whole time),
// while other jobs are enqueued and finished by one `shaper work` at a
// steady rate, and reports the commands Redis serves per second (INFO
// commandstats deltas; commands inside scripts counted under their own
// names too), the PUBLISHes that announce final jobs, and serve's resident
// memory. Waiters cost Redis nothing while they wait: one PUBLISH per
// finish call wakes them through serve's one subscription. For scale it
// also measures what one GET costs Redis, so that the same waiters polling
// once a second can be read against it.
//
// It starts its own redis-server, builds shaper from this tree, and prints
// a markdown table, the machine it ran on and the exact command.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/bench/internal/fleet"
	"github.com/shaperhq/shaper/bench/internal/machine"
	"github.com/shaperhq/shaper/bench/internal/redisproc"
	"github.com/shaperhq/shaper/bench/internal/redisstats"
)

const apiKey = "waiters-bench-key"

type options struct {
	waiters []int
	window  time.Duration
	settle  time.Duration
	rate    int
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "waiters:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (options, error) {
	fs := flag.NewFlagSet("waiters", flag.ContinueOnError)
	var o options
	var ws string
	fs.StringVar(&ws, "waiters", "0,1000,10000", "numbers of long polls waiting at once, comma-separated")
	fs.DurationVar(&o.window, "window", 20*time.Second, "measuring window of each number (at most 50s: a long poll waits 60s)")
	fs.DurationVar(&o.settle, "settle", 3*time.Second, "wait after the long polls are open, before measuring (their first reads)")
	fs.IntVar(&o.rate, "rate", 100, "jobs enqueued and finished per second meanwhile")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	for _, f := range strings.Split(ws, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return o, fmt.Errorf("-waiters %q: want numbers from 0, comma-separated", ws)
		}
		o.waiters = append(o.waiters, n)
	}
	if o.window <= 0 || o.window+o.settle > 55*time.Second || o.rate <= 0 {
		return o, errors.New("-window must be positive and -window plus -settle under 55s; -rate positive")
	}
	return o, nil
}

// result is one number of waiters, measured.
type result struct {
	Waiters     int
	Answered    int64 // long polls answered before the window ended (should be 0)
	Finished    int64 // jobs finished in the window
	CommandsSec float64
	PublishSec  float64
	PerFinished float64 // commands per finished job
	ServeRSSMB  float64
	HeapMB      float64 // serve's go_memstats_heap_inuse_bytes
	StackMB     float64 // serve's go_memstats_stack_inuse_bytes
	Goroutines  float64
	ServeCPU    float64 // cores
	Top         string
}

func run(ctx context.Context, args []string, out io.Writer) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "shaper-bench-waiters-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintln(os.Stderr, "building shaper…")
	sh, err := fleet.Build(ctx, dir)
	if err != nil {
		return err
	}
	srv, err := redisproc.Start()
	if err != nil {
		return err
	}
	defer srv.Stop()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte(`{"ok":true}`))
	}))
	defer upstream.Close()
	port, err := fleet.FreePort()
	if err != nil {
		return err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cfg := filepath.Join(dir, "shaper.yaml")
	yaml := fmt.Sprintf(`redis: {url: "redis://%s/0"}
api:
  listen: %q
  keys:
    - {name: bench, tenant: bench, key_env: SHAPER_KEY_BENCH}
  admission: {capacity: 100000, refill_per_second: 100000}
upstreams:
  echo:
    base_url: %q
    limits: [{rate: 5000, per: 1s}]
`, srv.Addr, addr, upstream.URL)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		return err
	}
	env := []string{"SHAPER_KEY_BENCH=" + apiKey}
	serve, err := sh.Start("serve", env, "serve", "--config", cfg, "--log-level", "warn")
	if err != nil {
		return err
	}
	defer serve.Stop(10 * time.Second)
	work, err := sh.Start("work", env, "work", "--config", cfg, "--metrics-listen", "off", "--log-level", "warn")
	if err != nil {
		return err
	}
	defer work.Stop(10 * time.Second)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 20000, MaxConnsPerHost: 0, IdleConnTimeout: time.Minute}}
	if err := fleet.WaitReady(ctx, hc, addr, serve); err != nil {
		return err
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	a := &api{hc: hc, base: "http://" + addr, rdb: rdb}

	perGet, err := a.getCost(ctx, srv)
	if err != nil {
		return err
	}
	start := time.Now()
	loadBefore := machine.Load()
	var results []result
	for _, n := range o.waiters {
		fmt.Fprintf(os.Stderr, "%d waiters…\n", n)
		r, err := a.cell(ctx, srv, serve.Pid(), n, o)
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	fmt.Fprintf(out, "| waiters | Redis commands/s | of which PUBLISH/s | commands per finished job | jobs finished/s | serve RSS | heap + stacks in use | per waiter | goroutines | serve CPU | answered early |\n")
	fmt.Fprintf(out, "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range results {
		per := "–"
		if r.Waiters > 0 && results[0].Waiters == 0 {
			per = fmt.Sprintf("%.1f KB", (r.HeapMB+r.StackMB-results[0].HeapMB-results[0].StackMB)*1024/float64(r.Waiters))
		}
		fmt.Fprintf(out, "| %d | %.0f | %.1f | %.1f | %.0f | %.0f MB | %.1f MB | %s | %.0f | %.2f | %d |\n", r.Waiters, r.CommandsSec, r.PublishSec,
			r.PerFinished, float64(r.Finished)/o.window.Seconds(), r.ServeRSSMB, r.HeapMB+r.StackMB, per, r.Goroutines, r.ServeCPU, r.Answered)
	}
	fmt.Fprintln(out)
	for _, r := range results {
		fmt.Fprintf(out, "- %d waiters, commands/s: %s\n", r.Waiters, r.Top)
	}
	fmt.Fprintf(out, "\nOne GET /v1/jobs/{id} costs Redis %.0f commands: the same waiters polling once a second would cost that many per waiter per second (%.0f/s at 10,000).\n",
		perGet, perGet*10000)
	fmt.Fprintf(out, "\n%s; load %s at the start, %s at the end; %v in all.\n", machine.Describe(srv.Version), loadBefore,
		machine.Load(), time.Since(start).Round(time.Second))
	fmt.Fprintf(out, "Command: `go run ./cmd/waiters %s`\n", strings.Join(args, " "))
	return nil
}

type api struct {
	hc   *http.Client
	base string
	rdb  *redis.Client
}

func (a *api) do(ctx context.Context, method, path string, body any) (*http.Response, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return resp, raw, err
}

// enqueue stores n jobs in batches; a later notBefore keeps them waiting.
// Items refused 503 (a busy machine ran out the store budget) are sent
// again.
func (a *api) enqueue(ctx context.Context, n int, notBefore string) ([]string, error) {
	var ids []string
	for tries := 0; n > 0; tries++ {
		if tries > 100 {
			return nil, errors.New("enqueue: refused 503 a hundred times")
		}
		k := min(n, 200)
		jobs := make([]map[string]any, k)
		for i := range jobs {
			jobs[i] = map[string]any{"upstream": "echo", "method": "POST", "path": "/call"}
			if notBefore != "" {
				jobs[i]["not_before"] = notBefore
			}
		}
		resp, raw, err := a.do(ctx, "POST", "/v1/jobs/batch", map[string]any{"jobs": jobs})
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != 200 {
			return nil, fmt.Errorf("batch: %d %s", resp.StatusCode, raw)
		}
		var out struct {
			Results []struct {
				Status int `json:"status"`
				Job    struct {
					ID string `json:"id"`
				} `json:"job"`
			} `json:"results"`
		}
		if err := json.Unmarshal(raw, &out); err != nil {
			return nil, err
		}
		for _, r := range out.Results {
			switch r.Status {
			case 202:
				ids = append(ids, r.Job.ID)
				n--
			case 503:
			default:
				return nil, fmt.Errorf("batch item: status %d", r.Status)
			}
		}
		if len(out.Results) != k {
			return nil, fmt.Errorf("batch of %d: %d results", k, len(out.Results))
		}
		if n > 0 && len(ids)%200 != 0 {
			time.Sleep(100 * time.Millisecond)
		}
	}
	return ids, nil
}

// getCost is what one GET of a job costs Redis, in commands.
func (a *api) getCost(ctx context.Context, srv *redisproc.Server) (float64, error) {
	ids, err := a.enqueue(ctx, 1, time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	if err != nil {
		return 0, err
	}
	const n = 20
	time.Sleep(time.Second) // the enqueue's wake-ups settle
	before, err := redisstats.Take(srv)
	if err != nil {
		return 0, err
	}
	for range n {
		if _, _, err := a.do(ctx, "GET", "/v1/jobs/"+ids[0], nil); err != nil {
			return 0, err
		}
	}
	after, err := redisstats.Take(srv)
	if err != nil {
		return 0, err
	}
	return float64(after.Since(before).Total()) / n, nil
}

func (a *api) cell(ctx context.Context, srv *redisproc.Server, servePid, n int, o options) (result, error) {
	r := result{Waiters: n}
	ids, err := a.enqueue(ctx, n, time.Now().Add(24*time.Hour).UTC().Format(time.RFC3339))
	if err != nil {
		return r, err
	}
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var answered atomic.Int64
	for i, id := range ids {
		if i%250 == 249 {
			// Under the listen backlog: 10,000 dials at once would
			// overflow it.
			time.Sleep(25 * time.Millisecond)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, _, err := a.do(wctx, "GET", "/v1/jobs/"+id+"?wait=60s", nil)
			if err == nil && resp.StatusCode == 200 {
				answered.Add(1)
			}
		}()
	}
	defer func() {
		cancel()
		wg.Wait()
	}()
	time.Sleep(o.settle)

	// Jobs finish at o.rate a second meanwhile, enqueued one by one.
	fctx, fcancel := context.WithCancel(ctx)
	var fwg sync.WaitGroup
	fwg.Add(1)
	go func() {
		defer fwg.Done()
		tick := time.NewTicker(time.Second / time.Duration(o.rate))
		defer tick.Stop()
		job := map[string]any{"upstream": "echo", "method": "POST", "path": "/finish"}
		for {
			select {
			case <-fctx.Done():
				return
			case <-tick.C:
				a.do(fctx, "POST", "/v1/jobs", job)
			}
		}
	}()
	time.Sleep(time.Second) // the finisher reaches its pace
	before, err := take(srv)
	if err != nil {
		fcancel()
		return r, err
	}
	answeredBefore := answered.Load()
	processedBefore := processed(ctx, a.rdb)
	cpuBefore, _ := fleet.CPUOf(servePid)
	t0 := time.Now()
	time.Sleep(o.window)
	after, err := take(srv)
	secs := time.Since(t0).Seconds()
	cpuAfter, _ := fleet.CPUOf(servePid)
	r.ServeRSSMB = rssMB(servePid)
	if m, err := a.metrics(ctx); err == nil {
		r.HeapMB, r.StackMB = m["go_memstats_heap_inuse_bytes"]/(1<<20), m["go_memstats_stack_inuse_bytes"]/(1<<20)
		r.Goroutines = m["go_goroutines"]
	}
	r.Finished = processed(ctx, a.rdb) - processedBefore
	r.Answered = answered.Load() - answeredBefore
	fcancel()
	fwg.Wait()
	if err != nil {
		return r, err
	}
	d := after.Since(before)
	r.CommandsSec = float64(d.Total()) / secs
	r.PublishSec = float64(d.Calls["publish"]) / secs
	if r.Finished > 0 {
		r.PerFinished = float64(d.Total()) / float64(r.Finished)
	}
	r.ServeCPU = (cpuAfter - cpuBefore).Seconds() / secs
	var top []string
	for i, name := range d.Commands() {
		if i == 6 {
			break
		}
		top = append(top, fmt.Sprintf("%s %.0f", name, float64(d.Calls[name])/secs))
	}
	r.Top = strings.Join(top, ", ")
	return r, nil
}

// metrics reads serve's /metrics, the unlabelled samples.
func (a *api) metrics(ctx context.Context) (map[string]float64, error) {
	_, raw, err := a.do(ctx, "GET", "/metrics", nil)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(raw), "\n") {
		name, v, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(name, "#") || strings.Contains(name, "{") {
			continue
		}
		if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
			out[name] = f
		}
	}
	return out, nil
}

// take is redisstats.Take, tried again when a loaded machine makes its
// short dial time out.
func take(srv *redisproc.Server) (redisstats.Snapshot, error) {
	var err error
	for range 10 {
		var s redisstats.Snapshot
		if s, err = redisstats.Take(srv); err == nil {
			return s, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return redisstats.Snapshot{}, err
}

// processed is the echo upstream's asynq processed total: jobs finished.
// (One GET, in the window's count: noise.)
func processed(ctx context.Context, rdb *redis.Client) int64 {
	n, _ := rdb.Get(ctx, "asynq:{shaper.echo}:processed").Int64()
	return n
}

// rssMB is a process's resident memory (VmRSS), in MB.
func rssMB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}
