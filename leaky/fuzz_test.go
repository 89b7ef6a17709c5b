package leaky

import (
	"testing"
	"time"
)

// FuzzLimit checks that Validate stands between any input and the
// arithmetic: a limit it accepts yields exact GCRA parameters whose sustained
// rate never exceeds the limit, and costs up to its capacity are accepted.
func FuzzLimit(f *testing.F) {
	f.Add(int64(100), int64(time.Second), "", int64(0), int64(10*time.Millisecond))
	f.Add(int64(800000), int64(time.Minute), "tokens", int64(0), int64(0))
	f.Add(int64(1), int64(time.Millisecond), "x", int64(1), int64(time.Hour))
	f.Add(int64(-5), int64(-1), "Tokens", int64(-1), int64(-1))
	f.Add(int64(1<<62), int64(1<<62), "", int64(1<<62), int64(0))
	f.Fuzz(func(t *testing.T, rate, per int64, cost string, burst, guard int64) {
		l := Limit{Rate: rate, Per: time.Duration(per), Cost: cost, Burst: burst}
		if err := l.Validate(); err != nil {
			return
		}
		_ = l.String()
		g := time.Duration(guard)
		if g < 0 || g > time.Hour {
			return
		}
		p := l.Params(g)
		if err := p.Validate(); err != nil {
			return
		}
		if c := l.Capacity(); c < 1 || c > l.Rate {
			t.Fatalf("%v: capacity %d outside [1, rate]", l, c)
		}
		// The spacing must fit Rate units, less the burst, into Per+guard.
		if span := (l.Rate - p.Capacity + 1) * p.Interval; span < l.Per.Microseconds()+g.Microseconds() {
			t.Fatalf("%v guard %v: %d units of %dµs span %dµs, less than per+guard", l, g, l.Rate-p.Capacity+1, p.Interval, span)
		}
		if s := l.SustainedRate(g); s > float64(l.Rate) {
			t.Fatalf("%v: sustained %f above rate", l, s)
		}
	})
}
