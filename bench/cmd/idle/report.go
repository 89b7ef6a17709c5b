package main

import (
	"fmt"
	"io"
	"runtime"
	"strings"
)

// report prints the grid, a row per upstreams × replicas with each
// contender's commands per second and Redis CPU, then every measurement's
// detail and the notes that qualify a figure.
func report(out io.Writer, o options, results []result) {
	byKey := map[string]result{}
	for _, r := range results {
		byKey[fmt.Sprintf("%s/%d/%d", r.Contender, r.Upstreams, r.Replicas)] = r
	}
	fmt.Fprintf(out, "### Idle Redis load: nothing queued, %v settling, then a window of %v (shaper) or %v (asynq)\n\n", o.settle, o.shaperWin, o.window)
	fmt.Fprintf(out, "Redis commands per second (total_commands_processed, the benchmark's own INFO calls left out) and Redis CPU (share of one core). shaper is R `shaper work` replicas plus one `shaper serve`. † marks a figure taken with Redis (one core) or Redis and the replicas together (all cores) saturated, so demand was higher than what was served; * one taken while the shared machine was busy with other work too (pollers may have been held back); § one whose servers each sent under 75%% of what the same contender's servers sent in its smallest cell, so they could not poll at their interval and the demand is higher (notes below); ‡ one taken before everything was ready (asynq: every server registered; shaper: every replica subscribed and every upstream asleep).\n\n")
	head := "| upstreams | replicas |"
	rule := "| ---: | ---: |"
	for _, c := range o.contenders {
		head += fmt.Sprintf(" %s commands/s | %s Redis CPU |", c, c)
		rule += " ---: | ---: |"
	}
	fmt.Fprintln(out, head)
	fmt.Fprintln(out, rule)
	for _, n := range o.upstreams {
		for _, rp := range o.replicas {
			row := fmt.Sprintf("| %s | %d |", thousands(float64(n)), rp)
			for _, c := range o.contenders {
				r, ok := byKey[fmt.Sprintf("%s/%d/%d", c, n, rp)]
				if !ok {
					row += " — | — |"
					continue
				}
				row += fmt.Sprintf(" %s%s | %.0f%% |", rate(r.CommandsPerSec), marks(r), 100*r.RedisCPU)
			}
			fmt.Fprintln(out, row)
		}
	}
	fmt.Fprintln(out)
	fmt.Fprintf(out, "| contender | upstreams × replicas | ready | start | commands/s | per upstream per replica per s | Redis CPU | replicas' CPU | serve CPU | RSS per replica | machine busy | stop after SIGTERM | top commands/s |\n")
	fmt.Fprintf(out, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for _, r := range results {
		var top []string
		for _, t := range r.Top {
			top = append(top, fmt.Sprintf("%s %s", t.Name, rate(t.PerSec)))
		}
		per := "–"
		if cells := r.Upstreams * r.Replicas; cells > 0 {
			per = fmt.Sprintf("%.2f", r.CommandsPerSec/float64(cells))
		}
		serve := "–"
		if r.Contender == shaperWork {
			serve = fmt.Sprintf("%.1f%%", 100*r.ServeCPU)
		}
		stop := fmt.Sprintf("%.2f s", r.StopMax.Seconds())
		if r.Killed > 0 {
			stop = fmt.Sprintf("**%d killed** after %.0f s", r.Killed, stopGrace.Seconds())
		}
		fmt.Fprintf(out, "| %s | %d × %d | %d / %d | %.1f s | %s%s | %s | %.1f%% | %.1f%% | %s | %.0f MB | %.0f%% | %s | %s |\n",
			r.Contender, r.Upstreams, r.Replicas, r.Servers, r.Expected, r.StartTime.Seconds(),
			rate(r.CommandsPerSec), marks(r), per, 100*r.RedisCPU, 100*r.WorkersCPU, serve, r.WorkerRSSMB,
			100*r.MachineBusy, stop, strings.Join(top, ", "))
	}
	fmt.Fprintln(out)
	for _, r := range results {
		if len(r.Notes) > 0 {
			fmt.Fprintf(out, "- %s %d × %d: %s.\n", r.Contender, r.Upstreams, r.Replicas, strings.Join(r.Notes, "; "))
		}
	}
	fmt.Fprintln(out)
}

// marks flags a figure that may not be faithful.
func marks(r result) string {
	m := ""
	if r.RedisCPU >= redisSaturated || (r.RedisCPU+r.WorkersCPU)/float64(runtime.NumCPU()) >= fleetSaturated {
		m += "†"
	} else if r.MachineBusy >= machineSaturated {
		m += "*"
	}
	if r.HeldBack {
		m += "§"
	}
	if r.Servers < r.Expected {
		m += "‡"
	}
	return m
}

// rate renders a rate per second: with one decimal below 100 (an idle
// shaper fleet sends a few commands a second), else as thousands.
func rate(x float64) string {
	if x < 100 {
		return fmt.Sprintf("%.1f", x)
	}
	return thousands(x)
}

// thousands renders x rounded, with commas: 61608 → "61,608".
func thousands(x float64) string {
	s := fmt.Sprintf("%.0f", x)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
