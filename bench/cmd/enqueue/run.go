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
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/bench/internal/fleet"
	"github.com/shaperhq/shaper/bench/internal/machine"
	"github.com/shaperhq/shaper/bench/internal/redisproc"
	"github.com/shaperhq/shaper/bench/internal/redisstats"
	"github.com/shaperhq/shaper/bench/internal/stats"
	"github.com/shaperhq/shaper/queue"
)

type options struct {
	duration   time.Duration
	warmup     time.Duration
	rounds     int
	clients    int
	batch      int
	serve      []int
	profileDir string
}

func parseFlags(args []string) (options, error) {
	fs := flag.NewFlagSet("enqueue", flag.ContinueOnError)
	var o options
	var serve string
	fs.DurationVar(&o.duration, "duration", 2*time.Second, "length of one measurement")
	fs.DurationVar(&o.warmup, "warmup", 300*time.Millisecond, "unmeasured load before each measurement (connections, pools)")
	fs.IntVar(&o.rounds, "rounds", 5, "rounds; each measures every case, in a rotated order")
	fs.IntVar(&o.clients, "clients", 16, "concurrent client goroutines")
	fs.IntVar(&o.batch, "batch", 100, "jobs per batch request")
	fs.StringVar(&serve, "serve", "1,2", "numbers of `shaper serve` processes, comma-separated")
	fs.StringVar(&o.profileDir, "profile", "", "write CPU profiles of the serve processes and of this process into this directory (shaper then runs inside this executable)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	for _, f := range strings.Split(serve, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return o, fmt.Errorf("-serve %q: want positive integers", serve)
		}
		o.serve = append(o.serve, n)
	}
	if o.duration <= 0 || o.warmup < 0 || o.rounds < 1 || o.clients < 1 || o.batch < 1 || o.batch > 1000 {
		return o, errors.New("-duration, -rounds and -clients must be positive, -batch 1 to 1000")
	}
	return o, nil
}

// apiKey is the producer key the serve processes accept.
const apiKey = "bench-secret"

// upstreamName is the one upstream; no worker runs, jobs only pile up.
const upstreamName = "api"

// kase is one way of enqueueing: asynq's client, or shaper's API with one
// job or a batch per request, against some number of serve processes.
type kase struct {
	name  string
	serve int // 0 for asynq
	batch bool
}

type measurement struct {
	jobs     int64
	rate     float64
	redis    redisstats.Delta
	serveCPU time.Duration
	selfCPU  time.Duration
}

type bench struct {
	o       options
	redis   *redisproc.Server
	rdb     *redis.Client
	serves  []*fleet.Proc
	addrs   []string
	client  *http.Client
	single  []byte
	batched []byte
	payload []byte // asynq's task payload: a shaper job as stored
}

