package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shaperhq/shaper/bench/internal/fleet"
	"github.com/shaperhq/shaper/bench/internal/machine"
	"github.com/shaperhq/shaper/bench/internal/redisproc"
	"github.com/shaperhq/shaper/bench/internal/stats"
)

// The reverse-proxy child: this executable, told by the environment to
// serve httputil.ReverseProxy at envListen in front of envTarget.
const (
	roleReverseProxy = "reverseproxy"
	envListen        = "SHAPER_BENCH_LISTEN"
	envTarget        = "SHAPER_BENCH_TARGET"
)

// benchKey is the shaper key the calls carry; the other targets ignore it.
const benchKey = "bench-proxy-key"

// requestBody is a small chat completion request, as an SDK sends it.
const requestBody = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16}`

// answerBody is the upstream's answer, about the size of a short
// completion.
const answerBody = `{"id":"chatcmpl-bench","object":"chat.completion","created":1767225600,"model":"gpt-4o-mini",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you today?"},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":10,"completion_tokens":9,"total_tokens":19}}` + "\n"

type options struct {
	sections     []string
	rounds       int
	latencyCalls int
	duration     time.Duration
	concurrency  int
	nginx        bool
	profileDir   string
}

func parseFlags(args []string) (options, error) {
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	var o options
	var sections string
	fs.StringVar(&sections, "sections", "latency,throughput", "sections to run, comma-separated")
	fs.IntVar(&o.rounds, "rounds", 5, "paired rounds per section")
	fs.IntVar(&o.latencyCalls, "latency-calls", 2000, "latency: calls per target per round, one after another")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "throughput: time per target per round")
	fs.IntVar(&o.concurrency, "concurrency", 32, "throughput: callers at once")
	fs.BoolVar(&o.nginx, "nginx", true, "throughput: include nginx proxy_pass when nginx is installed")
	fs.StringVar(&o.profileDir, "profile", "", "write shaper serve's CPU profile to this directory as serve.pprof")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.sections = strings.Split(sections, ",")
	for _, s := range o.sections {
		if s != "latency" && s != "throughput" {
			return o, fmt.Errorf("-sections: %q: want latency or throughput", s)
		}
	}
	if o.rounds < 1 || o.latencyCalls < 1 || o.duration <= 0 || o.concurrency < 1 {
		return o, errors.New("rounds, latency-calls, duration and concurrency must be positive")
	}
	return o, nil
}

// target is one way to reach the upstream: its chat completions URL.
type target struct {
	name string
	url  string
	proc *fleet.Proc // nil for the upstream itself
}

func run(ctx context.Context, args []string, out io.Writer) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "shaper-bench-proxy-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	up, err := startUpstream()
	if err != nil {
		return err
	}
	defer up.Close()
	upURL := "http://" + up.Addr().String()

	fmt.Fprintln(os.Stderr, "building shaper…")
	sh, err := fleet.Build(ctx, dir)
	if err != nil {
		return err
	}
	if o.profileDir != "" {
		sh.ProfileInto(o.profileDir)
	}
	rs, err := redisproc.Start()
	if err != nil {
		return err
	}
	defer rs.Stop()

	client := &http.Client{Transport: &http.Transport{
		MaxIdleConns:        4 * o.concurrency,
		MaxIdleConnsPerHost: 2 * o.concurrency,
		DisableCompression:  true,
		IdleConnTimeout:     time.Minute,
	}}
	shaperT, err := startShaper(ctx, sh, client, dir, rs.Addr, upURL)
	if err != nil {
		return err
	}
	defer shaperT.proc.Stop(10 * time.Second)
	rpT, err := startReverseProxy(ctx, client, upURL)
	if err != nil {
		return err
	}
	defer rpT.proc.Stop(10 * time.Second)
	direct := target{name: "direct", url: upURL + "/v1/chat/completions"}
	targets := []target{direct, rpT, shaperT}
	if o.nginx {
		ng, err := startNginx(ctx, client, dir, up.Addr().String())
		switch {
		case errors.Is(err, exec.ErrNotFound):
			fmt.Fprintln(os.Stderr, "nginx is not installed: its row is left out (apt-get install nginx)")
		case err != nil:
			return err
		default:
			defer ng.proc.Stop(10 * time.Second)
			targets = append(targets, ng)
		}
	}
	// Warm every path's connections and shaper's scripts.
	for _, t := range targets {
		if _, err := latencies(ctx, client, t, 200); err != nil {
			return err
		}
	}

	start := time.Now()
	for _, s := range o.sections {
		load := machine.Load()
		var err error
		switch s {
		case "latency":
			err = latencySection(ctx, out, o, client, direct, shaperT, rs)
		case "throughput":
			err = throughputSection(ctx, out, o, client, targets, rs)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
		fmt.Fprintf(out, "Load average before: %s; after: %s.\n\n", load, machine.Load())
	}
	fmt.Fprintf(out, "Upstream answered %d calls. Machine: %s. Total time %v.\n", up.calls.Load(), machine.Describe(rs.Version), time.Since(start).Round(time.Second))
	fmt.Fprintf(out, "Command: `%s`\n", strings.TrimSpace("cd bench && go run ./cmd/proxy "+strings.Join(args, " ")))
	return nil
}

// upstream answers every request with answerBody at once.
type upstream struct {
	net.Listener
	calls atomic.Int64
}

func startUpstream() (*upstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &upstream{Listener: ln}
	body := []byte(answerBody)
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		u.calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Write(body)
	})}
	go srv.Serve(ln)
	return u, nil
}

// startShaper runs `shaper serve` proxying upstream openai to upURL, with a
// limit and an admission far above anything this machine reaches.
func startShaper(ctx context.Context, sh *fleet.Shaper, client *http.Client, dir, redisAddr, upURL string) (target, error) {
	cfg := filepath.Join(dir, "shaper.yaml")
	yaml := fmt.Sprintf(`
