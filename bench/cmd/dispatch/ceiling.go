package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"time"

	"github.com/shaperhq/shaper/bench/internal/fleet"
	"github.com/shaperhq/shaper/bench/internal/redisstats"
	"github.com/shaperhq/shaper/bench/internal/stats"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/queue"
)

// ceilingRate is a limit so high that pacing never holds a job back: what
// is left is the cost of dispatching.
const ceilingRate = 1_000_000

// The contenders of the ceiling, in table order.
const (
	asynqDrain    = "asynq"
	asynqHTTP     = "asynq-http"
	shaperHTTP    = "shaper-http"
	shaperHandler = "shaper-handler"
	bullmqDrain   = "bullmq"
	bullmqHTTP    = "bullmq-http"
)

// allContenders are the ceiling's contenders, in the order of a round.
var allContenders = []string{asynqDrain, shaperHandler, bullmqDrain, asynqHTTP, shaperHTTP, bullmqHTTP}

// With -fair, the Go handler's jobs go round tenants and partitions.
const fairTenants, fairPartitions = 4, 8

var contenderNames = map[string]string{
	asynqDrain:    "asynq no-op drain",
	asynqHTTP:     "asynq handler sending HTTP to the fake",
	shaperHTTP:    "`shaper work`, HTTP to the fake",
	shaperHandler: "shaper dispatcher, Go no-op handler",
	bullmqDrain:   "BullMQ no-op processor",
	bullmqHTTP:    "BullMQ processor sending HTTP to the fake",
}

// drainResult is one contender's drain of one backlog.
type drainResult struct {
	jobs     int
	rate     float64 // jobs/s over the middle 80% of the drain
	redis    redisstats.Delta
	drainCPU time.Duration // all of the contender's processes
	selfCPU  time.Duration // this process: the fake upstream, polling
}

type ceilingKey struct {
	contender string
	replicas  int
}

