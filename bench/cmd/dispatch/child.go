package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/bench/internal/fleet"
	"github.com/shaperhq/shaper/dispatcher"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// The children this command starts of itself. Each drains one queue with a
// handler that does nothing but note the time, and talks to the parent over
// stdin and stdout: it prints "ready" once draining, a line "t <unix ns>"
// per job (at once with streaming, else all of them when it stops, so that
// writing them costs nothing while it is being measured), then "end". It
// stops when its stdin closes, which also happens when the parent dies.
const (
	roleAsynq   = "asynq-drain"
	roleHandler = "handler-drain"
)

// Child settings, passed in the environment.
const (
	envRedis       = "DISPATCH_REDIS"
	envQueue       = "DISPATCH_QUEUE"    // asynq queue, or shaper upstream name
	envConcurrency = "DISPATCH_WORKERS"  // asynq Concurrency / dispatcher Workers
	envInterval    = "DISPATCH_INTERVAL" // asynq TaskCheckInterval; empty for its default
	envRate        = "DISPATCH_RATE"     // the handler upstream's limit per second
	envStream      = "DISPATCH_STREAM"   // "1": report each job as it runs
	envURL         = "DISPATCH_URL"      // asynq: send each job's request here first
	envFair        = "DISPATCH_FAIR"     // "1": the handler upstream limits partitions too (-fair)
)

func runChild(role string) error {
	stopProfile, err := fleet.StartProfile()
	if err != nil {
		return err
	}
	defer stopProfile()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(envRedis)})
	defer rdb.Close()
	workers, err := strconv.Atoi(os.Getenv(envConcurrency))
	if err != nil {
		return fmt.Errorf("%s: %w", envConcurrency, err)
	}
	out := bufio.NewWriter(os.Stdout)
	rec := &recorder{stream: os.Getenv(envStream) == "1", out: out}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		io.Copy(io.Discard, os.Stdin)
		stop()
	}()

	switch role {
	case roleAsynq:
		cfg := asynq.Config{
			Concurrency: workers,
			Queues:      map[string]int{os.Getenv(envQueue): 1},
			LogLevel:    asynq.WarnLevel,
		}
		if s := os.Getenv(envInterval); s != "" {
			if cfg.TaskCheckInterval, err = time.ParseDuration(s); err != nil {
				return fmt.Errorf("%s: %w", envInterval, err)
			}
		}
		handle := func(context.Context, *asynq.Task) error {
			rec.note()
			return nil
		}
		if base := os.Getenv(envURL); base != "" {
			handle = httpHandler(base, workers, rec)
		}
		srv := asynq.NewServerFromRedisClient(rdb, cfg)
		if err := srv.Start(asynq.HandlerFunc(handle)); err != nil {
			return err
		}
		rec.line("ready")
		<-ctx.Done()
		srv.Shutdown()
	case roleHandler:
		rate, err := strconv.ParseInt(os.Getenv(envRate), 10, 64)
		if err != nil {
			return fmt.Errorf("%s: %w", envRate, err)
		}
		name := os.Getenv(envQueue)
		up := shaper.Upstream{Name: name, Limits: []leaky.Limit{leaky.PerSecond(rate)}, Workers: workers}
		if os.Getenv(envFair) == "1" {
			up.PartitionLimits = []leaky.Limit{leaky.PerSecond(rate)}
		}
		d, err := dispatcher.New(rdb, dispatcher.Config{
			Upstreams: []shaper.Upstream{up},
			Logger:    slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
			// Jobs are all handed out before a stop; nothing is in flight.
			ShutdownTimeout: 5 * time.Second,
		})
		if err != nil {
			return err
		}
		if err := d.Handle(name, dispatcher.HandlerFunc(func(context.Context, *queue.Job) error {
			rec.note()
			return nil
		})); err != nil {
			return err
		}
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		rec.line("ready")
		if err := <-done; err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown role %q", role)
	}
	rec.finish()
	return out.Flush()
}

// httpHandler is what a plain asynq worker that calls an API does: decode
// the job, send its request, read the answer. It is the baseline that
// prices shaper's pacing and bookkeeping apart from the HTTP call itself.
func httpHandler(base string, workers int, rec *recorder) func(context.Context, *asynq.Task) error {
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: 2 * workers, MaxIdleConnsPerHost: 2 * workers, IdleConnTimeout: 90 * time.Second}}
	return func(ctx context.Context, t *asynq.Task) error {
		var job queue.Job
		if err := json.Unmarshal(t.Payload(), &job); err != nil {
			return fmt.Errorf("%v: %w", err, asynq.SkipRetry)
		}
		req, err := http.NewRequestWithContext(ctx, job.Method, base+job.Path, bytes.NewReader(job.Body))
		if err != nil {
			return fmt.Errorf("%v: %w", err, asynq.SkipRetry)
		}
		for k, v := range job.Headers {
			req.Header.Set(k, v)
		}
		req.Header.Set("Idempotency-Key", job.IdempotencyKey)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("upstream answered %d", resp.StatusCode)
		}
		rec.note()
		return nil
	}
}

// recorder notes when each job ran.
type recorder struct {
	stream bool
	mu     sync.Mutex
	out    *bufio.Writer
	times  []int64
	n      int
}

func (r *recorder) note() {
	now := time.Now().UnixNano()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	if r.stream {
		fmt.Fprintf(r.out, "t %d\n", now)
		r.out.Flush()
		return
	}
	r.times = append(r.times, now)
}

