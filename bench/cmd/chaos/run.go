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
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/bench/internal/fleet"
	"github.com/shaperhq/shaper/bench/internal/machine"
	"github.com/shaperhq/shaper/bench/internal/redisproc"
	"github.com/shaperhq/shaper/bench/internal/sched"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

type options struct {
	jobs         int
	rate         int
	workers      int
	killEvery    time.Duration
	maxKills     int
	redisCrashAt time.Duration
	redisDown    time.Duration
	redisLose    time.Duration
	deadline     time.Duration
	batch        int
	producers    int
	latency      time.Duration
	fsync        string
	json         bool
	jsonFile     string
	callbacks    bool
	callbackWait time.Duration
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.IntVar(&o.jobs, "jobs", 100_000, "jobs to enqueue, each with its own idempotency key")
	fs.IntVar(&o.rate, "rate", 500, "the upstream's limit and shaper's, requests per second")
	fs.IntVar(&o.workers, "workers", 4, "`shaper work` processes")
	fs.DurationVar(&o.killEvery, "kill-every", 10*time.Second, "kill -9 one worker (and start it again) this often, while jobs wait in the queue; 0 for none")
	fs.IntVar(&o.maxKills, "max-kills", 0, "stop killing after this many; 0 for no cap")
	fs.DurationVar(&o.redisCrashAt, "redis-crash-at", 0, "kill -9 Redis this long after the workers start (then start it again on its AOF); 0 picks half the expected drain; negative for no crash")
	fs.DurationVar(&o.redisDown, "redis-down", time.Second, "how long Redis stays down")
	fs.DurationVar(&o.redisLose, "redis-lose", 0, "also cut the AOF back to its size this long before the crash, as a power loss loses writes not yet fsynced (everysec: up to about 1s); 0 for a process crash only, which loses nothing the kernel already has")
	fs.DurationVar(&o.deadline, "deadline", 20*time.Minute, "give up waiting for deliveries after this long")
	fs.IntVar(&o.batch, "batch", 1000, "jobs per `POST /v1/jobs/batch` request")
	fs.IntVar(&o.producers, "producers", 4, "concurrent producer goroutines")
	fs.DurationVar(&o.latency, "latency", 0, "the upstream's answer delay")
	fs.StringVar(&o.fsync, "appendfsync", "everysec", "Redis's AOF fsync policy: always, everysec or no")
	fs.BoolVar(&o.json, "json", false, "print the result as JSON instead of markdown")
	fs.StringVar(&o.jsonFile, "json-file", "", "also write the result as JSON to this file")
	fs.BoolVar(&o.callbacks, "callbacks", false, "give every job a callback_url on a receiver in this process, and count the callbacks lost and sent twice")
	fs.DurationVar(&o.callbackWait, "callback-wait", 2*time.Minute, "with -callbacks: how long to wait for the callbacks once the queue is empty")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case o.jobs < 1 || o.rate < 1 || o.workers < 1 || o.producers < 1:
		return o, errors.New("-jobs, -rate, -workers and -producers must be positive")
	case o.batch < 1 || o.batch > 1000:
		return o, errors.New("-batch: 1 to 1000")
	case o.killEvery < 0 || o.maxKills < 0 || o.redisDown < 0 || o.redisLose < 0 || o.latency < 0:
		return o, errors.New("-kill-every, -max-kills, -redis-down, -redis-lose and -latency must not be negative")
	case o.deadline <= 0:
		return o, errors.New("-deadline must be positive")
	case o.fsync != "always" && o.fsync != "everysec" && o.fsync != "no":
		return o, fmt.Errorf("-appendfsync %q: want always, everysec or no", o.fsync)
	}
	if o.redisCrashAt == 0 {
		o.redisCrashAt = expectedDrain(o.jobs, o.rate) / 2
	}
	return o, nil
}

// expectedDrain is how long the jobs take at the rate shaper drains a full
// backlog (98% of the limit with the default 20ms guard).
func expectedDrain(jobs, rate int) time.Duration {
	return time.Duration(float64(jobs) / (0.98 * float64(rate)) * float64(time.Second))
}

// Names in the generated config.
const (
	apiKey       = "chaos-secret"
	upstreamName = "api"
	laneName     = "default"
)