func run(ctx context.Context, args []string, out io.Writer) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "shaper-bench-enqueue-")
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
		shaper.ProfileInto(o.profileDir)
		f, err := os.Create(filepath.Join(o.profileDir, "bench.pprof"))
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	srv, err := redisproc.Start()
	if err != nil {
		return err
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 2 * o.clients})
	defer rdb.Close()

	b := &bench{o: o, redis: srv, rdb: rdb}
	b.buildBodies()
	cfg := filepath.Join(dir, "shaper.yaml")
	if err := os.WriteFile(cfg, []byte(config(srv.Addr)), 0o600); err != nil {
		return err
	}
	defer func() { fleet.StopAll(30*time.Second, b.serves...) }()
	for i := 0; i < slices.Max(o.serve); i++ {
		port, err := fleet.FreePort()
		if err != nil {
			return err
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		p, err := shaper.Start(fmt.Sprintf("serve-%d", i+1), []string{"SHAPER_KEY_BENCH=" + apiKey},
			"serve", "--config", cfg, "--listen", addr, "--log-level", "warn")
		if err != nil {
			return err
		}
		b.serves = append(b.serves, p)
		b.addrs = append(b.addrs, addr)
	}
	b.client = &http.Client{Transport: &http.Transport{
		MaxIdleConns: 4 * o.clients, MaxIdleConnsPerHost: 2 * o.clients, IdleConnTimeout: time.Minute, DisableCompression: true,
	}}
	for i, a := range b.addrs {
		if err := b.waitReady(a, b.serves[i]); err != nil {
			return err
		}
	}

	cases := []kase{{name: "asynq `Client.Enqueue`"}}
	for _, n := range o.serve {
		cases = append(cases, kase{name: "`POST /v1/jobs`", serve: n})
	}
	for _, n := range o.serve {
		cases = append(cases, kase{name: fmt.Sprintf("`POST /v1/jobs/batch` (%d per request)", o.batch), serve: n, batch: true})
	}

	start := time.Now()
	loadBefore := machine.Load()
	results := make([][]measurement, len(cases))
	for round := 0; round < o.rounds; round++ {
		for i := range cases {
			ci := (i + round) % len(cases)
			m, err := b.measure(ctx, cases[ci])
			if err != nil {
				return fmt.Errorf("%s with %d serve: %w", cases[ci].name, cases[ci].serve, err)
			}
			results[ci] = append(results[ci], m)
		}
		fmt.Fprintf(os.Stderr, "round %d/%d done after %v\n", round+1, o.rounds, time.Since(start).Round(time.Second))
	}

	fmt.Fprintf(out, "### Enqueue throughput\n\n")
	fmt.Fprintf(out, "Jobs accepted per second with %d concurrent client goroutines in this process, median (min–max) of %d rounds of %v (after %v of unmeasured load), "+
		"the contenders alternating. shaper: real `shaper serve` processes with admission on (capacity 1e9, refill 1e6/s, so nothing is refused), "+
		"the clients spread over them round-robin, every job answered 202. asynq: its own client on the same Redis with default options, "+
		"the payload a stored shaper job of the same size. Targets: single ≥ 0.5× asynq, batch ≥ 1×.\n\n",
		o.clients, o.rounds, o.duration, o.warmup)
	fmt.Fprintf(out, "| path | serve processes | jobs/s | × asynq | paired ratio: median (min–max) |\n| --- | ---: | ---: | ---: | ---: |\n")
	base := results[0]
	for i, c := range cases {
		rs := results[i]
		xs := rates(rs)
		serve := "–"
		ratio, paired := "1.00×", "–"
		if c.serve > 0 {
			serve = strconv.Itoa(c.serve)
			ratio = fmt.Sprintf("%.2f×", stats.Median(xs)/stats.Median(rates(base)))
			ps := make([]float64, len(rs))
			for j := range rs {
				ps[j] = rs[j].rate / base[j].rate
			}
			paired = fmt.Sprintf("%.2f× (%.2f–%.2f)", stats.Median(ps), slices.Min(ps), slices.Max(ps))
		}
		fmt.Fprintf(out, "| %s | %s | %.0f (%.0f–%.0f) | %s | %s |\n", c.name, serve, stats.Median(xs), slices.Min(xs), slices.Max(xs), ratio, paired)
	}

	fmt.Fprintf(out, "\nWhat one job costs, summed over all rounds and divided by the jobs accepted: Redis commands (those run inside scripts counted too; "+
		"\"scripts\" is script calls), and CPU in µs per job of the Redis server, the serve processes and this process (the clients).\n\n")
	fmt.Fprintf(out, "| path | serve | Redis cmds/job | scripts/job | Redis CPU | serve CPU | client CPU | commands per job (≥ 0.01) |\n")
	fmt.Fprintf(out, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for i, c := range cases {
		var sum measurement
		sum.redis.Calls = map[string]int64{}
		for _, m := range results[i] {
			sum.jobs += m.jobs
			for k, v := range m.redis.Calls {
				sum.redis.Calls[k] += v
			}
			sum.redis.CPU += m.redis.CPU
			sum.serveCPU += m.serveCPU
			sum.selfCPU += m.selfCPU
		}
		serve := "–"
		if c.serve > 0 {
			serve = strconv.Itoa(c.serve)
		}
		fmt.Fprintf(out, "| %s | %s | %.2f | %.2f | %.1f µs | %.1f µs | %.1f µs | %s |\n", c.name, serve,
			float64(sum.redis.Total())/float64(sum.jobs), float64(sum.redis.Scripts())/float64(sum.jobs),
			stats.Micros(sum.redis.CPU, sum.jobs), stats.Micros(sum.serveCPU, sum.jobs), stats.Micros(sum.selfCPU, sum.jobs), sum.redis.PerJob(sum.jobs, 0.01))
	}
	fmt.Fprintf(out, "\nMachine: %s. Load average before: %s; after: %s. Total time %v.\n",
		machine.Describe(srv.Version), loadBefore, machine.Load(), time.Since(start).Round(time.Second))
	fmt.Fprintf(out, "Command: `%s`\n", strings.TrimSpace("cd bench && go run ./cmd/enqueue "+strings.Join(args, " ")))
	return nil
}

func config(redisAddr string) string {
	return fmt.Sprintf(`redis: {url: "redis://%s/0"}
api:
  keys:
    - {name: bench, tenant: bench, key_env: SHAPER_KEY_BENCH}
  admission: {capacity: 1000000000, refill_per_second: 1000000}
upstreams:
  %s:
    base_url: "http://127.0.0.1:9"
    limits: [{rate: 100, per: 1s}]
    max_pending: 1000000000000
`, redisAddr, upstreamName)
}

// jobRequest is the body a producer sends for one job: a small JSON POST.
const jobRequest = `{"upstream":"api","method":"POST","path":"/v1/things/42","headers":{"Content-Type":"application/json"},"body":"{\"n\":42}"}`

func (b *bench) buildBodies() {
	b.single = []byte(jobRequest)
	var buf bytes.Buffer
	buf.WriteString(`{"jobs":[`)
	for i := 0; i < b.o.batch; i++ {
		if i > 0 {
			buf.WriteByte(',')
		}
		buf.WriteString(jobRequest)
	}
	buf.WriteString(`]}`)
	b.batched = buf.Bytes()
	// What serve stores for that request, so asynq moves as many bytes.
	job := &queue.Job{ID: queue.NewID("bench", upstreamName, "default"), Tenant: "bench", Upstream: upstreamName, Lane: "default",
		Method: "POST", Path: "/v1/things/42", Headers: map[string]string{"Content-Type": "application/json"},
		Body: []byte(`{"n":42}`), MaxAttempts: 8, CreatedAt: time.Now().UTC()}
	job.IdempotencyKey = job.ID
	b.payload, _ = queue.EncodeJob(job)
}

func (b *bench) waitReady(addr string, p *fleet.Proc) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := b.client.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if p.Exited() || time.Now().After(deadline) {
			return fmt.Errorf("%s not ready on %s; log:\n%s", p.Name, addr, p.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// measure runs one case: warm-up, then a measured stretch between two
// snapshots of Redis's counters and the processes' CPU.
func (b *bench) measure(ctx context.Context, c kase) (measurement, error) {
	var m measurement
	if err := b.rdb.FlushAll(ctx).Err(); err != nil {
		return m, err
	}
	var send func(ctx context.Context, worker int) (int64, error)
	if c.serve == 0 {
		ac := asynq.NewClientFromRedisClient(b.rdb)
		defer ac.Close()
		send = func(ctx context.Context, _ int) (int64, error) {
			_, err := ac.EnqueueContext(ctx, asynq.NewTask("bench:job", b.payload), asynq.Queue("bench.enqueue"))
			return 1, err
		}
	} else {
		addrs := b.addrs[:c.serve]
		send = func(ctx context.Context, worker int) (int64, error) {
			return b.post(ctx, addrs[worker%len(addrs)], c.batch)
		}
	}

	var counting atomic.Bool
	var stop atomic.Bool
	var jobs atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	for w := 0; w < b.o.clients; w++ {
		wg.Go(func() {
			for !stop.Load() {
				n, err := send(ctx, w)
				if err != nil {
					once.Do(func() { firstErr = err })
					stop.Store(true)
					return
				}
				if counting.Load() {
					jobs.Add(n)
				}
			}
		})
	}
	time.Sleep(b.o.warmup)
	before, err := redisstats.Take(b.redis)
	if err != nil {
		stop.Store(true)
		wg.Wait()
		return m, err
	}
	serveBefore, selfBefore := b.serveCPU(c.serve), cpu(fleet.SelfCPU())
	counting.Store(true)
	t0 := time.Now()
	time.Sleep(b.o.duration)
	counting.Store(false)
	elapsed := time.Since(t0)
	after, err := redisstats.Take(b.redis)
	serveAfter, selfAfter := b.serveCPU(c.serve), cpu(fleet.SelfCPU())
	stop.Store(true)
	wg.Wait()
	if firstErr != nil {
		return m, firstErr
	}
	if err != nil {
		return m, err
	}
	m.jobs = jobs.Load()
	m.rate = float64(m.jobs) / elapsed.Seconds()
	m.redis = after.Since(before)
	m.serveCPU = serveAfter - serveBefore
	m.selfCPU = selfAfter - selfBefore
	return m, nil
}

// post sends one request and checks that every job in it was accepted.
func (b *bench) post(ctx context.Context, addr string, batch bool) (int64, error) {
	url, body := "http://"+addr+"/v1/jobs", b.single
	if batch {
		url, body = url+"/batch", b.batched
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+apiKey)
	resp, err := b.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	if !batch {
		if resp.StatusCode != http.StatusAccepted {
			return 0, fmt.Errorf("POST /v1/jobs: %d %s", resp.StatusCode, data)
		}
		return 1, nil
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("POST /v1/jobs/batch: %d %s", resp.StatusCode, data)
	}
	var res struct {
		Results []struct {
			Status int `json:"status"`
		} `json:"results"`
	}
	if err := json.Unmarshal(data, &res); err != nil {
		return 0, fmt.Errorf("POST /v1/jobs/batch: %v", err)
	}
	for i, r := range res.Results {
		if r.Status != http.StatusAccepted {
			return 0, fmt.Errorf("POST /v1/jobs/batch: job %d answered %d: %s", i, r.Status, data)
		}
	}
	return int64(len(res.Results)), nil
}

// serveCPU is the CPU the first n serve processes have used; a process
// that cannot be read counts zero and shows up as an odd figure.
func (b *bench) serveCPU(n int) time.Duration {
	var sum time.Duration
	for _, p := range b.serves[:n] {
		sum += cpu(p.CPU())
	}
	return sum
}

func cpu(d time.Duration, err error) time.Duration {
	if err != nil {
		return 0
	}
	return d
}

func rates(ms []measurement) []float64 {
	out := make([]float64, len(ms))
	for i, m := range ms {
		out[i] = m.rate
	}
	return out
}
