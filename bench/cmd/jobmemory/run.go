package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/bench/internal/machine"
	"github.com/shaperhq/shaper/bench/internal/redisproc"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

type options struct {
	jobs     int
	body     int
	bigBody  int
	response int
	workers  int
}

func parseFlags(args []string) (options, error) {
	fs := flag.NewFlagSet("jobmemory", flag.ContinueOnError)
	var o options
	fs.IntVar(&o.jobs, "jobs", 20_000, "jobs stored per subject")
	fs.IntVar(&o.body, "body", 100, "request body bytes of each job")
	fs.IntVar(&o.bigBody, "big-body", 1000, "request body bytes of the second run of every subject; 0 skips it")
	fs.IntVar(&o.response, "response", 50, "response body bytes of each finished job")
	fs.IntVar(&o.workers, "workers", 16, "goroutines enqueueing")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.jobs < 1000:
		// Fewer and the keys a queue shares, created by its first job
		// of the run, weigh in the figure.
		return o, fmt.Errorf("-jobs %d: must be at least 1000", o.jobs)
	case o.body < 0 || o.bigBody < 0 || o.response < 0:
		return o, fmt.Errorf("-body, -big-body and -response must not be negative")
	case o.workers < 1:
		return o, fmt.Errorf("-workers %d: must be at least 1", o.workers)
	}
	return o, nil
}

const (
	upstream = "stripe"
	tenant   = "t"
	// listpackDefault is Redis's default hash-max-listpack-value; big is
	// what docs/operations.md suggests considering.
	listpackDefault = 64
	listpackBig     = 1024
)

// queueName is the asynq queue of both shaper's and asynq's jobs, so that
// their key names are equally long.
var queueName = jobstore.QueueName(upstream)

func upstreams() []shaper.Upstream {
	return []shaper.Upstream{{Name: upstream, Limits: []leaky.Limit{leaky.PerSecond(1000)}, Lanes: map[string]int{"default": 1}, Retry: shaper.Retry{MaxAttempts: 3},
		ResultRetention: time.Hour, DeadRetention: time.Hour}}
}

// job is the i-th job of a run: what the unit test
// queue.TestMemoryEstimateCoversAJob enqueues.
func job(i, body int) *queue.Job {
	return &queue.Job{Tenant: tenant, Upstream: upstream, Method: "POST", Path: "/v1/charges/" + strconv.Itoa(i),
		Headers: map[string]string{"Content-Type": "application/json"}, Body: []byte(strings.Repeat("b", body))}
}

// response is what the upstream answers each job.
func response(n int) *queue.Response {
	return &queue.Response{Status: 200, Headers: map[string][]string{"Content-Type": {"application/json"}},
		Body: []byte(strings.Repeat("r", n))}
}

// measurement is one subject's pair of states in one config: queued (or
// pending) and finished (succeeded or completed) and kept.
type measurement struct {
	listpack, body     int
	jobs               int     // in each state
	queued, finished   float64 // used_memory growth per job
	queuedKind         string  // a task hash's type and encoding
	finishedKind       string
	queuedUsage        int64 // and its MEMORY USAGE
	finishedUsage      int64
	queuedKeysPerJob   float64
	finishedKeysPerJob float64
	took               time.Duration
}

// sampler measures a state's growth per job from a base it reads first.
type sampler struct {
	srv    *redisproc.Server
	before int64
	keys   int64
}

func (s *sampler) base() error {
	var err error
	s.before, s.keys, err = settled(s.srv)
	return err
}

// per returns the growth per job since base, the new keys per job and a
// task hash's shape.
func (s *sampler) per(ctx context.Context, n int) (perJob, keysPerJob float64, kind string, usage int64, err error) {
	used, keys, err := settled(s.srv)
	if err != nil {
		return 0, 0, "", 0, err
	}
	err = withClient(s.srv, 1, func(rdb *redis.Client) error {
		_, kind, usage, err = sampleTask(ctx, rdb, queueName)
		return err
	})
	return float64(used-s.before) / float64(n), float64(keys-s.keys) / float64(n), kind, usage, err
}