func config(redisAddr, upstreamURL string, o options) string {
	return fmt.Sprintf(`redis: {url: "redis://%s/0"}
api:
  keys:
    - {name: bench, tenant: bench, key_env: SHAPER_KEY_BENCH}
  admission: {capacity: 1000000000, refill_per_second: 1000000}
work: {metrics_listen: "", shutdown_timeout: 5s}
upstreams:
  %s:
    base_url: "%s"
    limits: [{rate: %d, per: 1s}]
    max_pending: %d
`, redisAddr, upstreamName, upstreamURL, o.rate, 10*o.jobs+1000)
}

// callbacksConfig is the callbacks block of a -callbacks run: the sink's
// host allowed, paced at twice the jobs' rate so that callbacks keep up.
func callbacksConfig(host string, o options) string {
	return fmt.Sprintf(`callbacks:
  allowed_hosts: ["%s"]
  secret_env: SHAPER_WEBHOOK_SECRET
  limits: [{rate: %d, per: 1s}]
  retry: {max_attempts: 30, min_backoff: 100ms, max_backoff: 2s}
`, host, 2*o.rate)
}

// event is something the run did or saw, at a time since the workers
// started.
type event struct {
	At   time.Duration `json:"at_ns"`
	What string        `json:"what"`
}

// chaos is one run's moving parts.
type chaos struct {
	o      options
	stderr io.Writer
	t0     time.Time
	shaper *fleet.Shaper
	cfg    string
	redis  *redisproc.Server
	up     *upstream
	q      *queue.Queue

	aof  *aofSampler // nil unless -redis-lose
	prod *producer
	// hooks receives the callbacks, nil without -callbacks; env is the
	// environment every shaper process gets.
	hooks *hookSink
	env   []string

	mu      sync.Mutex
	events  []event
	workers []*fleet.Proc
	started int
}

func (c *chaos) since() time.Duration { return time.Since(c.t0) }

func (c *chaos) note(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.noteLocked(format, args...)
}

func (c *chaos) noteLocked(format string, args ...any) {
	e := event{At: c.since(), What: fmt.Sprintf(format, args...)}
	c.events = append(c.events, e)
	fmt.Fprintf(c.stderr, "%8.1fs  %s\n", e.At.Seconds(), e.What)
}

