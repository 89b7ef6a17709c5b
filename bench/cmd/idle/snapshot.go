package main

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shaperhq/shaper/bench/internal/fleet"
	"github.com/shaperhq/shaper/bench/internal/redisproc"
)

// ownInfoCalls is how many of take's INFO calls fall between the
// counters of two snapshots. Redis counts a command once it has run, so
// INFO never counts itself: between snapshot A's INFO stats and B's, A's
// three INFO calls (stats, commandstats, cpu) are counted; between A's
// INFO commandstats and B's, A's commandstats and cpu and B's stats.
const ownInfoCalls = 3

// snapshot is what take reads at one moment.
type snapshot struct {
	at         time.Time
	total      int64            // total_commands_processed
	calls      map[string]int64 // INFO commandstats
	redisCPU   time.Duration
	workersCPU time.Duration
	rssKB      int64 // replicas' VmRSS, summed
	busy, all  int64 // /proc/stat jiffies: busy, and all
}

// take reads Redis's counters, the replicas' CPU and memory, and the
// machine's CPU counters.
func take(srv *redisproc.Server, procs []*fleet.Proc) (snapshot, error) {
	s := snapshot{at: time.Now(), calls: map[string]int64{}}
	st, err := srv.Info("stats")
	if err != nil {
		return s, err
	}
	if s.total, err = strconv.ParseInt(st["total_commands_processed"], 10, 64); err != nil {
		return s, fmt.Errorf("INFO stats total_commands_processed: %q", st["total_commands_processed"])
	}
	cs, err := srv.Info("commandstats")
	if err != nil {
		return s, err
	}
	for k, v := range cs {
		name, ok := strings.CutPrefix(k, "cmdstat_")
		if !ok {
			continue
		}
		// calls=12,usec=34,...
		first, _, _ := strings.Cut(v, ",")
		n, ok := strings.CutPrefix(first, "calls=")
		if !ok {
			return s, fmt.Errorf("commandstats %s: %q", k, v)
		}
		if s.calls[name], err = strconv.ParseInt(n, 10, 64); err != nil {
			return s, fmt.Errorf("commandstats %s: %q", k, v)
		}
	}
	cpu, err := srv.Info("cpu")
	if err != nil {
		return s, err
	}
	for _, k := range []string{"used_cpu_user", "used_cpu_sys"} {
		sec, err := strconv.ParseFloat(cpu[k], 64)
		if err != nil {
			return s, fmt.Errorf("INFO cpu %s: %q", k, cpu[k])
		}
		s.redisCPU += time.Duration(sec * float64(time.Second))
	}
	for _, p := range procs {
		c, err := p.CPU()
		if err != nil {
			return s, fmt.Errorf("%s: %w", p.Name, err)
		}
		s.workersCPU += c
		s.rssKB += rssKB(p.Pid())
	}
	s.busy, s.all, err = machineJiffies()
	return s, err
}

// rssKB is a process's resident memory in kB, 0 if it cannot be read.
func rssKB(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n
			}
		}
	}
	return 0
}

// machineJiffies reads the first line of /proc/stat: time all CPUs spent
// busy and in all, in clock ticks.
func machineJiffies() (busy, all int64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	// cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, errors.New("unexpected /proc/stat format")
	}
	for i, v := range f[1:9] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %q", line)
		}
		all += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, all, nil
}

// fill sets the result's rates from two snapshots.
func (r *result) fill(before, after snapshot) {
	secs := after.at.Sub(before.at).Seconds()
	r.CommandsPerSec = float64(after.total-before.total-ownInfoCalls) / secs
	var total int64
	calls := map[string]int64{}
	for k, v := range after.calls {
		d := v - before.calls[k]
		if k == "info" {
			d -= ownInfoCalls
		}
		if d > 0 {
			calls[k] = d
			total += d
		}
	}
	names := make([]string, 0, len(calls))
	for k := range calls {
		names = append(names, k)
	}
	slices.SortFunc(names, func(a, b string) int {
		if calls[a] != calls[b] {
			return int(calls[b] - calls[a])
		}
		return strings.Compare(a, b)
	})
	for _, k := range names[:min(4, len(names))] {
		r.Top = append(r.Top, commandRate{Name: k, PerSec: float64(calls[k]) / secs, Percent: 100 * float64(calls[k]) / float64(total)})
	}
	r.RedisCPU = (after.redisCPU - before.redisCPU).Seconds() / secs
	r.WorkersCPU = (after.workersCPU - before.workersCPU).Seconds() / secs
	if r.Replicas > 0 {
		r.WorkerRSSMB = float64(after.rssKB) / 1024 / float64(r.Replicas)
	}
	if d := after.all - before.all; d > 0 {
		r.MachineBusy = float64(after.busy-before.busy) / float64(d)
	}
}
