package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/bench/internal/fleet"
	"github.com/shaperhq/shaper/bench/internal/machine"
	"github.com/shaperhq/shaper/bench/internal/redisproc"
	"github.com/shaperhq/shaper/config"
	"github.com/shaperhq/shaper/fakeupstream"
	"github.com/shaperhq/shaper/queue"
)

// meter is the fake's nginx-like strict-spacing algorithm, named by its
// string so that this command builds on trees whose fakeupstream lacks it
// (the row is then skipped and the table says so).
const meter = fakeupstream.Algorithm("meter")

// meterBare is the meter answering as nginx's limit_req does with
// limit_req_status 429: a 429 with no Retry-After.
const meterBare = "meter-bare"

type options struct {
	sections        []string
	styles          []string
	algorithms      []fakeupstream.Algorithm
	rate            int
	replicas        int
	window          time.Duration
	hidden          int
	ceiling         int
	adaptiveWindow  time.Duration
	step            time.Duration
	settleWindow    time.Duration
	settleEstimate  int64
	settleUse       int64
	settleTokenRate int64
	enqueuers       int
}

func parseFlags(args []string) (options, error) {
	fs := flag.NewFlagSet("listen", flag.ContinueOnError)
	var o options
	var sections, styles, algs string
	fs.StringVar(&sections, "sections", "table,adaptive,settle", "sections to run, comma-separated")
	fs.StringVar(&styles, "styles", "plain,stripe,openai,ietf,meter,meter-bare", "table: upstream styles, comma-separated; meter is the plain style counted by -algorithm meter, meter-bare the bare style (nginx's own 429s)")
	fs.StringVar(&algs, "algorithms", "sliding_log,fixed_window,token_bucket", "table: the upstream's counting algorithms, comma-separated")
	fs.IntVar(&o.rate, "rate", 40, "table: the upstream's limit and shaper's, requests per second")
	fs.IntVar(&o.replicas, "replicas", 3, "shaper work processes")
	fs.DurationVar(&o.window, "window", 20*time.Second, "table: measuring window per case, from the first arrival")
	fs.IntVar(&o.hidden, "hidden", 40, "adaptive: the upstream's hidden limit, requests per second")
	fs.IntVar(&o.ceiling, "ceiling", 100, "adaptive: shaper's adaptive limit (its ceiling), requests per second")
	fs.DurationVar(&o.adaptiveWindow, "adaptive-window", 60*time.Second, "adaptive: measuring window")
	fs.DurationVar(&o.step, "step", 5*time.Second, "adaptive: the delivered rate is shown per step")
	fs.DurationVar(&o.settleWindow, "settle-window", 15*time.Second, "settle: measuring window per case")
	fs.Int64Var(&o.settleEstimate, "settle-estimate", 400, "settle: tokens each job reserves (its cost.tokens and max_tokens)")
	fs.Int64Var(&o.settleUse, "settle-use", 40, "settle: tokens each job really uses (X-Fake-Usage, reported in usage.total_tokens)")
	fs.Int64Var(&o.settleTokenRate, "settle-tokens", 2000, "settle: the upstream's token limit per second, and shaper's")
	fs.IntVar(&o.enqueuers, "enqueuers", 8, "goroutines filling the backlog")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.sections = strings.Split(sections, ",")
	for _, s := range o.sections {
		if !slices.Contains([]string{"table", "adaptive", "settle"}, s) {
			return o, fmt.Errorf("-sections: %q: want table, adaptive or settle", s)
		}
	}
	o.styles = strings.Split(styles, ",")
	for _, s := range o.styles {
		if s != string(meter) && s != meterBare && !slices.Contains(fakeupstream.Styles(), fakeupstream.Style(s)) {
			return o, fmt.Errorf("-styles: %q: want one of %v, meter or %s", s, fakeupstream.Styles(), meterBare)
		}
	}
	for _, a := range strings.Split(algs, ",") {
		alg := fakeupstream.Algorithm(a)
		if !slices.Contains([]fakeupstream.Algorithm{fakeupstream.SlidingLog, fakeupstream.FixedWindow, fakeupstream.TokenBucket}, alg) {
			return o, fmt.Errorf("-algorithms: %q: want sliding_log, fixed_window or token_bucket", a)
		}
		o.algorithms = append(o.algorithms, alg)
	}
	if o.rate < 1 || o.replicas < 1 || o.hidden < 1 || o.ceiling < 1 || o.enqueuers < 1 || o.settleTokenRate < 1 ||
		o.settleEstimate < 1 || o.settleUse < 1 || o.window <= 0 || o.adaptiveWindow <= 0 || o.step <= 0 || o.settleWindow <= 0 {
		return o, errors.New("every rate, count and window must be positive")
	}
	return o, nil
}

