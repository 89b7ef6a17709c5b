package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shaperhq/shaper/bench/internal/machine"
	"github.com/shaperhq/shaper/bench/internal/redisproc"
	"github.com/shaperhq/shaper/bench/internal/stats"
	"github.com/shaperhq/shaper/fakeupstream"
	"github.com/shaperhq/shaper/leaky"
)

// lead is how far ahead of the replicas' common start they are launched:
// time to exec, dial Redis and settle, so that all begin together.
const lead = 1500 * time.Millisecond

type options struct {
	duration time.Duration
	rounds   int
	rates    []int64
	replicas []int
	workers  int
	per      time.Duration
}

func parseFlags(args []string) (options, error) {
	fs := flag.NewFlagSet("pacing", flag.ContinueOnError)
	var o options
	var rates, replicas string
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "how long each limiter sends in each case")
	fs.IntVar(&o.rounds, "rounds", 1, "rounds; each runs every case for both limiters, alternating which goes first; several give medians")
	fs.StringVar(&rates, "rates", "200,2000", "limits to pace at, sends per -per, comma-separated")
	fs.StringVar(&replicas, "replicas", "1,4", "replica processes sharing a limit, comma-separated")
	fs.IntVar(&o.workers, "workers", 8, "sending goroutines in each replica")
	fs.DurationVar(&o.per, "per", time.Second, "window of the limit")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, f := range strings.Split(rates, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil || n < 1 {
			return o, fmt.Errorf("-rates %q: want positive integers", rates)
		}
		o.rates = append(o.rates, n)
	}
	for _, f := range strings.Split(replicas, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return o, fmt.Errorf("-replicas %q: want positive integers", replicas)
		}
		o.replicas = append(o.replicas, n)
	}
	switch {
	case o.rounds < 1:
		return o, fmt.Errorf("-rounds %d: must be at least 1", o.rounds)
	case o.duration < o.per:
		return o, fmt.Errorf("-duration %v: must be at least -per %v, or no window is whole", o.duration, o.per)
	case o.workers < 1:
		return o, fmt.Errorf("-workers %d: must be at least 1", o.workers)
	case o.per < 10*time.Millisecond:
		return o, fmt.Errorf("-per %v: must be at least 10ms", o.per)
	}
	for _, r := range o.rates {
		if err := (leaky.Limit{Rate: r, Per: o.per}).Validate(); err != nil {
			return o, fmt.Errorf("-rates %d per %v: %w", r, o.per, err)
		}
	}
	return o, nil
}

// caseKey is one row of the table.
type caseKey struct {
	rate     int64
	replicas int
	limiter  string
}

// measurement is one run of one case, judged as the upstream would.
type measurement struct {
	sends     int
	perSecond float64
	mostPer   int // most sends in any window of length per
	mostTenth int // ... of length per/10
	gaps      fakeupstream.GapStats
	lateP99   time.Duration
	lateMax   time.Duration
	late      int
	refused   int
}

func run(ctx context.Context, args []string, out, progress io.Writer) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this binary to start replicas: %w", err)
	}
	loadBefore := machine.Load()
	srv, err := redisproc.Start()
	if err != nil {
		return err
	}
	defer srv.Stop()

	results := map[caseKey][]measurement{}
	began := time.Now()
	n := 0
	for round := range o.rounds {
		for _, r := range o.rates {
			for _, reps := range o.replicas {
				// Alternate which limiter goes first, by round and by
				// case, so that neither always runs on the warmer machine.
				order := []string{limiterShaper, limiterNaive}
				if (round+n)%2 == 1 {
					order = []string{limiterNaive, limiterShaper}
				}
				n++
				for _, lim := range order {
					k := caseKey{rate: r, replicas: reps, limiter: lim}
					m, err := measure(ctx, self, srv.Addr, k, o, fmt.Sprintf("pacing-%d-%d", began.UnixNano(), n))
					if err != nil {
						return fmt.Errorf("round %d, %d per %v, %d replicas, %s: %w", round+1, r, o.per, reps, lim, err)
					}
					results[k] = append(results[k], m)
					fmt.Fprintf(progress, "round %d/%d: %d per %v, %d replicas, %-6s %6.1f/s, most in %v %d, in %v %d, lateness p99 %v max %v, late skipped %d\n",
						round+1, o.rounds, r, o.per, reps, lim, m.perSecond, o.per, m.mostPer, o.per/10, m.mostTenth,
						m.lateP99.Round(time.Microsecond), m.lateMax.Round(time.Microsecond), m.late)
				}
			}
		}
	}
	printTable(out, o, results)
	fmt.Fprintf(out, "\nMachine: %s. Load average (1, 5, 15 min) %s before, %s after. Total time %v.\n",
		machine.Describe(srv.Version), loadBefore, machine.Load(), time.Since(began).Round(time.Second))
	fmt.Fprintf(out, "Command: `cd bench && go run ./cmd/pacing%s`\n", commandArgs(args))
	return nil
}