// withClient runs f with a client of up to pool connections, and closes it.
func withClient(srv *redisproc.Server, pool int, f func(*redis.Client) error) error {
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: pool})
	defer rdb.Close()
	return f(rdb)
}

// fresh empties the server and sets hash-max-listpack-value.
func fresh(ctx context.Context, srv *redisproc.Server, listpack int) error {
	return withClient(srv, 1, func(rdb *redis.Client) error {
		if err := rdb.FlushAll(ctx).Err(); err != nil {
			return err
		}
		return rdb.ConfigSet(ctx, "hash-max-listpack-value", strconv.Itoa(listpack)).Err()
	})
}

// parallel runs f(i) for i in [from, from+n) over workers goroutines.
func parallel(n, from, workers int, f func(i int) error) error {
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				if err := f(from + i); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// measureShaper: queued, then taken and finished as succeeded with the
// response, kept for the upstream's result retention (an hour), as the
// dispatcher stores them. With bd set it takes one more queued job apart
// before they are finished.
func measureShaper(ctx context.Context, srv *redisproc.Server, o options, listpack, body int, bd *breakdown) (measurement, error) {
	m := measurement{listpack: listpack, body: body, jobs: o.jobs}
	t0 := time.Now()
	if err := fresh(ctx, srv, listpack); err != nil {
		return m, err
	}
	result, err := queue.EncodeResponse(response(o.response))
	if err != nil {
		return m, err
	}
	withQueue := func(pool int, f func(*redis.Client, *queue.Queue) error) error {
		return withClient(srv, pool, func(rdb *redis.Client) error {
			q, err := queue.New(rdb, queue.Config{Upstreams: upstreams()})
			if err != nil {
				return err
			}
			defer q.Close()
			return f(rdb, q)
		})
	}
	enqueue := func(q *queue.Queue, i int) error {
		if _, created, err := q.Enqueue(ctx, job(i, body)); err != nil || !created {
			return fmt.Errorf("enqueue job %d: created %v, %v", i, created, err)
		}
		return nil
	}
	finish := func() (int, error) {
		var n int
		err := withQueue(1, func(rdb *redis.Client, q *queue.Queue) error {
			n, err = finishAll(ctx, rdb, q, result)
			return err
		})
		return n, err
	}
	// One job first, through to its end, so that the keys every job
	// shares (the queue's sets, counters, the bucket, scripts) exist.
	if err := withQueue(1, func(_ *redis.Client, q *queue.Queue) error { return enqueue(q, -1) }); err != nil {
		return m, err
	}
	if n, err := finish(); err != nil || n != 1 {
		return m, fmt.Errorf("warm-up: finished %d jobs, want 1 (%v)", n, err)
	}
	s := &sampler{srv: srv}
	if err := s.base(); err != nil {
		return m, err
	}
	err = withQueue(o.workers, func(_ *redis.Client, q *queue.Queue) error {
		return parallel(o.jobs, 0, o.workers, func(i int) error { return enqueue(q, i) })
	})
	if err != nil {
		return m, err
	}
	if m.queued, m.queuedKeysPerJob, m.queuedKind, m.queuedUsage, err = s.per(ctx, o.jobs); err != nil {
		return m, err
	}
	total := o.jobs
	if bd != nil {
		err := withQueue(1, func(rdb *redis.Client, q *queue.Queue) error {
			return bd.take(ctx, rdb, func() error { return enqueue(q, o.jobs) })
		})
		if err != nil {
			return m, fmt.Errorf("breakdown: %w", err)
		}
		total++
	}
	n, err := finish()
	if err != nil {
		return m, err
	}
	if n != total {
		return m, fmt.Errorf("finished %d jobs, want %d", n, total)
	}
	if m.finished, m.finishedKeysPerJob, m.finishedKind, m.finishedUsage, err = s.per(ctx, total); err != nil {
		return m, err
	}
	m.took = time.Since(t0)
	return m, nil
}

// finishAll takes every queued job and finishes it as succeeded with
// result, kept for the upstream's result retention, as the dispatcher does
// (less the request), and returns how many it finished.
func finishAll(ctx context.Context, rdb *redis.Client, q *queue.Queue, result []byte) (int, error) {
	u, _ := q.Upstream(upstream)
	bucket, err := leaky.New(rdb, leaky.Config{}).Bucket(queueName, leaky.BucketConfig{Limits: []leaky.Limit{leaky.PerSecond(1_000_000)}})
	if err != nil {
		return 0, err
	}
	space := jobstore.For("", upstream)
	taker, err := jobstore.NewTaker(rdb, space, jobstore.TakerConfig{Upstream: u, Bucket: bucket,
		Lookahead: time.Second, Lease: 30 * time.Second, ConcurrencyLease: time.Minute})
	if err != nil {
		return 0, err
	}
	done := 0
	for {
		tk, err := taker.Take(ctx, 500)
		if err != nil {
			return done, err
		}
		if len(tk.Jobs) == 0 {
			return done, nil
		}
		items := make([]jobstore.Finished, 0, len(tk.Jobs))
		for _, t := range tk.Jobs {
			msg, err := jobstore.Unmarshal(t.Msg)
			if err != nil {
				return done, err
			}
			j, err := queue.DecodeJob(t.ID, msg.Payload)
			if err != nil {
				return done, err
			}
			// Kept without its request, as the dispatcher keeps it.
			items = append(items, jobstore.Finished{ID: t.ID, Lane: j.Lane, Partition: j.Partition, Msg: queue.SucceededMessage(msg),
				Outcome: jobstore.Succeeded, Result: result, Retention: u.ResultRetention})
		}
		errs, err := jobstore.Finish(ctx, rdb, jobstore.AsynqKeys(queueName), space.CountsKey(), space.BacklogKey(), items)
		if err != nil {
			return done, err
		}
		if err := errors.Join(errs...); err != nil {
			return done, err
		}
		done += len(items)
	}
}

// asynqPayload is the JSON a plain asynq user would store for the same
// request: json.Marshal of the job with what shaper filled in before its
// compact form (ID, lane, attempts, idempotency key, creation time).
func asynqPayload(q *queue.Queue, i, body int) ([]byte, error) {
	j := job(i, body)
	if err := q.Prepare(j); err != nil {
		return nil, err
	}
	return json.Marshal(j)
}

// measureAsynq: pending tasks enqueued with asynq's Client and default
// options, then processed by an asynq Server whose handler writes a result
// of o.response bytes, kept for an hour.
func measureAsynq(ctx context.Context, srv *redisproc.Server, o options, listpack, body int, bd *breakdown) (measurement, error) {
	m := measurement{listpack: listpack, body: body, jobs: o.jobs}
	t0 := time.Now()
	if err := fresh(ctx, srv, listpack); err != nil {
		return m, err
	}
	// Prepare only fills in the job; it touches no Redis, so this client
	// never connects.
	idle := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer idle.Close()
	q, err := queue.New(idle, queue.Config{Upstreams: upstreams()})
	if err != nil {
		return m, err
	}
	q.Close()
	opt := asynq.RedisClientOpt{Addr: srv.Addr, PoolSize: o.workers}
	enqueue := func(c *asynq.Client, i int) error {
		p, err := asynqPayload(q, i, body)
		if err != nil {
			return err
		}
		// Retention is what keeps a completed task; it must be set when
		// the task is enqueued, and adds 3 bytes to its message (shaper's
		// message holds its retention too).
		_, err = c.EnqueueContext(ctx, asynq.NewTask(queue.TaskType, p), asynq.Queue(queueName), asynq.Retention(time.Hour))
		return err
	}
	withClient := func(f func(c *asynq.Client) error) error {
		c := asynq.NewClient(opt)
		defer c.Close()
		return f(c)
	}
	result := []byte(strings.Repeat("r", o.response))
	completed := 1
	process := func() error {
		s := asynq.NewServer(opt, asynq.Config{Concurrency: 32, Queues: map[string]int{queueName: 1}, LogLevel: asynq.WarnLevel})
		err := s.Start(asynq.HandlerFunc(func(_ context.Context, t *asynq.Task) error {
			_, err := t.ResultWriter().Write(result)
			return err
		}))
		if err != nil {
			return err
		}
		defer s.Shutdown()
		insp := asynq.NewInspector(asynq.RedisClientOpt{Addr: srv.Addr})
		defer insp.Close()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			qi, err := insp.GetQueueInfo(queueName)
			if err != nil {
				return err
			}
			if qi.Completed == completed {
				return nil
			}
			if qi.Completed > completed || time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("%d tasks completed, want %d (%d pending, %d active, %d retry, %d archived)",
					qi.Completed, completed, qi.Pending, qi.Active, qi.Retry, qi.Archived)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if err := withClient(func(c *asynq.Client) error { return enqueue(c, -1) }); err != nil {
		return m, err
	}
	if err := process(); err != nil {
		return m, fmt.Errorf("warm-up: %w", err)
	}
	s := &sampler{srv: srv}
	if err := s.base(); err != nil {
		return m, err
	}
	err = withClient(func(c *asynq.Client) error {
		return parallel(o.jobs, 0, o.workers, func(i int) error { return enqueue(c, i) })
	})
	if err != nil {
		return m, err
	}
	if m.queued, m.queuedKeysPerJob, m.queuedKind, m.queuedUsage, err = s.per(ctx, o.jobs); err != nil {
		return m, err
	}
	total := o.jobs
	if bd != nil {
		err := withClient(func(c *asynq.Client) error {
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 1})
			defer rdb.Close()
			return bd.take(ctx, rdb, func() error { return enqueue(c, o.jobs) })
		})
		if err != nil {
			return m, fmt.Errorf("breakdown: %w", err)
		}
		total++
	}
	completed += total
	if err := process(); err != nil {
		return m, err
	}
	if m.finished, m.finishedKeysPerJob, m.finishedKind, m.finishedUsage, err = s.per(ctx, total); err != nil {
		return m, err
	}
	m.took = time.Since(t0)
	return m, nil
}

