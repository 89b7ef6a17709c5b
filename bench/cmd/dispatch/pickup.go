package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"time"

	"github.com/hibiken/asynq"

	"github.com/shaperhq/shaper/bench/internal/fleet"
	"github.com/shaperhq/shaper/bench/internal/redisstats"
	"github.com/shaperhq/shaper/fakeupstream"
)

// pickupRate is the limit in the pickup cases: well above one job at a
// time, so that pacing holds nothing back and only pickup is measured.
const pickupRate = 1000

// idleFor is how long the idle cost of polling is measured.
const idleFor = 2 * time.Second

type pickupResult struct {
	name      string
	upstreams int
	replicas  int
	latencies []time.Duration
	idle      redisstats.Delta
}

// pickup enqueues one job at a time on an idle upstream, each after a random
// pause, and times it from just before the enqueue to its arrival.
func (b *bench) pickup(ctx context.Context, out io.Writer) error {
	var results []pickupResult
	for _, u := range b.o.pickupUps {
		for _, n := range b.o.replicas {
			r, err := b.pickupShaper(ctx, u, n)
			if err != nil {
				return fmt.Errorf("shaper with %d upstreams and %d replicas: %w", u, n, err)
			}
			results = append(results, r)
		}
	}
	for _, c := range []struct {
		interval string
		samples  int
	}{{"", b.o.asynqSamples}, {"10ms", b.o.pickupSamples}} {
		if c.samples == 0 {
			continue
		}
		r, err := b.pickupAsynq(ctx, c.interval, c.samples)
		if err != nil {
			return fmt.Errorf("asynq: %w", err)
		}
		results = append(results, r)
	}
	fmt.Fprintf(out, "### Pickup latency on an idle upstream\n\n")
	fmt.Fprintf(out, "One job at a time, each after a random pause of up to %v, timed from just before the enqueue call to its arrival "+
		"(shaper: at the fake upstream over HTTP, every upstream limited to %d/s, each job to one of the configured upstreams at random; asynq: when its no-op handler runs). "+
		"\"Idle Redis load\" is the commands per second Redis serves with nothing queued, measured over %v. Target (issue 8): shaper p50 ≤ 20 ms and p99 ≤ 100 ms with 1,000 upstreams.\n\n",
		b.o.pickupGap, pickupRate, idleFor)
	fmt.Fprintf(out, "| drainer | upstreams | replicas | jobs | p50 | p90 | p99 | max | idle Redis load | idle commands |\n")
	fmt.Fprintf(out, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for _, r := range results {
		l := r.latencies
		perSec := idleFor.Seconds()
		fmt.Fprintf(out, "| %s | %d | %d | %d | %s | %s | %s | %s | %.1f cmds/s | %s |\n", r.name, r.upstreams, r.replicas, len(l),
			ms(fakeupstream.Percentile(l, 50)), ms(fakeupstream.Percentile(l, 90)), ms(fakeupstream.Percentile(l, 99)), ms(fakeupstream.Percentile(l, 100)),
			float64(r.idle.Total())/perSec, perSecond(r.idle, perSec))
	}
	fmt.Fprintln(out)
	return nil
}

// perSecond lists the idle commands per second, most frequent first.
func perSecond(d redisstats.Delta, secs float64) string {
	s := ""
	for i, name := range d.Commands() {
		if i == 4 {
			s += ", …"
			break
		}
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s %.1f", name, float64(d.Calls[name])/secs)
	}
	return s
}

func (b *bench) pickupShaper(ctx context.Context, upstreams, replicas int) (pickupResult, error) {
	res := pickupResult{name: "`shaper work`", upstreams: upstreams, replicas: replicas}
	if err := b.flush(ctx); err != nil {
		return res, err
	}
	b.up.reset()
	names := make([]string, upstreams)
	ups := make([]upstreamConfig, upstreams)
	for i := range names {
		names[i] = fmt.Sprintf("idle%04d", i)
		ups[i] = upstreamConfig{name: names[i], baseURL: b.up.url, rate: pickupRate}
	}
	cfg, err := b.writeConfig("pickup.yaml", ups...)
	if err != nil {
		return res, err
	}
	q, err := b.newQueue(names...)
	if err != nil {
		return res, err
	}
	defer q.Close()
	arrived := make(chan time.Time, 16)
	b.up.notify.Store(&arrived)
	defer b.up.notify.Store(nil)

	ws, _, err := b.startWorkers(replicas, cfg, "pickup", false)
	if err != nil {
		return res, err
	}
	defer fleet.StopAll(30*time.Second, ws...)
	i := 0
	send := func() (time.Duration, error) {
		for len(arrived) > 0 {
			<-arrived
		}
		i++
		job := httpJob(names[rand.N(len(names))], i)
		start := time.Now()
		if _, _, err := q.Enqueue(ctx, job); err != nil {
			return 0, err
		}
		select {
		case at := <-arrived:
			return at.Sub(start), nil
		case <-time.After(30 * time.Second):
			return 0, fmt.Errorf("job %d did not arrive within 30s", i)
		}
	}
	// The first job also waits for the replicas to start.
	if _, err := send(); err != nil {
		return res, err
	}
	if res.idle, err = b.idleLoad(); err != nil {
		return res, err
	}
	for len(res.latencies) < b.o.pickupSamples {
		time.Sleep(rand.N(b.o.pickupGap + 1))
		d, err := send()
		if err != nil {
			return res, err
		}
		res.latencies = append(res.latencies, d)
	}
	fmt.Fprintf(os.Stderr, "pickup shaper, %d upstreams × %d: p50 %v\n", upstreams, replicas, fakeupstream.Percentile(res.latencies, 50))
	return res, nil
}

// pickupAsynq times asynq's own server with TaskCheckInterval interval
// ("" for its default).
func (b *bench) pickupAsynq(ctx context.Context, interval string, samples int) (pickupResult, error) {
	res := pickupResult{name: "asynq, default polling (1s)", upstreams: 1, replicas: 1}
	if interval != "" {
		res.name = "asynq, TaskCheckInterval " + interval
	}
	if err := b.flush(ctx); err != nil {
		return res, err
	}
	const qname = "bench.idle"
	c, err := startChild("pickup-asynq", roleAsynq, map[string]string{
		envRedis: b.redis.Addr, envQueue: qname, envConcurrency: "10", envInterval: interval, envStream: "1",
	}, "")
	if err != nil {
		return res, err
	}
	defer c.stop()
	client := asynq.NewClientFromRedisClient(b.rdb)
	defer client.Close()
	i := 0
	send := func() (time.Duration, error) {
		for len(c.times) > 0 {
			<-c.times
		}
		i++
		payload, _ := json.Marshal(httpJob("idle", i))
		start := time.Now()
		if _, err := client.EnqueueContext(ctx, asynq.NewTask("bench:noop", payload), asynq.Queue(qname), asynq.TaskID("t"+strconv.Itoa(i))); err != nil {
			return 0, err
		}
		select {
		case at := <-c.times:
			return at.Sub(start), nil
		case <-time.After(30 * time.Second):
			return 0, fmt.Errorf("task %d did not run within 30s", i)
		}
	}
	if _, err := send(); err != nil {
		return res, err
	}
	if res.idle, err = b.idleLoad(); err != nil {
		return res, err
	}
	for len(res.latencies) < samples {
		time.Sleep(rand.N(b.o.pickupGap + 1))
		d, err := send()
		if err != nil {
			return res, err
		}
		res.latencies = append(res.latencies, d)
	}
	fmt.Fprintf(os.Stderr, "pickup %s: p50 %v\n", res.name, fakeupstream.Percentile(res.latencies, 50))
	return res, nil
}

// idleLoad is what Redis is asked while nothing is queued.
func (b *bench) idleLoad() (redisstats.Delta, error) {
	before, err := redisstats.Take(b.redis)
	if err != nil {
		return redisstats.Delta{}, err
	}
	time.Sleep(idleFor)
	after, err := redisstats.Take(b.redis)
	if err != nil {
		return redisstats.Delta{}, err
	}
	return after.Since(before), nil
}