redis: {url: "redis://%s/0"}
api:
  keys: [{name: bench, tenant: bench, key_env: BENCH_PROXY_KEY}]
  admission: {capacity: 1000000000, refill_per_second: 1000000}
upstreams:
  openai:
    base_url: "%s"
    limits: [{rate: 1000000, per: 1s}]
    headers: {Authorization: "Bearer sk-bench-upstream"}
    proxy: {enabled: true}
`, redisAddr, upURL)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		return target{}, err
	}
	port, err := fleet.FreePort()
	if err != nil {
		return target{}, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	p, err := sh.Start("serve", []string{"BENCH_PROXY_KEY=" + benchKey}, "serve", "--config", cfg, "--listen", addr, "--log-level", "warn")
	if err != nil {
		return target{}, err
	}
	if err := fleet.WaitReady(ctx, client, addr, p); err != nil {
		p.Kill()
		return target{}, err
	}
	return target{name: "shaper proxy", url: "http://" + addr + "/proxy/openai/v1/chat/completions", proc: p}, nil
}

// startReverseProxy runs this executable as httputil.ReverseProxy in front
// of upURL.
func startReverseProxy(ctx context.Context, client *http.Client, upURL string) (target, error) {
	self, err := os.Executable()
	if err != nil {
		return target{}, err
	}
	port, err := fleet.FreePort()
	if err != nil {
		return target{}, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), fleet.EnvRole+"="+roleReverseProxy, envListen+"="+addr, envTarget+"="+upURL)
	p, err := fleet.Start("reverseproxy", cmd)
	if err != nil {
		return target{}, err
	}
	if err := fleet.WaitReady(ctx, client, addr, p); err != nil {
		p.Kill()
		return target{}, err
	}
	return target{name: "httputil.ReverseProxy", url: "http://" + addr + "/v1/chat/completions", proc: p}, nil
}

// serveReverseProxy is the reverse-proxy child's whole life: the standard
// library's proxy with a transport that keeps as many idle connections as
// the callers need, as anyone would configure it for this load.
func serveReverseProxy(listen, to string) error {
	u, err := url.Parse(to)
	if err != nil {
		return err
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(u) },
		Transport: &http.Transport{
			MaxIdleConns:        1024,
			MaxIdleConnsPerHost: 1024,
			IdleConnTimeout:     time.Minute,
		},
	}
	srv := &http.Server{Addr: listen, Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	return srv.ListenAndServe()
}

// startNginx runs Debian's nginx with proxy_pass to the upstream over
// kept-alive connections, one worker per CPU. It returns exec.ErrNotFound
// when nginx is not installed.
func startNginx(ctx context.Context, client *http.Client, dir, upAddr string) (target, error) {
	bin, err := exec.LookPath("nginx")
	if err != nil {
		if _, statErr := os.Stat("/usr/sbin/nginx"); statErr != nil {
			return target{}, exec.ErrNotFound
		}
		bin = "/usr/sbin/nginx"
	}
	port, err := fleet.FreePort()
	if err != nil {
		return target{}, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	nd := filepath.Join(dir, "nginx")
	if err := os.MkdirAll(filepath.Join(nd, "tmp"), 0o777); err != nil {
		return target{}, err
	}
	conf := fmt.Sprintf(`