// bench is one run's world: a Redis and the shaper binary.
type bench struct {
	o      options
	redis  *redisproc.Server
	rdb    *redis.Client
	shaper *fleet.Shaper
	dir    string
}

func run(ctx context.Context, args []string, out io.Writer) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "shaper-bench-listen-")
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
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 4 * o.enqueuers})
	defer rdb.Close()
	b := &bench{o: o, redis: srv, rdb: rdb, shaper: sh, dir: dir}

	start := time.Now()
	for _, s := range o.sections {
		var err error
		load := machine.Load()
		switch s {
		case "table":
			err = b.table(ctx, out)
		case "adaptive":
			err = b.adaptive(ctx, out)
		case "settle":
			err = b.settle(ctx, out)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
		fmt.Fprintf(out, "Load average before: %s; after: %s.\n\n", load, machine.Load())
	}
	fmt.Fprintf(out, "Machine: %s. Total time %v.\n", machine.Describe(srv.Version), time.Since(start).Round(time.Second))
	fmt.Fprintf(out, "Command: `%s`\n", strings.TrimSpace("cd bench && go run ./cmd/listen "+strings.Join(args, " ")))
	return nil
}

// fake is the fake upstream served in this process, counting arrivals
// so that the first one can be waited for cheaply.
type fake struct {
	srv     *fakeupstream.Server
	hs      *http.Server
	url     string
	arrived atomic.Int64
}

func startFake(cfg fakeupstream.Config) (*fake, error) {
	srv, err := fakeupstream.New(cfg)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &fake{srv: srv, url: "http://" + ln.Addr().String()}
	f.hs = &http.Server{Handler: f, ReadHeaderTimeout: 10 * time.Second}
	go f.hs.Serve(ln)
	return f, nil
}

func (f *fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.arrived.Add(1)
	f.srv.ServeHTTP(w, r)
}

// drain is one measurement: an upstream, a config, a backlog, a window.
type drain struct {
	name   string
	fake   fakeupstream.Config
	limits string // the upstream's config below base_url, YAML at 4 spaces
	jobs   int
	job    func(i int) *queue.Job
	window time.Duration
}

// drained is what the upstream saw of one drain.
type drained struct {
	recs  []fakeupstream.Record
	first time.Duration
	rep   fakeupstream.Report
	logs  []string
}

// in counts the records with from <= At < to and, of them, the 429s.
func (d drained) in(from, to time.Duration) (n, rejected int) {
	for _, r := range d.recs {
		if r.At >= d.first+from && r.At < d.first+to {
			n++
			if r.Status == http.StatusTooManyRequests {
				rejected++
			}
		}
	}
	return n, rejected
}

