// Package redisstats counts what a piece of work cost Redis: calls per
// command (INFO commandstats) and the server's CPU time (INFO cpu) between
// two snapshots. Divided by the jobs done in between, the counts say how
// many round trips and which scripts one job takes, which is where a
// throughput gap between two queue systems on one Redis usually comes from.
//
// Commands run inside a Lua script are counted under their own names too,
// so a script call shows up as one evalsha plus whatever it ran; Calls of
// "evalsha" and "eval" alone say how many script round trips there were.
package redisstats

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Infoer reads one INFO section as fields (redisproc.Server does).
type Infoer interface {
	Info(section string) (map[string]string, error)
}

// Snapshot is a Redis server's counters at one moment.
type Snapshot struct {
	// Calls by command name in lower case ("evalsha", "hset").
	Calls map[string]int64
	// CPU is used_cpu_user plus used_cpu_sys of the server process.
	CPU time.Duration
}

// Take reads the counters.
func Take(s Infoer) (Snapshot, error) {
	snap := Snapshot{Calls: map[string]int64{}}
	stats, err := s.Info("commandstats")
	if err != nil {
		return snap, err
	}
	for k, v := range stats {
		name, ok := strings.CutPrefix(k, "cmdstat_")
		if !ok {
			continue
		}
		// calls=12,usec=34,usec_per_call=2.83,rejected_calls=0,failed_calls=0
		for _, part := range strings.Split(v, ",") {
			if n, ok := strings.CutPrefix(part, "calls="); ok {
				c, err := strconv.ParseInt(n, 10, 64)
				if err != nil {
					return snap, fmt.Errorf("commandstats %s: %q", k, v)
				}
				snap.Calls[name] = c
			}
		}
	}
	cpu, err := s.Info("cpu")
	if err != nil {
		return snap, err
	}
	for _, k := range []string{"used_cpu_user", "used_cpu_sys"} {
		sec, err := strconv.ParseFloat(cpu[k], 64)
		if err != nil {
			return snap, fmt.Errorf("INFO cpu %s: %q", k, cpu[k])
		}
		snap.CPU += time.Duration(sec * float64(time.Second))
	}
	return snap, nil
}

// Delta is what happened between two snapshots.
type Delta struct {
	Calls map[string]int64
	CPU   time.Duration
}

// Since is the change from before to s. The INFO calls that took the
// snapshots are left out.
func (s Snapshot) Since(before Snapshot) Delta {
	d := Delta{Calls: map[string]int64{}, CPU: s.CPU - before.CPU}
	for k, v := range s.Calls {
		if n := v - before.Calls[k]; n > 0 {
			d.Calls[k] = n
		}
	}
	d.Calls["info"] -= 2
	if d.Calls["info"] <= 0 {
		delete(d.Calls, "info")
	}
	return d
}

// Total is the number of commands, those run inside scripts included.
func (d Delta) Total() int64 {
	var n int64
	for _, v := range d.Calls {
		n += v
	}
	return n
}

// Scripts is the number of script calls (evalsha, eval and their _ro forms).
func (d Delta) Scripts() int64 {
	return d.Calls["evalsha"] + d.Calls["eval"] + d.Calls["evalsha_ro"] + d.Calls["eval_ro"]
}

// Commands are the command names that occurred, most calls first.
func (d Delta) Commands() []string {
	var names []string
	for k := range d.Calls {
		names = append(names, k)
	}
	slices.SortFunc(names, func(a, b string) int {
		if d.Calls[a] != d.Calls[b] {
			return int(d.Calls[b] - d.Calls[a])
		}
		return strings.Compare(a, b)
	})
	return names
}

// PerJob renders each command's calls divided by jobs, most frequent first,
// leaving out those under min per job: "evalsha 2.00, hset 1.00, …".
func (d Delta) PerJob(jobs int64, min float64) string {
	var parts []string
	for _, name := range d.Commands() {
		per := float64(d.Calls[name]) / float64(jobs)
		if per < min {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.2f", name, per))
	}
	return strings.Join(parts, ", ")
}