func commandArgs(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return " " + strings.Join(args, " ")
}

// measure runs one case: its replicas, started as child processes, send
// from a common start for o.duration, and their sends are merged.
func measure(ctx context.Context, self, addr string, k caseKey, o options, bucket string) (measurement, error) {
	start := time.Now().Add(lead)
	end := start.Add(o.duration)
	ro := replicaOptions{
		limiter: k.limiter, redis: addr, bucket: bucket,
		rate: k.rate, per: o.per, workers: o.workers, start: start, end: end,
	}
	reports := make([]*replicaReport, k.replicas)
	errs := make([]error, k.replicas)
	var wg sync.WaitGroup
	for i := range k.replicas {
		wg.Go(func() {
			cmd := exec.CommandContext(ctx, self, ro.args()...)
			cmd.Env = append(os.Environ(), replicaEnv+"=1")
			cmd.Stderr = os.Stderr
			b, err := cmd.Output()
			if err != nil {
				errs[i] = fmt.Errorf("replica %d: %w", i+1, err)
				return
			}
			reports[i], errs[i] = parseReplicaReport(b)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return measurement{}, err
		}
	}

	// Only sends inside [start, end) count: that is the span the rate is
	// computed over, and a stray send after the end would add a gap that
	// is nobody's doing.
	var sends, lateness []time.Duration
	m := measurement{}
	for _, r := range reports {
		for i, t := range r.sends {
			if t.Before(start) || !t.Before(end) {
				continue
			}
			sends = append(sends, t.Sub(start))
			lateness = append(lateness, r.lateness[i])
		}
		m.late += r.late
		m.refused += r.refused
	}
	slices.Sort(sends)
	m.sends = len(sends)
	m.perSecond = float64(len(sends)) / o.duration.Seconds()
	m.mostPer = fakeupstream.MaxInWindow(sends, o.per)
	m.mostTenth = fakeupstream.MaxInWindow(sends, o.per/10)
	m.gaps = fakeupstream.GapPercentiles(sends)
	m.lateP99 = fakeupstream.Percentile(lateness, 99)
	if len(lateness) > 0 {
		m.lateMax = slices.Max(lateness)
	}
	return m, nil
}

func printTable(out io.Writer, o options, results map[caseKey][]measurement) {
	tenth := o.per / 10
	fmt.Fprintf(out, "Pacing at a limit of `rate` per %v, %d sending goroutines per replica process, %v per run; ", o.per, o.workers, o.duration)
	if o.rounds == 1 {
		fmt.Fprintf(out, "one round.\n\n")
	} else {
		fmt.Fprintf(out, "medians of %d rounds (worst round in brackets where it matters).\n\n", o.rounds)
	}
	skipped := "late slots skipped"
	if o.rounds > 1 {
		skipped += fmt.Sprintf(" (all %d rounds)", o.rounds)
	}
	fmt.Fprintf(out, "| limit | replicas | limiter | sends/s | of limit | most in any %v | most in any %v | gap p1 | gap p50 | gap p99 | lateness p99 | %s | over the limit? |\n", o.per, tenth, skipped)
	fmt.Fprintf(out, "| ---: | ---: | :--- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :--- |\n")
	for _, r := range o.rates {
		limitPerSecond := float64(r) / o.per.Seconds()
		for _, reps := range o.replicas {
			for _, lim := range []string{limiterShaper, limiterNaive} {
				ms := results[caseKey{rate: r, replicas: reps, limiter: lim}]
				pick := func(f func(m measurement) float64) float64 {
					xs := make([]float64, len(ms))
					for i, m := range ms {
						xs[i] = f(m)
					}
					return stats.Median(xs)
				}
				dur := func(f func(m measurement) time.Duration) string {
					return fmtDuration(time.Duration(pick(func(m measurement) float64 { return float64(f(m)) })))
				}
				perSecond := pick(func(m measurement) float64 { return m.perSecond })
				worstPer := slices.MaxFunc(ms, func(a, b measurement) int { return cmp.Compare(a.mostPer, b.mostPer) }).mostPer
				worstTenth := slices.MaxFunc(ms, func(a, b measurement) int { return cmp.Compare(a.mostTenth, b.mostTenth) }).mostTenth
				over, totalLate := 0, 0
				for _, m := range ms {
					if m.mostPer > int(r) {
						over++
					}
					totalLate += m.late
				}
				verdict := "no"
				if over > 0 {
					verdict = fmt.Sprintf("**YES**: %d sends in one %v window, %d over the limit (%+.1f%%)",
						worstPer, o.per, worstPer-int(r), 100*float64(worstPer-int(r))/float64(r))
					if o.rounds > 1 {
						verdict += fmt.Sprintf(" (%d of %d rounds over)", over, o.rounds)
					}
				}
				lateCell := "–"
				if lim == limiterShaper {
					lateCell = strconv.Itoa(totalLate)
				}
				fmt.Fprintf(out, "| %d/%v | %d | %s | %.1f | %.1f%% | %s | %s | %s | %s | %s | %s | %s | %s |\n",
					r, o.per, reps, lim, perSecond, 100*perSecond/limitPerSecond,
					withWorst(pick(func(m measurement) float64 { return float64(m.mostPer) }), worstPer, o.rounds),
					withWorst(pick(func(m measurement) float64 { return float64(m.mostTenth) }), worstTenth, o.rounds),
					dur(func(m measurement) time.Duration { return m.gaps.P1 }),
					dur(func(m measurement) time.Duration { return m.gaps.P50 }),
					dur(func(m measurement) time.Duration { return m.gaps.P99 }),
					dur(func(m measurement) time.Duration { return m.lateP99 }),
					lateCell, verdict)
			}
		}
	}
	guard := leaky.DefaultGuardFor([]leaky.Limit{{Rate: 1, Per: o.per}})
	fmt.Fprintf(out, `
- shaper: every replica reserves slots from one shared leaky bucket in Redis (limit `+"`rate`"+` per %v, default guard %v), waits with Reservation.Wait, and skips a slot it woke up too late for (leaky.ErrLate), as Bucket.Take does. Its long-run rate is %.1f%% of the limit by design: slots are spaced for per + guard.
- naive: every replica has its own golang.org/x/time/rate limiter at the full rate (burst 1) and no coordination, as is commonly done.
- Sends are each replica's wall-clock time right after its wait returned, merged across replicas; only sends within the run's %v count. "most in any w" is the most sends in any window (t−w, t]; more than `+"`rate`"+` in one %v window breaks the limit. With perfectly even spacing a %v window holds `+"`rate`"+`/10.
- lateness is the send time minus the slot the sender waited for: Reservation.SendAt() for shaper, the time rate.Limiter's reservation was due for naive.
`, o.per, guard, 100*float64(o.per)/float64(o.per+guard), o.duration, o.per, tenth)
}

// withWorst shows a median with the worst round beside it, when there are
// several rounds and they differ.
func withWorst(med float64, worst, rounds int) string {
	s := strconv.FormatFloat(med, 'f', -1, 64)
	if rounds > 1 && float64(worst) != med {
		s += fmt.Sprintf(" (%d)", worst)
	}
	return s
}

func fmtDuration(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + fmtDuration(-d)
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", d.Microseconds())
	default:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	}
}