// run drains a backlog through the replicas into a fresh fake upstream
// on a flushed Redis and returns what the upstream saw.
func (b *bench) run(ctx context.Context, c drain) (drained, error) {
	var res drained
	if err := b.rdb.FlushAll(ctx).Err(); err != nil {
		return res, err
	}
	f, err := startFake(c.fake)
	if err != nil {
		return res, err
	}
	defer f.hs.Close()
	y := fmt.Sprintf("redis: {url: \"redis://%s/0\"}\nwork: {metrics_listen: \"\", shutdown_timeout: 10s}\nupstreams:\n  api:\n    base_url: \"%s\"\n    max_pending: 100000000\n%s",
		b.redis.Addr, f.url, c.limits)
	path := filepath.Join(b.dir, c.name+".yaml")
	if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
		return res, err
	}
	cfg, err := config.Load(path, func(string) (string, bool) { return "", false })
	if err != nil {
		return res, fmt.Errorf("config:\n%s\n%w", y, err)
	}
	q, err := queue.New(b.rdb, queue.Config{Upstreams: cfg.AllUpstreams()})
	if err != nil {
		return res, err
	}
	defer q.Close()
	if err := b.fill(ctx, q, c.jobs, c.job); err != nil {
		return res, err
	}
	var ps []*fleet.Proc
	for i := 0; i < b.o.replicas; i++ {
		p, err := b.shaper.Start(fmt.Sprintf("%s-%d", c.name, i+1), nil, "work", "--config", path, "--log-level", "warn", "--metrics-listen", "off")
		if err != nil {
			fleet.StopAll(10*time.Second, ps...)
			return res, err
		}
		ps = append(ps, p)
	}
	deadline := time.Now().Add(30 * time.Second)
	for f.arrived.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if f.arrived.Load() == 0 {
		fleet.StopAll(10*time.Second, ps...)
		return res, errors.New("no request reached the upstream within 30s")
	}
	// Requests sent just before the window closes are still arriving.
	time.Sleep(c.window + 200*time.Millisecond)
	if err := fleet.StopAll(30*time.Second, ps...); err != nil {
		return res, err
	}
	for _, p := range ps {
		res.logs = append(res.logs, p.Log())
	}
	res.recs = f.srv.Records()
	res.first = res.recs[0].At
	res.rep = f.srv.Report()
	return res, nil
}