// asynqVersion is the version of asynq this command is built with.
func asynqVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/hibiken/asynq" {
				return d.Version
			}
		}
	}
	return "(version unknown)"
}

func run(ctx context.Context, args []string, out, progress io.Writer) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	loadBefore := machine.Load()
	srv, err := redisproc.Start()
	if err != nil {
		return err
	}
	defer srv.Stop()
	began := time.Now()

	bodies := []int{o.body}
	if o.bigBody > 0 && o.bigBody != o.body {
		bodies = append(bodies, o.bigBody)
	}
	type subject struct {
		name             string
		queued, finished string
		measure          func(context.Context, *redisproc.Server, options, int, int, *breakdown) (measurement, error)
		bd               *breakdown
	}
	subjects := []*subject{
		{name: "shaper", queued: "queued", finished: fmt.Sprintf("succeeded, kept 1h with a %d-byte response", o.response),
			measure: measureShaper, bd: &breakdown{name: "shaper, one queued job"}},
		{name: "asynq " + asynqVersion(), queued: "pending", finished: fmt.Sprintf("completed, kept 1h with a %d-byte result", o.response),
			measure: measureAsynq, bd: &breakdown{name: "asynq, one pending task"}},
	}
	results := map[string]map[[2]int]measurement{}
	for _, s := range subjects {
		results[s.name] = map[[2]int]measurement{}
		for _, body := range bodies {
			for _, lp := range []int{listpackDefault, listpackBig} {
				var bd *breakdown
				if body == o.body && lp == listpackDefault {
					bd = s.bd
				}
				m, err := s.measure(ctx, srv, o, lp, body, bd)
				if err != nil {
					return fmt.Errorf("%s, body %d, hash-max-listpack-value %d: %w", s.name, body, lp, err)
				}
				fmt.Fprintf(progress, "%s body %d listpack %d: %s %.0f B, %s %.0f B per job (%v)\n",
					s.name, body, lp, s.queued, m.queued, s.finished, m.finished, m.took.Round(time.Millisecond))
				results[s.name][[2]int{body, lp}] = m
				if bd != nil {
					bd.perJob = m.queued
				}
			}
		}
	}

	fmt.Fprintf(out, "### Redis memory per job: shaper and asynq\n\n")
	fmt.Fprintf(out, "INFO used_memory growth while %d jobs are stored, divided by %d, after one job through to its end so that the keys every job shares exist; FLUSHALL between subjects. "+
		"Each job: POST /v1/charges/N, a Content-Type header and a body of B bytes, tenant %q, upstream %q (asynq queue %q for both), no idempotency key. "+
		"hash-max-listpack-value is Redis's default %d, or %d (CONFIG SET).\n\n",
		o.jobs, o.jobs, tenant, upstream, queueName, listpackDefault, listpackBig)
	fmt.Fprintf(out, "| subject | state | body B | per job, listpack-value %d | per job, listpack-value %d | a task hash (%d) | a task hash (%d) | keys per job |\n",
		listpackDefault, listpackBig, listpackDefault, listpackBig)
	fmt.Fprintf(out, "| :--- | :--- | ---: | ---: | ---: | :--- | :--- | ---: |\n")
	for _, s := range subjects {
		for _, body := range bodies {
			a, b := results[s.name][[2]int{body, listpackDefault}], results[s.name][[2]int{body, listpackBig}]
			fmt.Fprintf(out, "| %s | %s | %d | %.0f B | %.0f B | %s, %d B | %s, %d B | %.2f |\n",
				s.name, s.queued, body, a.queued, b.queued, a.queuedKind, a.queuedUsage, b.queuedKind, b.queuedUsage, a.queuedKeysPerJob)
			fmt.Fprintf(out, "| %s | %s | %d | %.0f B | %.0f B | %s, %d B | %s, %d B | %.2f |\n",
				s.name, s.finished, body, a.finished, b.finished, a.finishedKind, a.finishedUsage, b.finishedKind, b.finishedUsage, a.finishedKeysPerJob)
		}
	}

	fmt.Fprintf(out, "\nshaper / asynq, per job:\n\n")
	fmt.Fprintf(out, "| state | body B | listpack-value %d | listpack-value %d |\n| :--- | ---: | ---: | ---: |\n", listpackDefault, listpackBig)
	sh, aq := results[subjects[0].name], results[subjects[1].name]
	for _, body := range bodies {
		r := func(lp int, fin bool) string {
			x, y := sh[[2]int{body, lp}], aq[[2]int{body, lp}]
			if fin {
				return fmt.Sprintf("%.0f / %.0f = %.2f", x.finished, y.finished, x.finished/y.finished)
			}
			return fmt.Sprintf("%.0f / %.0f = %.2f", x.queued, y.queued, x.queued/y.queued)
		}
		fmt.Fprintf(out, "| queued / pending | %d | %s | %s |\n", body, r(listpackDefault, false), r(listpackBig, false))
		fmt.Fprintf(out, "| succeeded / completed, kept | %d | %s | %s |\n", body, r(listpackDefault, true), r(listpackBig, true))
	}
	fmt.Fprintf(out, `
- shaper's payload is queue.EncodeJob's compact JSON; its response is queue.EncodeResponse of status 200, a Content-Type header and a %d-byte body, finished through jobstore.Taker and jobstore.Finish with the upstream's result retention (1h) and without its request's body and headers (queue.SucceededMessage), as the dispatcher stores it.
- asynq's payload is json.Marshal(queue.Job) of the same job as queue.Prepare fills it in (ID, lane, max_attempts, idempotency_key = ID, created_at: what shaper stored before its compact form; the body base64), enqueued with asynq.Client and default options but the queue and asynq.Retention(1h) (which must be given at enqueue, and adds 3 B to the message; shaper's holds its retention too); its result is %d raw bytes written by the handler with ResultWriter, and the task is completed by an asynq.Server with asynq.Retention(1h).
- "a task hash" is the type, encoding and MEMORY USAGE (SAMPLES 0) of one task hash in that state; used_memory per job also counts the job's members in the queue's sorted sets and lists and its key's slot in the keyspace.
`, o.response, o.response)

	for _, s := range subjects {
		s.bd.write(out)
	}
	fmt.Fprintf(out, "\nMachine: %s. Load average (1, 5, 15 min) %s before, %s after. Total time %v.\n",
		machine.Describe(srv.Version), loadBefore, machine.Load(), time.Since(began).Round(time.Second))
	cmd := "go run ./cmd/jobmemory"
	if len(args) > 0 {
		cmd += " " + strings.Join(args, " ")
	}
	fmt.Fprintf(out, "Command: `cd bench && %s`\n", cmd)
	return nil
}
