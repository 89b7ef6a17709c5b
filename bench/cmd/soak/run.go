package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
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
	"github.com/shaperhq/shaper/fakeupstream"
)

type options struct {
	rate       int           // jobs enqueued per second
	limit      int           // the upstream's limit and shaper's, per second
	duration   time.Duration // how long the producer runs
	sample     time.Duration
	workers    int
	algorithm  fakeupstream.Algorithm
	retention  time.Duration // result_retention
	keep       int           // result_max_count
	idemWindow time.Duration // idempotency_window
	maxBacklog int64         // a backlog above this at the end means the drain fell behind
}

func parseFlags(args []string) (options, error) {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	var o options
	var alg string
	var headroom float64
	fs.IntVar(&o.rate, "rate", 200, "jobs enqueued per second, open loop")
	fs.Float64Var(&headroom, "headroom", 0.05, "the upstream's limit (and shaper's) is this fraction above -rate, rounded up: shaper drains a full backlog at 98% of its limit (the 20ms guard), so a limit equal to the rate could not keep up")
	fs.DurationVar(&o.duration, "duration", 30*time.Minute, "how long the producer runs")
	fs.DurationVar(&o.sample, "sample", 30*time.Second, "time between samples")
	fs.IntVar(&o.workers, "workers", 4, "`shaper work` processes")
	fs.StringVar(&alg, "algorithm", string(fakeupstream.SlidingLog), "the upstream's counting algorithm: sliding_log or token_bucket")
	fs.DurationVar(&o.retention, "retention", time.Minute, "result_retention (dead_retention is twice it)")
	fs.IntVar(&o.keep, "keep", 0, "result_max_count; 0 means 30 s of -rate")
	fs.DurationVar(&o.idemWindow, "idempotency-window", 2*time.Minute, "idempotency_window")
	fs.Int64Var(&o.maxBacklog, "max-backlog", 0, "a backlog above this at the end fails the run; 0 means 5 s of -rate")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.algorithm = fakeupstream.Algorithm(alg)
	if o.algorithm != fakeupstream.SlidingLog && o.algorithm != fakeupstream.TokenBucket {
		return o, fmt.Errorf("-algorithm %q: want sliding_log or token_bucket", alg)
	}
	if o.rate < 1 || o.workers < 1 || o.duration <= 0 || o.sample <= 0 || o.retention <= 0 || o.idemWindow <= 0 || headroom < 0 || o.keep < 0 || o.maxBacklog < 0 {
		return o, errors.New("-rate, -workers, -duration, -sample, -retention and -idempotency-window must be positive; -headroom, -keep and -max-backlog not negative")
	}
	o.limit = int(math.Ceil(float64(o.rate) * (1 + headroom)))
	if o.keep == 0 {
		o.keep = 30 * o.rate
	}
	if o.maxBacklog == 0 {
		o.maxBacklog = 5 * int64(o.rate)
	}
	return o, nil
}

// Names in the generated config.
const (
	apiKey = "soak-secret"
	keyEnv = "SHAPER_KEY_SOAK"
)

func shaperConfig(o options, redisAddr, upstreamURL string) string {
	return fmt.Sprintf(`redis: {url: "redis://%s/0"}
api:
  keys:
    - {name: soak, tenant: soak, key_env: %s}
  # Far above the producer's rate: admission must never refuse it.
  admission: {capacity: %d, refill_per_second: %d}
work: {metrics_listen: "", shutdown_timeout: 10s}
upstreams:
  api:
    base_url: "%s"
    limits: [{rate: %d, per: 1s}]
    # A minute of the rate: beyond it enqueues get 503, which the run counts.
    max_pending: %d
    result_retention: %s
    result_max_count: %d
    dead_retention: %s
    dead_max_count: %d
    idempotency_window: %s
`, redisAddr, keyEnv, 10*o.rate, 4*o.rate, upstreamURL, o.limit, 60*o.rate,
		o.retention, o.keep, 2*o.retention, o.keep, o.idemWindow)
}