// fill enqueues n jobs made by mk from the enqueuers' goroutines.
func (b *bench) fill(ctx context.Context, q *queue.Queue, n int, mk func(i int) *queue.Job) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, b.o.enqueuers)
	for g := range errs {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if _, _, err := q.Enqueue(ctx, mk(i)); err != nil {
					errs[g] = err
					next.Store(int64(n))
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// post is a plain job, a small POST as to an API.
func post(i int) *queue.Job {
	return &queue.Job{Upstream: "api", Method: "POST", Path: fmt.Sprintf("/v1/things/%d", i),
		Headers: map[string]string{"Content-Type": "application/json"}, Body: fmt.Appendf(nil, `{"n":%d}`, i)}
}

// tableRow is one upstream style and algorithm at the limit.
type tableRow struct {
	style, alg string
	skipped    string
	received   int
	rejected   int64
	most       int
}

// table drains at exactly the upstream's limit for every style and
// algorithm.
func (b *bench) table(ctx context.Context, out io.Writer) error {
	var rows []tableRow
	for _, s := range b.o.styles {
		algs := b.o.algorithms
		style := fakeupstream.Style(s)
		switch s {
		case string(meter):
			algs, style = []fakeupstream.Algorithm{meter}, fakeupstream.StylePlain
		case meterBare:
			algs, style = []fakeupstream.Algorithm{meter}, fakeupstream.StyleBare
		}
		for _, alg := range algs {
			row := tableRow{style: s, alg: string(alg)}
			fc := fakeupstream.Config{Algorithm: alg, Rate: int64(b.o.rate), Per: time.Second, Style: style}
			if _, err := fakeupstream.New(fc); err != nil {
				row.skipped = err.Error()
				fmt.Fprintf(os.Stderr, "table %s × %s: skipped: %v\n", s, alg, err)
				rows = append(rows, row)
				continue
			}
			d, err := b.run(ctx, drain{
				name: fmt.Sprintf("table-%s-%s", s, alg), fake: fc,
				limits: fmt.Sprintf("    limits: [{rate: %d, per: 1s}]\n", b.o.rate),
				jobs:   int(float64(b.o.rate) * (b.o.window.Seconds() + 15) * 1.3), job: post, window: b.o.window,
			})
			if err != nil {
				return fmt.Errorf("%s × %s: %w", s, alg, err)
			}
			var window []time.Duration
			for _, r := range d.recs {
				if r.At >= d.first && r.At < d.first+b.o.window {
					window = append(window, r.At)
				}
			}
			row.received = len(window)
			row.rejected = d.rep.Rejected
			row.most = fakeupstream.MaxInWindow(window, time.Second)
			fmt.Fprintf(os.Stderr, "table %s × %s: %d received, %d×429\n", s, alg, row.received, row.rejected)
			rows = append(rows, row)
		}
	}
	fmt.Fprintf(out, "### At the limit, by upstream style and algorithm\n\n")
	fmt.Fprintf(out, "The fake upstream enforces %d requests per second (per its algorithm; token_bucket with its default capacity, %d) and answers in its style; "+
		"shaper is configured `{rate: %d, per: 1s}` (default 20 ms guard: a full backlog drains at most at %d × 1s/1.02s = 98%% of the limit). "+
		"%d `shaper work` processes, %v from the first arrival. 429s count the whole run.\n\n",
		b.o.rate, b.o.rate, b.o.rate, b.o.rate, b.o.replicas, b.o.window)
	fmt.Fprintf(out, "| upstream style | algorithm | received | achieved /s | of %d/s | 429s | most in any 1s |\n", b.o.rate)
	fmt.Fprintf(out, "| --- | --- | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rows {
		if r.skipped != "" {
			fmt.Fprintf(out, "| %s | %s | skipped: %s | | | | |\n", r.style, r.alg, r.skipped)
			continue
		}
		rate := float64(r.received) / b.o.window.Seconds()
		fmt.Fprintf(out, "| %s | %s | %d | %.1f | %.1f%% | %d | %d |\n", r.style, r.alg, r.received, rate, 100*rate/float64(b.o.rate), r.rejected, r.most)
	}
	fmt.Fprintln(out)
	return nil
}

// adaptive drains into an upstream whose limit is hidden behind bare 429s
// with an adaptive limit above it, and shows the delivered rate by step.
func (b *bench) adaptive(ctx context.Context, out io.Writer) error {
	d, err := b.run(ctx, drain{
		name:   "adaptive",
		fake:   fakeupstream.Config{Algorithm: fakeupstream.SlidingLog, Rate: int64(b.o.hidden), Per: time.Second, Style: fakeupstream.StyleBare},
		limits: fmt.Sprintf("    limits: [{rate: %d, per: 1s, adaptive: true}]\n", b.o.ceiling),
		jobs:   int(float64(b.o.ceiling)*(b.o.adaptiveWindow.Seconds()+15)) / 2, job: post, window: b.o.adaptiveWindow,
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "### Adaptive limit finding a hidden one\n\n")
	fmt.Fprintf(out, "The fake upstream admits %d requests per sliding second and says nothing about it: no rate-limit header, and a 429 with no Retry-After (`-style bare`). "+
		"shaper is configured `{rate: %d, per: 1s, adaptive: true}`; %d `shaper work` processes, %v from the first arrival.\n\n",
		b.o.hidden, b.o.ceiling, b.o.replicas, b.o.adaptiveWindow)
	fmt.Fprintf(out, "| seconds | sent /s | admitted /s | of %d/s | 429s |\n| --- | ---: | ---: | ---: | ---: |\n", b.o.hidden)
	for s := time.Duration(0); s < b.o.adaptiveWindow; s += b.o.step {
		e := min(s+b.o.step, b.o.adaptiveWindow)
		n, rej := d.in(s, e)
		span := (e - s).Seconds()
		fmt.Fprintf(out, "| %g–%g | %.1f | %.1f | %.1f%% | %d |\n", s.Seconds(), e.Seconds(), float64(n)/span, float64(n-rej)/span, 100*float64(n-rej)/span/float64(b.o.hidden), rej)
	}
	n, rej := d.in(0, b.o.adaptiveWindow)
	half := b.o.adaptiveWindow / 2
	ln, lrej := d.in(half, b.o.adaptiveWindow)
	fmt.Fprintf(out, "\nWhole run: %d requests, %d answered 429 (%.1f%%). Last %v: %.1f/s admitted, %.1f%% of %d/s.\n\n",
		n, rej, 100*float64(rej)/float64(max(n, 1)), half, float64(ln-lrej)/half.Seconds(), 100*float64(ln-lrej)/half.Seconds()/float64(b.o.hidden), b.o.hidden)
	return nil
}

// settle drains jobs that overstate their tokens tenfold, without and
// with settling the cost from the answer.
func (b *bench) settle(ctx context.Context, out io.Writer) error {
	o := b.o
	fc := fakeupstream.Config{Algorithm: fakeupstream.SlidingLog, Rate: 1000, Per: time.Second, Style: fakeupstream.StyleOpenAI,
		CostLimit: &fakeupstream.CostLimit{Name: "tokens", Rate: o.settleTokenRate, Per: time.Second}}
	// The burst is written out at 25% of the rate, the default a cost
	// limit gets from issue 9 on (at the older 1% a job of 400 tokens
	// could never fit 2,000 per second).
	limits := fmt.Sprintf("    limits:\n      - {rate: 1000, per: 1s}\n      - {rate: %d, per: 1s, cost: tokens, burst: %d}\n", o.settleTokenRate, o.settleTokenRate/4)
	job := func(i int) *queue.Job {
		return &queue.Job{Upstream: "api", Method: "POST", Path: "/v1/chat/completions",
			Headers: map[string]string{"Content-Type": "application/json", fakeupstream.UsageHeader: fmt.Sprint(o.settleUse)},
			Body:    fmt.Appendf(nil, `{"model":"m","max_tokens":%d,"n":%d}`, o.settleEstimate, i),
			Cost:    map[string]int64{"tokens": o.settleEstimate}}
	}
	best := float64(o.settleTokenRate) / float64(o.settleUse)
	type result struct {
		name     string
		answered int
		rejected int64
		d        drained
	}
	var rs []result
	for _, c := range []struct{ name, extra string }{
		{"without settle", ""},
		{"with settle", "    settle: {tokens: {json: /usage/total_tokens}}\n"},
	} {
		d, err := b.run(ctx, drain{
			name: "settle", fake: fc, limits: limits + c.extra,
			jobs: int(best * (o.settleWindow.Seconds() + 15)), job: job, window: o.settleWindow,
		})
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		n, rej := d.in(0, o.settleWindow)
		rs = append(rs, result{c.name, n - rej, d.rep.Rejected, d})
		fmt.Fprintf(os.Stderr, "settle %s: %d answered\n", c.name, n-rej)
	}
	fmt.Fprintf(out, "### Cost settled from the answer\n\n")
	fmt.Fprintf(out, "The fake upstream (`-style openai`) allows %d tokens and 1,000 requests per second and charges what a request used (`X-Fake-Usage: %d`), "+
		"reporting it in `usage.total_tokens`. Every job reserves `cost: {tokens: %d}` (and says `max_tokens: %d`). shaper: `{rate: 1000, per: 1s}` and "+
		"`{rate: %d, per: 1s, cost: tokens, burst: %d}`, with and without `settle: {tokens: {json: /usage/total_tokens}}`. "+
		"%d `shaper work` processes, %v each. The estimate alone allows %d/%d = %.0f jobs/s; what they use, %.0f.\n\n",
		o.settleTokenRate, o.settleUse, o.settleEstimate, o.settleEstimate, o.settleTokenRate, o.settleTokenRate/4, o.replicas, o.settleWindow,
		o.settleTokenRate, o.settleEstimate, float64(o.settleTokenRate)/float64(o.settleEstimate), best)
	fmt.Fprintf(out, "| | jobs/s | tokens used /s | of %d tokens/s | 429s |\n| --- | ---: | ---: | ---: | ---: |\n", o.settleTokenRate)
	for _, r := range rs {
		jobs := float64(r.answered) / o.settleWindow.Seconds()
		used := jobs * float64(o.settleUse)
		fmt.Fprintf(out, "| %s | %.1f | %.0f | %.1f%% | %d |\n", r.name, jobs, used, 100*used/float64(o.settleTokenRate), r.rejected)
	}
	if len(rs) == 2 && rs[0].answered > 0 {
		fmt.Fprintf(out, "\nGain: %.1f×.\n", float64(rs[1].answered)/float64(rs[0].answered))
	}
	fmt.Fprintln(out)
	return nil
}