func (r *recorder) line(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintln(r.out, s)
	r.out.Flush()
}

func (r *recorder) finish() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, t := range r.times {
		fmt.Fprintf(r.out, "t %d\n", t)
	}
	fmt.Fprintf(r.out, "end %d\n", r.n)
}

// A drainer's report, line by line: what the Go children above and the
// BullMQ worker (bench/node/bullmq.mjs) print on stdout.
//
//	startcpu <µs>   CPU used before draining began (node's start-up)
//	ready           draining
//	t <unix ns>     one job ran then
//	end <jobs>      stopped, having run this many jobs
type reportLine struct {
	kind string // "ready", "startcpu", "t", "end"
	n    int64
}

// parseReport reads one line of a report; ok is false for anything else
// (a library's stray output, say), which the reader skips.
func parseReport(line string) (r reportLine, ok bool) {
	kind, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
	switch kind {
	case "ready":
		if arg != "" {
			return reportLine{}, false
		}
		return reportLine{kind: kind}, true
	case "startcpu", "t", "end":
		n, err := strconv.ParseInt(arg, 10, 64)
		if err != nil || n < 0 {
			return reportLine{}, false
		}
		return reportLine{kind: kind, n: n}, true
	}
	return reportLine{}, false
}

// child is the parent's handle on a draining child.
type child struct {
	proc  *fleet.Proc
	stdin io.WriteCloser
	ready chan struct{}
	// times receives each job's time in streaming mode; all of them are
	// also kept for after the child ends.
	times chan time.Time
	mu    sync.Mutex
	all   []time.Time
	// startCPU is the CPU the child reported using before it drained
	// (node's start-up); reported is the job count of its "end" line, -1
	// until one comes.
	startCPU time.Duration
	reported int64
	ended    chan struct{}
}

// startChild starts a draining child of this executable in role, with its
// settings and, if profileDir is set, a CPU profile there.
func startChild(name, role string, env map[string]string, profileDir string) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), fleet.EnvRole+"="+role)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	if profileDir != "" {
		cmd.Env = append(cmd.Env, fleet.EnvProfile+"="+profileDir+"/"+name+".pprof")
	}
	return startReporting(name, cmd)
}

// startReporting starts cmd, a drainer that speaks the report above, and
// returns once it is ready.
func startReporting(name string, cmd *exec.Cmd) (*child, error) {
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	// Our own pipe, not StdoutPipe: exec closes that one as soon as the
	// child exits, which could cut off the last of its report.
	stdout, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = w
	p, err := fleet.Start(name, cmd)
	w.Close()
	if err != nil {
		stdout.Close()
		return nil, err
	}
	c := &child{proc: p, stdin: stdin, ready: make(chan struct{}), times: make(chan time.Time, 1024), reported: -1, ended: make(chan struct{})}
	go c.read(stdout)
	select {
	case <-c.ready:
		return c, nil
	case <-c.ended:
		p.Wait()
		return nil, fmt.Errorf("%s ended before it was ready; log:\n%s", name, p.Log())
	case <-time.After(30 * time.Second):
		c.stop()
		return nil, fmt.Errorf("%s not ready within 30s; log:\n%s", name, p.Log())
	}
}

func (c *child) read(r io.ReadCloser) {
	defer close(c.ended)
	defer r.Close()
	sc := bufio.NewScanner(r)
	readied := false
	for sc.Scan() {
		l, ok := parseReport(sc.Text())
		if !ok {
			continue
		}
		switch l.kind {
		case "ready":
			if !readied {
				readied = true
				close(c.ready)
			}
		case "startcpu":
			c.mu.Lock()
			c.startCPU = time.Duration(l.n) * time.Microsecond
			c.mu.Unlock()
		case "end":
			c.mu.Lock()
			c.reported = l.n
			c.mu.Unlock()
		case "t":
			t := time.Unix(0, l.n)
			c.mu.Lock()
			c.all = append(c.all, t)
			c.mu.Unlock()
			select {
			case c.times <- t:
			default:
			}
		}
	}
}

// stop closes the child's stdin, waits for it to report and end, and
// returns every job time it reported. A report whose times do not add up
// to its "end" count (or that has none) is an error: lines were lost.
func (c *child) stop() ([]time.Time, error) {
	c.stdin.Close()
	select {
	case <-c.ended:
	case <-time.After(30 * time.Second):
		c.proc.Stop(time.Second)
		return nil, fmt.Errorf("%s did not stop within 30s; log:\n%s", c.proc.Name, c.proc.Log())
	}
	if err := c.proc.Wait(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reported != int64(len(c.all)) {
		return nil, fmt.Errorf("%s reported %d jobs at its end (-1: no end line) but %d times; log:\n%s", c.proc.Name, c.reported, len(c.all), c.proc.Log())
	}
	return c.all, nil
}

// drainCPU is the CPU the child has used since it began draining.
func (c *child) drainCPU() (time.Duration, error) {
	cpu, err := c.proc.CPU()
	c.mu.Lock()
	defer c.mu.Unlock()
	return cpu - c.startCPU, err
}

// start tells a child that waits for it (the BullMQ worker) to begin
// taking jobs.
func (c *child) start() error {
	_, err := io.WriteString(c.stdin, "go\n")
	return err
}
