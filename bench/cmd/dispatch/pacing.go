package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/shaperhq/shaper/bench/internal/fleet"
	"github.com/shaperhq/shaper/bench/internal/sched"
	"github.com/shaperhq/shaper/fakeupstream"
	"github.com/shaperhq/shaper/queue"
)

type pacingResult struct {
	rate, replicas int
	received       int
	most, mostTen  int
	late           int           // slots given up because a worker woke too late
	stall          time.Duration // the measuring process's worst scheduling delay
	gaps           fakeupstream.GapStats
}

// pacing drains a deep backlog at each rate with each number of replicas and
// judges the arrivals in a fixed window from the first one.
func (b *bench) pacing(ctx context.Context, out io.Writer) error {
	var results []pacingResult
	for _, rate := range b.o.rates {
		for _, n := range b.o.replicas {
			r, err := b.pacingCase(ctx, rate, n)
			if err != nil {
				return fmt.Errorf("%d/s with %d replicas: %w", rate, n, err)
			}
			fmt.Fprintf(os.Stderr, "pacing %d/s × %d replicas: %d received\n", rate, n, r.received)
			results = append(results, r)
		}
	}
	w := b.o.window
	fmt.Fprintf(out, "### Pacing through the whole product\n\n")
	fmt.Fprintf(out, "`shaper work` replicas drain a deep backlog into the fake upstream (no limit of its own; it records arrivals). "+
		"Limit `{rate: R, per: 1s}` with the default 20ms guard, so the most a full backlog can drain at is R × 1s/1.02s = 98%% of R. "+
		"Measured over %v from the first arrival. Late slots are those the replicas gave up because a worker woke more than half the guard after its slot. "+
		"Bench stall is the longest a goroutine of this process (which stamps arrivals) waited to run during the window: arrivals can bunch by that much without any sender being early.\n\n", w)
	fmt.Fprintf(out, "| limit R/s | replicas | received | achieved /s | of R | most in any 1s (≤ R) | most in any 100ms | gap p1 | gap p50 | gap p99 | gap max | late slots | bench stall |\n")
	fmt.Fprintf(out, "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range results {
		achieved := float64(r.received) / w.Seconds()
		flag := ""
		if r.most > r.rate {
			flag = " **over**"
		}
		fmt.Fprintf(out, "| %d | %d | %d | %.1f | %.1f%% | %d%s | %d | %s | %s | %s | %s | %d | ≥ %s |\n",
			r.rate, r.replicas, r.received, achieved, 100*achieved/float64(r.rate), r.most, flag, r.mostTen,
			ms(r.gaps.P1), ms(r.gaps.P50), ms(r.gaps.P99), ms(r.gaps.Max), r.late, ms(r.stall))
	}
	fmt.Fprintln(out)
	return nil
}

func (b *bench) pacingCase(ctx context.Context, rate, replicas int) (pacingResult, error) {
	res := pacingResult{rate: rate, replicas: replicas}
	if err := b.flush(ctx); err != nil {
		return res, err
	}
	b.up.reset()
	const name = "paced"
	cfg, err := b.writeConfig("pacing.yaml", upstreamConfig{name: name, baseURL: b.up.url, rate: rate, workers: b.o.pacingWorkers})
	if err != nil {
		return res, err
	}
	q, err := b.newQueue(name)
	if err != nil {
		return res, err
	}
	defer q.Close()
	// Enough that the backlog outlasts the window and the replicas' start.
	jobs := int(float64(rate)*(b.o.window.Seconds()+5)) + 100
	if err := b.fill(ctx, q, jobs, func(i int) *queue.Job { return httpJob(name, i) }); err != nil {
		return res, err
	}
	ws, addrs, err := b.startWorkers(replicas, cfg, "pacing", true)
	if err != nil {
		return res, err
	}
	err = waitFor(30*time.Second, time.Millisecond, "the first arrival", func() (bool, error) {
		return b.up.arrived.Load() > 0, nil
	})
	if err == nil {
		before := sched.Read()
		// Requests sent just before the window closes are still arriving.
		time.Sleep(b.o.window + 200*time.Millisecond)
		res.stall = sched.Read().WorstSince(before)
		var late float64
		late, err = scrape(addrs, "shaper_pacing_late_slots_total")
		res.late = int(late)
	}
	if serr := fleet.StopAll(30*time.Second, ws...); err == nil {
		err = serr
	}
	if err != nil {
		return res, err
	}
	all := b.up.arrivals()
	first := slices.Min(all)
	var window []time.Duration
	for _, at := range all {
		if at >= first && at < first+b.o.window {
			window = append(window, at)
		}
	}
	res.received = len(window)
	res.most = fakeupstream.MaxInWindow(window, time.Second)
	res.mostTen = fakeupstream.MaxInWindow(window, 100*time.Millisecond)
	res.gaps = fakeupstream.GapPercentiles(window)
	return res, nil
}