// plateauBy estimates when every bound is reached: a succeeded job is kept
// until result_max_count pushes it out or result_retention ends, then its
// idempotency record lives idempotency_window and up to a twelfth of it
// more (two buckets of a 24th).
func plateauBy(o options) time.Duration {
	kept := min(o.retention, time.Duration(float64(o.keep)/float64(o.rate)*float64(time.Second)))
	return kept + o.idemWindow + o.idemWindow/12
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) (failed bool, err error) {
	o, err := parseFlags(args)
	if err != nil {
		return false, err
	}
	logf := func(format string, a ...any) {
		fmt.Fprintf(stderr, "soak %s: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, a...))
	}
	dir, err := os.MkdirTemp("", "shaper-bench-soak-")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(dir)
	logf("building shaper…")
	bin, err := fleet.Build(ctx, dir)
	if err != nil {
		return false, err
	}
	srv, err := redisproc.Start()
	if err != nil {
		return false, err
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 2})
	defer rdb.Close()
	// An evicted key is a lost job: the soak runs Redis as
	// docs/operations.md, Sizing Redis, says to, and checks that it does.
	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		return false, err
	}
	if pol, err := rdb.ConfigGet(ctx, "maxmemory-policy").Result(); err != nil || pol["maxmemory-policy"] != "noeviction" {
		return false, fmt.Errorf("maxmemory-policy is %v (%v), want noeviction", pol, err)
	}

	up, err := startUpstream(fakeupstream.Config{Algorithm: o.algorithm, Rate: int64(o.limit), Per: time.Second,
		Style: fakeupstream.StylePlain, MaxRecords: 10_000})
	if err != nil {
		return false, err
	}
	defer up.close()

	cfgPath := filepath.Join(dir, "shaper.yaml")
	cfg := shaperConfig(o, srv.Addr, up.url)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return false, err
	}
	port, err := fleet.FreePort()
	if err != nil {
		return false, err
	}
	apiAddr := "127.0.0.1:" + strconv.Itoa(port)
	serve, err := bin.Start("serve", []string{keyEnv + "=" + apiKey}, "serve", "--config", cfgPath, "--listen", apiAddr, "--log-level", "warn")
	if err != nil {
		return false, err
	}
	defer serve.Kill()
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		MaxIdleConnsPerHost: 2 * senders, IdleConnTimeout: time.Minute, DisableCompression: true}}
	if err := fleet.WaitReady(ctx, client, apiAddr, serve); err != nil {
		return false, err
	}
	var workers []*fleet.Proc
	defer func() {
		for _, w := range workers {
			w.Kill()
		}
	}()
	for i := range o.workers {
		w, err := bin.Start(fmt.Sprintf("work-%d", i+1), nil, "work", "--config", cfgPath, "--log-level", "warn")
		if err != nil {
			return false, err
		}
		workers = append(workers, w)
	}

	fmt.Fprintf(stdout, "## Soak: %d jobs/s for %v, %d workers\n\n", o.rate, o.duration, o.workers)
	fmt.Fprintf(stdout, "The upstream (fakeupstream, %s, in this process) admits %d requests per 1s and answers a 50-byte JSON body; "+
		"shaper is configured `{rate: %d, per: 1s}`, so any 429 is shaper exceeding its limit. "+
		"The producer sends %d `POST /v1/jobs`/s open loop (bodies of ~100 bytes, each with an idempotency key). "+
		"Bounds: result_retention %v, result_max_count %d, dead_retention %v, idempotency_window %v, max_pending %d; "+
		"every bound should be reached, and used_memory level, after about %v. Redis runs with maxmemory-policy noeviction.\n\n",
		o.algorithm, o.limit, o.limit, o.rate, o.retention, o.keep, 2*o.retention, o.idemWindow, 60*o.rate, plateauBy(o).Round(time.Second))
	logf("config:\n%s", cfg)
	logf("serve on %s, %d workers, upstream %s; producing %d/s for %v, expecting the plateau after about %v",
		apiAddr, o.workers, up.url, o.rate, o.duration, plateauBy(o).Round(time.Second))

	loadBefore := machine.Load()
	prod := &producer{url: "http://" + apiAddr + "/v1/jobs", key: apiKey, rate: o.rate,
		run: strconv.FormatInt(time.Now().Unix(), 36), client: client}
	pctx, stopProducer := context.WithTimeout(ctx, o.duration)
	defer stopProducer()
	redisCPU0, _ := redisstats.Take(srv)
	selfCPU0, _ := fleet.SelfCPU()
	t0 := time.Now()
	produced := prod.start(pctx)
	st := &stalls{}
	stopStalls := make(chan struct{})
	defer close(stopStalls)
	go st.run(stopStalls, t0)

	// 429s are looked up in the upstream's records as soon as a sample
	// sees them, while the records (the last 10,000 arrivals) still hold
	// them.
	offset := t0.Sub(up.fake.Started())
	var refs []refusal
	lastSeq, lastRejected := int64(-1), int64(0)
	findRefusals := func(rejected int64) {
		if rejected <= lastRejected {
			return
		}
		lastRejected = rejected
		var found []refusal
		found, lastSeq = refusalsIn(up.fake.Records(), lastSeq, offset)
		for i := range found {
			found[i].Stall = st.near(found[i].At, time.Second)
		}
		if len(found) > 0 {
			logf("429: %s", describeRefusals(found, o.limit))
		}
		refs = append(refs, found...)
	}

	var samples []sample
	take := func() sample {
		s := collect(ctx, time.Since(t0), rdb, srv, serve, workers, prod, up, client, apiAddr)
		samples = append(samples, s)
		findRefusals(s.Rejected)
		note := ""
		if s.BacklogNote != "" {
			note = " (backlog: " + s.BacklogNote + ")"
		}
		logf("%v: used_memory %s MB, rss %s MB, keys %d; serve %s MB, workers %s MB; enqueued %d, refused %d, lag %d; admitted %d, 429s %d; backlog %d%s",
			s.At.Round(time.Second), mb(s.UsedMemory), mb(s.RedisRSS), s.Keys, mb(s.ServeRSS), joinMB(s.WorkerRSS),
			s.Enqueued, s.Refused, s.Lag, s.Admitted, s.Rejected, s.Backlog, note)
		return s
	}
	tick := time.NewTicker(o.sample)
	defer tick.Stop()
	var crashed error