func (c *chaos) startWorker() (*fleet.Proc, error) {
	c.started++
	return c.shaper.Start(fmt.Sprintf("worker-%d", c.started), c.env, "work", "--config", c.cfg, "--log-level", "warn")
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) (*result, error) {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "shaper-bench-chaos-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintln(stderr, "building shaper…")
	bin, err := fleet.Build(ctx, dir)
	if err != nil {
		return nil, err
	}
	srv, err := redisproc.StartWith(redisproc.Options{AppendFsync: o.fsync})
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	c := &chaos{o: o, stderr: stderr, shaper: bin, redis: srv, t0: time.Now()}
	c.up, err = startUpstream(o.jobs, o.rate, o.latency, c.t0)
	if err != nil {
		return nil, err
	}
	defer c.up.close()
	cfgText := config(srv.Addr, c.up.url, o)
	if o.callbacks {
		if c.hooks, err = startHookSink(o.jobs, c.t0); err != nil {
			return nil, err
		}
		defer c.hooks.close()
		cfgText += callbacksConfig(c.hooks.host(), o)
		c.env = []string{"SHAPER_WEBHOOK_SECRET=" + webhookSecret()}
	}
	c.cfg = filepath.Join(dir, "shaper.yaml")
	if err := os.WriteFile(c.cfg, []byte(cfgText), 0o600); err != nil {
		return nil, err
	}

	// The run's own view of Redis: short timeouts and no retries, so that a
	// look while Redis is down fails at once instead of stalling the loop.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, DialTimeout: time.Second, ReadTimeout: 5 * time.Second,
		WriteTimeout: 5 * time.Second, MaxRetries: -1, PoolSize: 4})
	defer rdb.Close()
	c.q, err = queue.New(rdb, queue.Config{Upstreams: []shaper.Upstream{{Name: upstreamName,
		Limits: []leaky.Limit{leaky.PerSecond(int64(o.rate))}, MaxPending: int64(10*o.jobs + 1000)}}})
	if err != nil {
		return nil, err
	}
	defer c.q.Close()

	port, err := fleet.FreePort()
	if err != nil {
		return nil, err
	}
	apiAddr := "127.0.0.1:" + strconv.Itoa(port)
	serve, err := bin.Start("serve", append([]string{"SHAPER_KEY_BENCH=" + apiKey}, c.env...),
		"serve", "--config", c.cfg, "--listen", apiAddr, "--log-level", "warn")
	if err != nil {
		return nil, err
	}
	defer serve.Stop(10 * time.Second)
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		MaxIdleConnsPerHost: 2 * o.producers, IdleConnTimeout: time.Minute, DisableCompression: true}}
	if err := fleet.WaitReady(ctx, client, apiAddr, serve); err != nil {
		return nil, err
	}

	loadBefore := machine.Load()
	// Every worker is killed on the way out, whatever happened; the ones
	// still running at the end have been stopped gracefully by then.
	defer func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, w := range c.workers {
			w.Kill()
		}
	}()
	c.t0 = time.Now()
	for range o.workers {
		w, err := c.startWorker()
		if err != nil {
			return nil, err
		}
		c.mu.Lock()
		c.workers = append(c.workers, w)
		c.mu.Unlock()
	}
	if o.redisLose > 0 && o.redisCrashAt >= 0 {
		c.aof = &aofSampler{srv: srv}
		stopSampling := c.aof.start(o.redisLose)
		defer stopSampling()
	}
	c.note("%d workers started; enqueueing %d jobs through %s", o.workers, o.jobs, apiAddr)

	prod := &producer{o: o, client: client, url: "http://" + apiAddr + "/v1/jobs/batch", ids: make([]string, o.jobs),
		refused: map[string]int{}}
	if c.hooks != nil {
		prod.hookURL = c.hooks.url + "/hook/"
	}
	c.prod = prod
	enqueued := make(chan struct{})
	pctx, cancelProducers := context.WithCancel(ctx)
	defer cancelProducers()
	go func() {
		defer close(enqueued)
		prod.run(pctx)
	}()

	res, err := c.drive(ctx, prod, enqueued)
	cancelProducers()
	<-enqueued
	if err != nil {
		return nil, err
	}

	// Callbacks are delivered by the workers after their jobs: wait for
	// them before the workers go.
	var cbs *callbackResult
	if c.hooks != nil && !res.Interrupted {
		cbs = c.waitCallbacks(ctx, o.callbackWait)
	}
	// Stop what is left gracefully so that its answers are counted, then
	// judge.
	c.mu.Lock()
	ws := c.workers
	c.mu.Unlock()
	if err := fleet.StopAll(15*time.Second, ws...); err != nil {
		c.note("stopping the workers: %v", firstLine(err.Error()))
	}
	// Judge even after Ctrl-C, within bounds: the figures so far are
	// what the interrupted run has to show.
	jctx, cancelJudge := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancelJudge()
	c.judge(jctx, res, prod)
	res.Callbacks = cbs
	res.Machine = machine.Describe(srv.Version)
	res.LoadBefore, res.LoadAfter = loadBefore, machine.Load()
	res.Command = strings.TrimSpace("cd bench && go run ./cmd/chaos " + strings.Join(args, " "))
	res.Date = time.Now().UTC().Format(time.RFC3339)
	c.mu.Lock()
	res.Events = append([]event(nil), c.events...)
	c.mu.Unlock()
	if o.jsonFile != "" {
		f, err := os.Create(o.jsonFile)
		if err != nil {
			return res, err
		}
		err = errors.Join(writeJSON(f, res), f.Close())
		if err != nil {
			return res, err
		}
	}
	if o.json {
		return res, writeJSON(stdout, res)
	}
	writeTable(stdout, res)
	return res, nil
}

