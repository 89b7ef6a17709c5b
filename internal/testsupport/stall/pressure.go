package stall

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"time"
)

// Pressure is how much of a span runnable work on this machine waited for
// a CPU, as Linux's pressure stall information counts it
// (/proc/pressure/cpu, "some": the share of wall time in which at least
// one runnable task was waiting), and how much of the machine's CPU time
// the hypervisor gave to others (steal, /proc/stat). Stalls the Monitor
// sees are the machine stopping as a whole; pressure is processes starved
// between them, which the Monitor's 1ms sleeper does not notice.
type Pressure struct {
	// Some is the share of the span with a runnable task waiting, 0..1;
	// -1 if the kernel does not report it.
	Some float64
	// Steal is the share of the CPUs' time stolen by the hypervisor, 0..1;
	// -1 if unknown.
	Steal float64
}

// PressureMark is a reading to measure a span from.
type PressureMark struct {
	at    time.Time
	some  int64 // µs, -1 unknown
	steal int64 // ticks, -1 unknown
	ticks int64 // all CPU ticks, for the steal share
}

// MarkPressure reads the counters now.
func MarkPressure() PressureMark {
	m := PressureMark{at: time.Now(), some: -1, steal: -1}
	if b, err := os.ReadFile("/proc/pressure/cpu"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if !strings.HasPrefix(line, "some ") {
				continue
			}
			for _, f := range strings.Fields(line) {
				if v, ok := strings.CutPrefix(f, "total="); ok {
					if n, err := strconv.ParseInt(v, 10, 64); err == nil {
						m.some = n
					}
				}
			}
		}
	}
	if f, err := os.Open("/proc/stat"); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		if sc.Scan() {
			fs := strings.Fields(sc.Text())
			// cpu user nice system idle iowait irq softirq steal ...
			if len(fs) > 8 && fs[0] == "cpu" {
				var all int64
				for _, v := range fs[1:] {
					n, _ := strconv.ParseInt(v, 10, 64)
					all += n
				}
				if st, err := strconv.ParseInt(fs[8], 10, 64); err == nil {
					m.steal, m.ticks = st, all
				}
			}
		}
	}
	return m
}

// Since is the pressure over the span from m to now.
func (m PressureMark) Since() Pressure {
	now := MarkPressure()
	p := Pressure{Some: -1, Steal: -1}
	if wall := now.at.Sub(m.at).Microseconds(); wall > 0 && m.some >= 0 && now.some >= m.some {
		p.Some = min(1, float64(now.some-m.some)/float64(wall))
	}
	if m.steal >= 0 && now.steal >= m.steal && now.ticks > m.ticks {
		p.Steal = float64(now.steal-m.steal) / float64(now.ticks-m.ticks)
	}
	return p
}

// String is "cpu pressure P%, steal S%", with n/a for what the kernel
// does not report.
func (p Pressure) String() string {
	pct := func(v float64) string {
		if v < 0 {
			return "n/a"
		}
		return strconv.FormatFloat(100*v, 'f', 1, 64) + "%"
	}
	return "cpu pressure " + pct(p.Some) + ", steal " + pct(p.Steal)
}