worker_processes auto;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path %[1]s/tmp/body;
  proxy_temp_path %[1]s/tmp/proxy;
  fastcgi_temp_path %[1]s/tmp/fastcgi;
  uwsgi_temp_path %[1]s/tmp/uwsgi;
  scgi_temp_path %[1]s/tmp/scgi;
  upstream api { server %[2]s; keepalive 256; }
  server {
    listen %[3]s;
    location / {
      proxy_pass http://api;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
`, nd, upAddr, addr)
	confPath := filepath.Join(nd, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return target{}, err
	}
	cmd := exec.Command(bin, "-p", nd, "-e", filepath.Join(nd, "error.log"), "-c", confPath, "-g", "daemon off;")
	p, err := fleet.Start("nginx", cmd)
	if err != nil {
		return target{}, err
	}
	if err := fleet.WaitReady(ctx, client, addr, p); err != nil {
		p.Kill()
		return target{}, err
	}
	return target{name: "nginx proxy_pass", url: "http://" + addr + "/v1/chat/completions", proc: p}, nil
}

// call makes one chat completion call and reads the whole answer.
func call(ctx context.Context, client *http.Client, t target) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url, strings.NewReader(requestBody))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+benchKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	_, err = b.ReadFrom(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: status %d: %.200s", t.name, resp.StatusCode, b.String())
	}
	return nil
}

// latencies makes n calls one after another and returns each one's time.
func latencies(ctx context.Context, client *http.Client, t target, n int) ([]time.Duration, error) {
	out := make([]time.Duration, n)
	for i := range out {
		start := time.Now()
		if err := call(ctx, client, t); err != nil {
			return nil, err
		}
		out[i] = time.Since(start)
	}
	return out, nil
}

// percentile is the nearest-rank p-th percentile of sorted ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	i := int(float64(len(ds))*p/100+0.999999) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

func ms(d float64) string { return fmt.Sprintf("%.3f ms", d/float64(time.Millisecond)) }

func latencySection(ctx context.Context, out io.Writer, o options, client *http.Client, direct, proxied target, rs *redisproc.Server) error {
	var dp50, dp99, pp50, pp99, add50, add99 []float64
	var perCall map[string]float64
	for round := range o.rounds {
		order := []target{direct, proxied}
		if round%2 == 1 {
			order = []target{proxied, direct}
		}
		got := map[string][]time.Duration{}
		for _, t := range order {
			before, _ := commandCalls(rs)
			ls, err := latencies(ctx, client, t, o.latencyCalls)
			if err != nil {
				return err
			}
			if after, err := commandCalls(rs); err == nil && t.name == proxied.name && perCall == nil {
				perCall = map[string]float64{}
				for cmd, n := range after {
					// Less than one in a hundred calls is the serve's own
					// background (connections, heartbeats), not the call's.
					if d := n - before[cmd]; d*100 >= int64(o.latencyCalls) && cmd != "info" {
						perCall[cmd] = float64(d) / float64(o.latencyCalls)
					}
				}
			}
			slices.Sort(ls)
			got[t.name] = ls
		}
		d, p := got[direct.name], got[proxied.name]
		dp50 = append(dp50, float64(percentile(d, 50)))
		dp99 = append(dp99, float64(percentile(d, 99)))
		pp50 = append(pp50, float64(percentile(p, 50)))
		pp99 = append(pp99, float64(percentile(p, 99)))
		add50 = append(add50, float64(percentile(p, 50)-percentile(d, 50)))
		add99 = append(add99, float64(percentile(p, 99)-percentile(d, 99)))
	}
	fmt.Fprintf(out, "### Added latency under the limit\n\n")
	fmt.Fprintf(out, "%d rounds × %d calls per target, one caller, calls one after another; medians over rounds.\n\n", o.rounds, o.latencyCalls)
	fmt.Fprintln(out, "| percentile | direct | through shaper's proxy | added: median (min–max) over rounds |")
	fmt.Fprintln(out, "| --- | ---: | ---: | ---: |")
	for _, row := range []struct {
		name           string
		d, p, addition []float64
	}{{"p50", dp50, pp50, add50}, {"p99", dp99, pp99, add99}} {
		fmt.Fprintf(out, "| %s | %s | %s | %s (%s – %s) |\n", row.name, ms(stats.Median(row.d)), ms(stats.Median(row.p)),
			ms(stats.Median(row.addition)), ms(slices.Min(row.addition)), ms(slices.Max(row.addition)))
	}
	var total float64
	var each []string
	for _, cmd := range slices.Sorted(maps.Keys(perCall)) {
		total += perCall[cmd]
		each = append(each, fmt.Sprintf("%s %.2f", cmd, perCall[cmd]))
	}
	fmt.Fprintf(out, "\nRedis commands per proxied call (first round, from INFO commandstats; a script's own commands included): %.2f (%s).\n\n", total, strings.Join(each, ", "))
	return nil
}

// commandCalls is INFO commandstats: calls by command name.
func commandCalls(rs *redisproc.Server) (map[string]int64, error) {
	info, err := rs.Info("commandstats")
	if err != nil {
		return nil, err
	}
	calls := map[string]int64{}
	for k, v := range info {
		cmd, ok := strings.CutPrefix(k, "cmdstat_")
		if !ok {
			continue
		}
		for _, f := range strings.Split(v, ",") {
			if n, ok := strings.CutPrefix(f, "calls="); ok {
				calls[cmd], _ = strconv.ParseInt(n, 10, 64)
			}
		}
	}
	return calls, nil
}

// throughput runs o.concurrency callers against t for o.duration and
// returns the calls answered per second, and how many.
func throughput(ctx context.Context, o options, client *http.Client, t target) (float64, int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var done atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	deadline := time.Now().Add(o.duration)
	start := time.Now()
	for range o.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				if err := call(ctx, client, t); err != nil {
					once.Do(func() { firstErr = err; cancel() })
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, 0, firstErr
	}
	return float64(done.Load()) / time.Since(start).Seconds(), done.Load(), nil
}

func throughputSection(ctx context.Context, out io.Writer, o options, client *http.Client, targets []target, rs *redisproc.Server) error {
	rates := map[string][]float64{}
	ratios := map[string][]float64{}
	// CPU per call, µs: the proxy's own process, and Redis's.
	procCPU := map[string][]float64{}
	redisCPU := map[string][]float64{}
	// Script calls (round trips) per call: what batching shares.
	scripts := map[string][]float64{}
	// Redis commands per call, by command (the bench's own INFO left out).
	commands := map[string][]map[string]float64{}
	for round := range o.rounds {
		// Each round starts one later in the list, so no target always
		// goes first.
		got := map[string]float64{}
		for i := range targets {
			t := targets[(i+round)%len(targets)]
			pc0, rc0 := procCPUOf(t), cpuOf(rs.Pid())
			cmds0, _ := commandCalls(rs)
			r, n, err := throughput(ctx, o, client, t)
			if err != nil {
				return err
			}
			calls := float64(n)
			pc1, rc1 := procCPUOf(t), cpuOf(rs.Pid())
			if cmds1, err := commandCalls(rs); err == nil && t.proc != nil {
				scripts[t.name] = append(scripts[t.name], float64(cmds1["evalsha"]-cmds0["evalsha"])/calls)
				per := map[string]float64{}
				for cmd, c := range cmds1 {
					if d := c - cmds0[cmd]; d > 0 && cmd != "info" {
						per[cmd] = float64(d) / calls
					}
				}
				commands[t.name] = append(commands[t.name], per)
			}
			procCPU[t.name] = append(procCPU[t.name], float64(pc1-pc0)/float64(time.Microsecond)/calls)
			redisCPU[t.name] = append(redisCPU[t.name], float64(rc1-rc0)/float64(time.Microsecond)/calls)
			got[t.name] = r
			rates[t.name] = append(rates[t.name], r)
		}
		for _, t := range targets {
			ratios[t.name] = append(ratios[t.name], got[t.name]/got["httputil.ReverseProxy"])
		}
	}
	fmt.Fprintf(out, "### Throughput at an unlimited upstream\n\n")
	fmt.Fprintf(out, "%d rounds × %v per target, %d callers at once, targets in turn; medians over rounds.\n\n", o.rounds, o.duration, o.concurrency)
	fmt.Fprintln(out, "| path | calls/s | ratio to ReverseProxy: median (min–max), paired by round | proxy CPU per call | Redis CPU per call |")
	fmt.Fprintln(out, "| --- | ---: | ---: | ---: | ---: |")
	for _, t := range targets {
		rs := ratios[t.name]
		pc := "–"
		if t.proc != nil {
			pc = fmt.Sprintf("%.0f µs", stats.Median(procCPU[t.name]))
		}
		fmt.Fprintf(out, "| %s | %.0f | %.2f× (%.2f–%.2f) | %s | %.1f µs |\n", t.name, stats.Median(rates[t.name]), stats.Median(rs), slices.Min(rs), slices.Max(rs),
			pc, stats.Median(redisCPU[t.name]))
	}
	for _, t := range targets {
		if ss := scripts[t.name]; len(ss) > 0 && stats.Median(ss) >= 0.01 {
			fmt.Fprintf(out, "\n%s: %.2f Redis script calls (EVALSHA) per call at %d callers, median over rounds.\n", t.name, stats.Median(ss), o.concurrency)
			fmt.Fprintf(out, "%s: Redis commands per call at %d callers, median over rounds: %s.\n", t.name, o.concurrency, commandsPerCall(commands[t.name]))
		}
	}
	fmt.Fprintln(out)
	return nil
}

// commandsPerCall is the median over rounds of the commands per call, in
// all and by command ("12.00 (evalsha 2.00, ...)").
func commandsPerCall(rounds []map[string]float64) string {
	names := map[string]bool{}
	var totals []float64
	for _, r := range rounds {
		var total float64
		for cmd, v := range r {
			names[cmd] = true
			total += v
		}
		totals = append(totals, total)
	}
	var each []string
	for _, cmd := range slices.Sorted(maps.Keys(names)) {
		var vs []float64
		for _, r := range rounds {
			vs = append(vs, r[cmd])
		}
		if m := stats.Median(vs); m >= 0.005 {
			each = append(each, fmt.Sprintf("%s %.2f", cmd, m))
		}
	}
	if len(totals) == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f (%s)", stats.Median(totals), strings.Join(each, ", "))
}

// procCPUOf is the CPU time t's proxy process has used so far (its
// workers' too, for nginx's master), zero for the upstream itself.
func procCPUOf(t target) time.Duration {
	if t.proc == nil {
		return 0
	}
	return cpuOf(t.proc.Pid())
}

// cpuOf is a process's CPU time with its children's (nginx's workers),
// zero when it cannot be read.
func cpuOf(pid int) time.Duration {
	d, err := fleet.CPUOf(pid)
	if err != nil {
		return 0
	}
	return d + childrenCPU(pid)
}

// childrenCPU is the CPU time of pid's running children (nginx's
// workers), which /proc counts apart from their parent's until reaped.
func childrenCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(pid) + "/children")
	if err != nil {
		return 0
	}
	var sum time.Duration
	for _, f := range strings.Fields(string(b)) {
		if c, err := strconv.Atoi(f); err == nil {
			if d, err := fleet.CPUOf(c); err == nil {
				sum += d
			}
		}
	}
	return sum
}