// drive runs the chaos until every accepted job has been delivered and the
// queue is empty, or the deadline passes, or ctx ends.
func (c *chaos) drive(ctx context.Context, prod *producer, enqueued <-chan struct{}) (*result, error) {
	o := c.o
	res := &result{Jobs: o.jobs, Rate: o.rate, Workers: o.workers, KillEvery: o.killEvery, AppendFsync: o.fsync,
		RedisDown: o.redisDown, RedisLose: o.redisLose}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(o.deadline)
	defer deadline.Stop()
	nextKill := o.killEvery
	nextLook, nextProgress := time.Duration(0), 5*time.Second
	crashed := o.redisCrashAt < 0
	enqueueDone := false
	var counts queue.LaneCounts
	countsOK := false
	victim := 0
	last := sched.Read()
	for {
		select {
		case <-ctx.Done():
			c.note("interrupted")
			res.Interrupted = true
			return res, nil
		case <-deadline.C:
			c.note("deadline of %v passed", o.deadline)
			res.DeadlinePassed = true
			return res, nil
		case <-enqueued:
			if !enqueueDone {
				enqueueDone = true
				res.EnqueuedAt = c.since()
				c.note("enqueue done: %d accepted, %d not", prod.acceptedCount(), o.jobs-prod.acceptedCount())
			}
			enqueued = nil // a closed channel would spin the loop
		case <-tick.C:
		}
		now := c.since()

		// A worker that ended without being killed is a finding: say so
		// with its log, and start it again.
		if err := c.restartExited(res); err != nil {
			return nil, err
		}

		if now >= nextLook {
			nextLook = now + time.Second
			h := sched.Read()
			if w := h.WorstSince(last); w >= minStall {
				res.Stalls = append(res.Stalls, stall{At: now, Worst: w})
			}
			last = h
			counts, countsOK = c.counts(ctx)
			if countsOK && enqueueDone && counts.Pending == 0 && res.BacklogEmptyAt == 0 {
				res.BacklogEmptyAt = now
				c.note("no job waits in the queue any more (backlog %d: active %d, retry %d, scheduled %d)",
					counts.Backlog(), counts.Active, counts.Retry, counts.Scheduled)
			}
		}

		if !crashed && now >= o.redisCrashAt {
			crashed = true
			if err := c.crashRedis(res); err != nil {
				return nil, err
			}
			continue
		}

		// Kill while jobs wait in the queue: a kill after that only makes
		// more stragglers, and the run would never end.
		waiting := !enqueueDone || !countsOK || counts.Pending > 0
		if o.killEvery > 0 && now >= nextKill && waiting && (o.maxKills == 0 || res.Kills < o.maxKills) {
			nextKill = now + o.killEvery
			c.mu.Lock()
			w := c.workers[victim%len(c.workers)]
			c.mu.Unlock()
			pid := w.Pid()
			w.Kill()
			nw, err := c.startWorker()
			if err != nil {
				return nil, err
			}
			c.mu.Lock()
			c.workers[victim%len(c.workers)] = nw
			c.mu.Unlock()
			victim++
			res.Kills++
			res.LastKillAt = c.since()
			res.KillTimes = append(res.KillTimes, res.LastKillAt)
			c.note("kill -9 %s (pid %d); started %s (pid %d); %d delivered so far", w.Name, pid, nw.Name, nw.Pid(), c.up.delivered.Load())
		}

		if now >= nextProgress {
			nextProgress = now + 10*time.Second
			fmt.Fprintf(c.stderr, "%8.1fs  progress: %d delivered, %d accepted; queue pending %d active %d retry %d\n",
				now.Seconds(), c.up.delivered.Load(), prod.acceptedCount(), counts.Pending, counts.Active, counts.Retry)
		}

		// An empty queue is final: every job has succeeded, is dead, or
		// is gone; nothing more will reach the upstream.
		if enqueueDone && crashed && countsOK && counts.Backlog() == 0 {
			if n := c.deliveredAccepted(prod); n == prod.acceptedCount() {
				c.note("every accepted job delivered and the queue empty")
			} else {
				c.note("the queue is empty with %d of %d accepted jobs delivered", n, prod.acceptedCount())
			}
			return res, nil
		}
	}
}

// restartExited notes every worker that ended without being killed, a
// finding, with the end of its log, and starts it again.
func (c *chaos) restartExited(res *result) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, w := range c.workers {
		if !w.Exited() {
			continue
		}
		nw, err := c.startWorker()
		if err != nil {
			return err
		}
		c.workers[i] = nw
		res.SelfExits++
		c.noteLocked("%s (pid %d) exited by itself: %s; started %s", w.Name, w.Pid(), lastLines(w.Log(), 3), nw.Name)
	}
	return nil
}