loop:
	for {
		select {
		case <-pctx.Done():
			break loop
		case <-tick.C:
			take()
			if serve.Exited() {
				crashed = fmt.Errorf("serve exited: %v", serve.Wait())
				break loop
			}
			for _, w := range workers {
				if w.Exited() {
					crashed = fmt.Errorf("%s exited: %v", w.Name, w.Wait())
					break loop
				}
			}
		}
	}
	interrupted := ctx.Err() != nil
	// The last sample is taken with the producer still at its rate, so
	// that the backlog at the end is the steady one.
	if !interrupted && crashed == nil && (len(samples) == 0 || time.Since(t0)-samples[len(samples)-1].At > o.sample/10) {
		take()
	}
	stopProducer()
	<-produced
	elapsed := time.Since(t0)
	cpu := cpuShares(elapsed, srv, serve, workers, redisCPU0, selfCPU0)
	loadAfter := machine.Load()
	stopErr := fleet.StopAll(15*time.Second, append([]*fleet.Proc{serve}, workers...)...)

	rep := up.fake.Report()
	findRefusals(rep.Rejected)
	res := result{o: o, samples: samples, elapsed: elapsed, refusals: prod.refusals(), report: rep, cpu: cpu, rejections: refs}
	failed = res.write(stdout)
	fmt.Fprintf(stdout, "\nMachine: %s. Load average before: %s; after: %s.\n", machine.Describe(srv.Version), loadBefore, loadAfter)
	fmt.Fprintf(stdout, "Command: `%s`\n", strings.TrimSpace("cd bench && go run ./cmd/soak "+strings.Join(args, " ")))
	if interrupted {
		fmt.Fprintf(stdout, "\nInterrupted after %v: the figures cover that much.\n", elapsed.Round(time.Second))
		failed = true
	}
	if err := errors.Join(crashed, stopErr); err != nil {
		return true, err
	}
	return failed, nil
}