// ceiling drains the same number of no-op jobs with each contender, rounds
// times in a rotated order, so that load from elsewhere hits all of them.
func (b *bench) ceiling(ctx context.Context, out io.Writer) error {
	if b.o.profileDir != "" {
		b.shaper.ProfileInto(b.o.profileDir)
		defer b.shaper.ProfileInto("")
		f, err := os.Create(filepath.Join(b.o.profileDir, "bench.pprof"))
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	bq, skip, err := findBullMQ(ctx)
	if err != nil {
		return err
	}
	b.bullmq = bq
	var contenders []string
	for _, c := range b.o.contenders {
		if bq == nil && (c == bullmqDrain || c == bullmqHTTP) {
			continue
		}
		contenders = append(contenders, c)
	}
	if bq == nil {
		fmt.Fprintf(os.Stderr, "ceiling: BullMQ skipped: %s\n", skip)
	}
	has := func(cs ...string) bool {
		for _, c := range cs {
			if !slices.Contains(contenders, c) {
				return false
			}
		}
		return true
	}
	results := map[ceilingKey][]drainResult{}
	for round := 0; round < b.o.rounds; round++ {
		for _, n := range b.o.replicas {
			for i := range contenders {
				c := contenders[(i+round)%len(contenders)]
				label := fmt.Sprintf("%s-%dx-round%d", c, n, round+1)
				r, err := b.drain(ctx, c, n, label)
				if err != nil {
					return fmt.Errorf("%s: %w", label, err)
				}
				fmt.Fprintf(os.Stderr, "ceiling %s: %.0f jobs/s\n", label, r.rate)
				k := ceilingKey{c, n}
				results[k] = append(results[k], r)
			}
		}
	}

	fmt.Fprintf(out, "### Dispatch ceiling\n\n")
	if b.o.fair {
		fmt.Fprintf(out, "With -fair: the Go handler's jobs go round %d tenants and %d partitions (job i: tenant i mod %d, partition i mod %d), "+
			"fair share by tenant, and a partition limit of %d/s that holds nothing back but puts every partition through its bucket.\n\n",
			fairTenants, fairPartitions, fairTenants, fairPartitions, ceilingRate)
	}
	if has(asynqDrain) && (has(shaperHandler) || has(shaperHTTP)) {
		fmt.Fprintf(out, "Jobs per second while draining a backlog of %d no-op jobs (middle 80%% of the drain), median (min–max) of %d rounds. "+
			"Each replica is its own process with %d jobs in flight (shaper `workers`, asynq `Concurrency`). "+
			"shaper's limit is %d/s, too high to hold anything back; the HTTP upstream (the fake, in this benchmark's process) answers 200 at once. "+
			"asynq's tasks carry the same payload bytes with asynq's default options; shaper's are enqueued with `queue.Queue.Enqueue` as the API does. "+
			"The asynq HTTP handler decodes the job, sends its request with a plain `http.Client` and reads the answer: what an asynq worker calling an API does without shaper. "+
			"Ratios are of medians (– where a contender did not run); the targets (issue 21) are the Go handler ≥ 1.2× asynq's no-op drain and `shaper work` ≥ 1.0× asynq + HTTP.\n\n",
			b.o.ceilingJobs, b.o.rounds, b.o.workers, ceilingRate)
		fmt.Fprintf(out, "| replicas | %s | %s | × asynq no-op | paired | %s | %s | × asynq HTTP | paired | × asynq no-op |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
			contenderNames[asynqDrain], contenderNames[shaperHandler], contenderNames[asynqHTTP], contenderNames[shaperHTTP])
		for _, n := range b.o.replicas {
			med := func(c string) float64 { return stats.Median(rates(results[ceilingKey{c, n}])) }
			fmt.Fprintf(out, "| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", n,
				spread(results[ceilingKey{asynqDrain, n}]), spread(results[ceilingKey{shaperHandler, n}]), ratio(med(shaperHandler), med(asynqDrain)),
				paired(results[ceilingKey{shaperHandler, n}], results[ceilingKey{asynqDrain, n}]),
				spread(results[ceilingKey{asynqHTTP, n}]), spread(results[ceilingKey{shaperHTTP, n}]), ratio(med(shaperHTTP), med(asynqHTTP)),
				paired(results[ceilingKey{shaperHTTP, n}], results[ceilingKey{asynqHTTP, n}]), ratio(med(shaperHTTP), med(asynqDrain)))
		}
		fmt.Fprintf(out, "\n\"paired\" is the median (min–max) of each round's shaper rate over the same round's asynq rate: "+
			"the contenders of a round run one after another within a minute, so load from elsewhere hits a pair more alike than it hits the whole run.\n")
	}

	if bq == nil {
		fmt.Fprintf(out, "\nBullMQ: skipped (%s).\n", skip)
	} else if (has(bullmqDrain) && has(shaperHandler)) || (has(bullmqHTTP) && has(shaperHTTP)) {
		fmt.Fprintf(out, "\nBeside BullMQ %s (Node %s): each replica is a `node` process running one `Worker` with `concurrency` %d and BullMQ's default options, "+
			"told to run once every process has started and connected (node takes a second or so to start, a Go child milliseconds); "+
			"the backlog is added with `Queue.addBulk` (not timed), the same payload bytes as asynq's as the job's data. "+
			"The HTTP processor sends the job's request with node's `http` client (keep-alive agent) and reads the answer. Rates are timed as above; the target (issue 21) is ≥ 1.0× BullMQ.\n\n",
			bq.version(), nodeVersion(bq.node), b.o.workers)
		fmt.Fprintf(out, "| replicas | %s | %s | × BullMQ no-op | paired | %s | %s | × BullMQ HTTP | paired |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
			contenderNames[bullmqDrain], contenderNames[shaperHandler], contenderNames[bullmqHTTP], contenderNames[shaperHTTP])
		for _, n := range b.o.replicas {
			med := func(c string) float64 { return stats.Median(rates(results[ceilingKey{c, n}])) }
			fmt.Fprintf(out, "| %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", n,
				spread(results[ceilingKey{bullmqDrain, n}]), spread(results[ceilingKey{shaperHandler, n}]), ratio(med(shaperHandler), med(bullmqDrain)),
				paired(results[ceilingKey{shaperHandler, n}], results[ceilingKey{bullmqDrain, n}]),
				spread(results[ceilingKey{bullmqHTTP, n}]), spread(results[ceilingKey{shaperHTTP, n}]), ratio(med(shaperHTTP), med(bullmqHTTP)),
				paired(results[ceilingKey{shaperHTTP, n}], results[ceilingKey{bullmqHTTP, n}]))
		}
	}

	fmt.Fprintf(out, "\nWhat one job costs, summed over all rounds and divided by the jobs drained. Redis commands count those run inside scripts; "+
		"\"scripts\" counts script calls (each one round trip). Blocking commands count too, as each returns: a BullMQ worker that finds nothing waits in `bzpopmin` on its queue's marker "+
		"(with a backlog it takes its next job as it finishes one, so it seldom blocks; one still blocked at the end is not counted); asynq's servers poll and never block. CPU is per job in µs: the Redis server, the contender's processes "+
		"(BullMQ's from when its connected `Worker` is told to run: starting node, loading BullMQ and connecting are left out), "+
		"and this benchmark's process (the fake upstream for HTTP; otherwise only polling for the end).\n\n")
	fmt.Fprintf(out, "| contender | replicas | Redis cmds/job | scripts/job | Redis CPU | drainers' CPU | bench CPU | commands per job (≥ 0.01) |\n")
	fmt.Fprintf(out, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for _, n := range b.o.replicas {
		for _, c := range contenders {
			rs := results[ceilingKey{c, n}]
			sum := drainResult{redis: redisstats.Delta{Calls: map[string]int64{}}}
			for _, r := range rs {
				sum.jobs += r.jobs
				for k, v := range r.redis.Calls {
					sum.redis.Calls[k] += v
				}
				sum.redis.CPU += r.redis.CPU
				sum.drainCPU += r.drainCPU
				sum.selfCPU += r.selfCPU
			}
			jobs := int64(sum.jobs)
			fmt.Fprintf(out, "| %s | %d | %.2f | %.2f | %.1f µs | %.1f µs | %.1f µs | %s |\n",
				contenderNames[c], n, float64(sum.redis.Total())/float64(jobs), float64(sum.redis.Scripts())/float64(jobs),
				stats.Micros(sum.redis.CPU, jobs), stats.Micros(sum.drainCPU, jobs), stats.Micros(sum.selfCPU, jobs), sum.redis.PerJob(jobs, 0.01))
		}
	}
	fmt.Fprintln(out)
	return nil
}

func rates(rs []drainResult) []float64 {
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[i] = r.rate
	}
	return out
}

// paired is the median (min–max) of a[i]/b[i], round by round.
func paired(a, b []drainResult) string {
	var xs []float64
	for i := range min(len(a), len(b)) {
		if b[i].rate > 0 {
			xs = append(xs, a[i].rate/b[i].rate)
		}
	}
	if len(xs) == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f× (%.2f–%.2f)", stats.Median(xs), slices.Min(xs), slices.Max(xs))
}

// ratio is a/b as "1.23×", or "–" when either contender did not run.
func ratio(a, b float64) string {
	if a == 0 || b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func spread(rs []drainResult) string {
	xs := rates(rs)
	if len(xs) == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f (%.0f–%.0f)", stats.Median(xs), slices.Min(xs), slices.Max(xs))
}

// drain measures one contender with n replicas on a fresh backlog.
func (b *bench) drain(ctx context.Context, contender string, n int, label string) (drainResult, error) {
	res := drainResult{jobs: b.o.ceilingJobs}
	if err := b.flush(ctx); err != nil {
		return res, err
	}
	b.up.reset()
	jobs := b.o.ceilingJobs

	// What the contender drains, and how to tell it has finished.
	var qname string
	switch contender {
	case asynqDrain, asynqHTTP:
		qname = "bench.noop"
		payload, _ := json.Marshal(httpJob("noop", 0))
		if err := b.fillAsynq(ctx, qname, jobs, payload); err != nil {
			return res, err
		}
	case bullmqDrain, bullmqHTTP:
		payload, _ := json.Marshal(httpJob("noop", 0))
		if err := b.bullmq.fill(ctx, b.redisURL(), jobs, payload); err != nil {
			return res, err
		}
	case shaperHTTP, shaperHandler:
		name := "noop"
		if contender == shaperHandler {
			name = "noopgo"
		}
		qname = jobstore.QueueName(name)
		q, err := b.newQueue(name)
		if err != nil {
			return res, err
		}
		mk := func(i int) *queue.Job { return httpJob(name, i) }
		if contender == shaperHandler {
			mk = func(i int) *queue.Job {
				j := &queue.Job{Upstream: name, Task: "noop", Body: []byte(`{"n":` + strconv.Itoa(i) + `}`)}
				if b.o.fair {
					j.Tenant, j.Partition = "t"+strconv.Itoa(i%fairTenants), "p"+strconv.Itoa(i%fairPartitions)
				}
				return j
			}
		}
		err = b.fill(ctx, q, jobs, mk)
		q.Close()
		if err != nil {
			return res, err
		}
	}

	before, err := redisstats.Take(b.redis)
	if err != nil {
		return res, err
	}
	selfBefore, _ := fleet.SelfCPU()

	var procs []*fleet.Proc
	var children []*child
	stopAll := func() error {
		var errs []error
		for _, c := range children {
			if _, err := c.stop(); err != nil {
				errs = append(errs, err)
			}
		}
		if err := fleet.StopAll(30*time.Second, procs...); err != nil {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}
	env := map[string]string{
		envRedis: b.redis.Addr, envConcurrency: strconv.Itoa(b.o.workers), envRate: strconv.Itoa(ceilingRate),
	}
	switch contender {
	case shaperHTTP:
		cfg, err := b.writeConfig("ceiling.yaml", upstreamConfig{name: "noop", baseURL: b.up.url, rate: ceilingRate, workers: b.o.workers})
		if err != nil {
			return res, err
		}
		if procs, _, err = b.startWorkers(n, cfg, label, false); err != nil {
			return res, err
		}
	case asynqDrain, asynqHTTP, shaperHandler:
		role := roleAsynq
		env[envQueue] = qname
		switch contender {
		case asynqHTTP:
			env[envURL] = b.up.url
		case shaperHandler:
			role, env[envQueue] = roleHandler, "noopgo"
			if b.o.fair {
				env[envFair] = "1"
			}
		}
		for i := 0; i < n; i++ {
			c, err := startChild(fmt.Sprintf("%s-%d", label, i+1), role, env, b.o.profileDir)
			if err != nil {
				stopAll()
				return res, err
			}
			children = append(children, c)
		}
	case bullmqDrain, bullmqHTTP:
		url := ""
		if contender == bullmqHTTP {
			url = b.up.url
		}
		for i := 0; i < n; i++ {
			c, err := b.bullmq.start(fmt.Sprintf("%s-%d", label, i+1), b.redisURL(), b.o.workers, url)
			if err != nil {
				stopAll()
				return res, err
			}
			children = append(children, c)
		}
		// All of them at once, once every node has started.
		for _, c := range children {
			if err := c.start(); err != nil {
				stopAll()
				return res, err
			}
		}
	}

	// Done when every job has reached the upstream (shaper HTTP), when
	// asynq's (or BullMQ's) queue has nothing pending or running, or when the shaper
	// upstream's counters show no backlog (its jobs wait in flows, not in
	// asynq's pending list). Our own polls are taken back out of the
	// counts.
	// (shaper's counters are read raw, one HGETALL a poll, so that the
	// polls come out of the counts exactly.)
	counter := jobstore.For("", "noopgo")
	polls := 0
	err = waitFor(5*time.Minute, 5*time.Millisecond, "the backlog to drain", func() (bool, error) {
		switch contender {
		case shaperHTTP:
			return b.up.arrived.Load() >= int64(jobs), nil
		case shaperHandler:
			polls++
			counts, err := counter.ReadCounts(ctx, b.rdb)
			if err != nil {
				return false, err
			}
			var backlog int64
			for _, c := range counts {
				backlog += c["pending"] + c["scheduled"] + c["retry"] + c["deferred"] + c["active"]
			}
			return backlog == 0, nil
		}
		polls++
		pendingKey, activeKey := "asynq:{"+qname+"}:pending", "asynq:{"+qname+"}:active"
		if contender == bullmqDrain || contender == bullmqHTTP {
			pendingKey, activeKey = "bull:"+bullmqQueue+":wait", "bull:"+bullmqQueue+":active"
		}
		pending, err := b.rdb.LLen(ctx, pendingKey).Result()
		if err != nil {
			return false, err
		}
		active, err := b.rdb.LLen(ctx, activeKey).Result()
		return pending == 0 && active == 0, err
	})
	if err != nil {
		stopAll()
		return res, err
	}
	after, err := redisstats.Take(b.redis)
	if err != nil {
		stopAll()
		return res, err
	}
	res.redis = after.Since(before)
	own, perPoll := "llen", int64(2)
	if contender == shaperHandler {
		own, perPoll = "hgetall", 1
	}
	res.redis.Calls[own] -= perPoll * int64(polls)
	if res.redis.Calls[own] <= 0 {
		delete(res.redis.Calls, own)
	}
	selfAfter, _ := fleet.SelfCPU()
	res.selfCPU = selfAfter - selfBefore
	for _, p := range procs {
		cpu, err := p.CPU()
		if err != nil {
			stopAll()
			return res, err
		}
		res.drainCPU += cpu
	}
	for _, c := range children {
		cpu, err := c.drainCPU()
		if err != nil {
			stopAll()
			return res, err
		}
		res.drainCPU += cpu
	}

	var times []time.Duration
	if contender == shaperHTTP {
		if err := stopAll(); err != nil {
			return res, err
		}
		times = b.up.arrivals()
	} else {
		for _, c := range children {
			ts, err := c.stop()
			if err != nil {
				return res, err
			}
			for _, t := range ts {
				times = append(times, time.Duration(t.UnixNano()))
			}
		}
	}
	if len(times) < jobs {
		return res, fmt.Errorf("%d jobs ran, want %d", len(times), jobs)
	}
	res.rate = middleRate(times)
	return res, nil
}

// middleRate is the rate over the middle 80% of times, leaving out the
// replicas' start and the stragglers at the end.
func middleRate(times []time.Duration) float64 {
	t := slices.Clone(times)
	slices.Sort(t)
	lo, hi := len(t)/10, len(t)-1-len(t)/10
	if hi <= lo || t[hi] == t[lo] {
		return 0
	}
	return float64(hi-lo) / (t[hi] - t[lo]).Seconds()
}