// counts reads the lane's job counts; false while Redis cannot answer.
func (c *chaos) counts(ctx context.Context) (queue.LaneCounts, bool) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := c.q.Counts(cctx, upstreamName)
	if err != nil {
		return queue.LaneCounts{}, false
	}
	return m[laneName], true
}

// crashRedis kills Redis with SIGKILL, waits, and starts it again on the
// same port and directory, so that it reloads its append-only file.
func (c *chaos) crashRedis(res *result) error {
	pid := c.redis.Pid()
	delivered := c.up.delivered.Load()
	c.redis.Crash()
	res.RedisCrashAt = c.since()
	res.DeliveredAtCrash = delivered
	c.note("kill -9 redis-server (pid %d); %d delivered, %d accepted so far", pid, delivered, c.acceptedNow())
	if c.aof != nil {
		file, size, ok := c.aof.before(time.Now().Add(-c.o.redisLose))
		if !ok {
			return fmt.Errorf("no AOF size sampled %v before the crash", c.o.redisLose)
		}
		dropped, err := c.redis.TruncateAOF(file, size)
		if err != nil {
			return fmt.Errorf("cutting the AOF back: %w", err)
		}
		res.AOFDropped = dropped
		c.note("AOF cut back to its size %v before the crash: %d bytes dropped (a power loss with writes not yet fsynced)", c.o.redisLose, dropped)
	}
	time.Sleep(c.o.redisDown)
	t := time.Now()
	if err := c.redis.Restart(time.Minute); err != nil {
		return fmt.Errorf("restarting Redis: %w", err)
	}
	res.RedisReload = time.Since(t)
	res.RedisBackAt = c.since()
	c.note("redis-server started again (pid %d) and loaded its AOF in %v", c.redis.Pid(), res.RedisReload.Round(time.Millisecond))
	return nil
}

// acceptedNow is how many jobs the producers have seen accepted so far.
func (c *chaos) acceptedNow() int {
	if c.prod == nil {
		return 0
	}
	return c.prod.acceptedCount()
}

// aofSampler notes the size of Redis's current AOF every few
// milliseconds, so that a crash can be followed by cutting the file back
// to what it held a given time before: the writes a power loss would take.
type aofSampler struct {
	srv *redisproc.Server

	mu      sync.Mutex
	samples []aofSample
}

type aofSample struct {
	at   time.Time
	file string
	size int64
}

const aofSampleEvery = 10 * time.Millisecond

// start samples until the returned function is called, keeping what covers
// the last keep plus a second.
func (a *aofSampler) start(keep time.Duration) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(aofSampleEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			file, size, err := a.srv.AOFTail()
			if err != nil {
				continue // mid-rewrite, or Redis is down
			}
			now := time.Now()
			a.mu.Lock()
			a.samples = append(a.samples, aofSample{now, file, size})
			cut := 0
			for cut < len(a.samples) && now.Sub(a.samples[cut].at) > keep+time.Second {
				cut++
			}
			// Keep the newest sample older than keep+1s too: it may be
			// the one before() needs.
			a.samples = a.samples[max(cut-1, 0):]
			a.mu.Unlock()
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// before is the last sample taken at or before t.
func (a *aofSampler) before(t time.Time) (file string, size int64, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := len(a.samples) - 1; i >= 0; i-- {
		if !a.samples[i].at.After(t) {
			return a.samples[i].file, a.samples[i].size, true
		}
	}
	return "", 0, false
}

// deliveredAccepted counts accepted jobs the upstream has answered 2xx.
// Call it only once enqueueing is done.
func (c *chaos) deliveredAccepted(p *producer) int {
	n := 0
	for i, id := range p.ids {
		if id != "" && c.up.oks[i].Load() > 0 {
			n++
		}
	}
	return n
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// lastLines is the end of a log, on one line.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	out := strings.Join(lines, " | ")
	if len(out) > 600 {
		out = out[len(out)-600:]
	}
	if out == "" {
		return "(no output)"
	}
	return out
}