// collect takes one sample. A figure that cannot be read is left at zero
// and said so on stderr by the caller's line (backlog) or here.
func collect(ctx context.Context, at time.Duration, rdb *redis.Client, srv *redisproc.Server, serve *fleet.Proc,
	workers []*fleet.Proc, prod *producer, up *upstream, client *http.Client, apiAddr string) sample {
	s := sample{At: at, Enqueued: prod.enqueued.Load(), Refused: prod.refused.Load(), Lag: prod.lag()}
	rep := up.fake.Report()
	s.Admitted, s.Rejected = rep.ByStatus[http.StatusOK], rep.Rejected
	if info, err := srv.Info("memory"); err == nil {
		s.UsedMemory, _ = strconv.ParseInt(info["used_memory"], 10, 64)
		s.RedisRSS, _ = strconv.ParseInt(info["used_memory_rss"], 10, 64)
	} else {
		fmt.Fprintf(os.Stderr, "soak: INFO memory: %v\n", err)
	}
	if n, err := rdb.DBSize(ctx).Result(); err == nil {
		s.Keys = n
	}
	s.ServeRSS, _ = rssOf(serve.Pid())
	for _, w := range workers {
		r, _ := rssOf(w.Pid())
		s.WorkerRSS = append(s.WorkerRSS, r)
	}
	s.SelfRSS, _ = rssOf(os.Getpid())
	s.Backlog, s.BacklogNote = backlog(ctx, client, apiAddr)
	return s
}

// cpuShares says how much of one core each kind of process used while the
// producer ran (serve and the workers from their start, a few seconds
// more): on a small machine it says which one sets the ceiling.
func cpuShares(elapsed time.Duration, srv *redisproc.Server, serve *fleet.Proc, workers []*fleet.Proc,
	redis0 redisstats.Snapshot, self0 time.Duration) string {
	pct := func(d time.Duration) string { return fmt.Sprintf("%.0f%%", 100*d.Seconds()/elapsed.Seconds()) }
	var parts []string
	if c, err := serve.CPU(); err == nil {
		parts = append(parts, "serve "+pct(c))
	}
	var sum time.Duration
	for _, w := range workers {
		c, _ := w.CPU()
		sum += c
	}
	parts = append(parts, fmt.Sprintf("workers %s (%d together)", pct(sum), len(workers)))
	if r, err := redisstats.Take(srv); err == nil {
		parts = append(parts, "Redis "+pct(r.Since(redis0).CPU))
	}
	if c, err := fleet.SelfCPU(); err == nil {
		parts = append(parts, "harness (producer and upstream) "+pct(c-self0))
	}
	return strings.Join(parts, ", ")
}

// backlog reads the upstream's unfinished jobs from serve, as a user's
// dashboard would.
func backlog(ctx context.Context, client *http.Client, apiAddr string) (int64, string) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+apiAddr+"/v1/upstreams/api", nil)
	if err != nil {
		return 0, err.Error()
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	resp, err := client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, resp.Status
	}
	var st struct {
		Backlog struct {
			Total int64 `json:"total"`
		} `json:"backlog"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return 0, err.Error()
	}
	return st.Backlog.Total, ""
}

func joinMB(bs []int64) string {
	parts := make([]string, len(bs))
	for i, b := range bs {
		parts[i] = mb(b)
	}
	return strings.Join(parts, "/")
}
