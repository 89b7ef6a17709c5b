package stall

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// TestSeesAStarvedProcess starves the monitor for 60ms with a busy loop on
// the only P the process has and expects the monitor to count most of it
// (the runtime preempts the loop every 10-20ms, so it sees several stalls).
// The host may stall the process on its own before or after the loop (a
// loaded CI machine does): only what falls within the loop is counted.
func TestSeesAStarvedProcess(t *testing.T) {
	prev := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(prev)
	m := Start()
	time.Sleep(20 * time.Millisecond)
	busy := time.Now()
	for time.Since(busy) < 60*time.Millisecond {
	}
	end := time.Now()
	time.Sleep(20 * time.Millisecond)
	_, _, n := m.Stop()
	evs := m.Events()
	if len(evs) != n {
		t.Fatalf("got %d events for %d stalls", len(evs), n)
	}
	// The stalls add up to most of the loop within it. (What overlaps it
	// is clipped to it: a stall of the host's own just before or after
	// the loop may run into one of the loop's.)
	var in time.Duration
	for _, e := range Overlapping(evs, 0, busy, end) {
		from, to := e.Start, e.End()
		if from.Before(busy) {
			from = busy
		}
		if to.After(end) {
			to = end
		}
		in += to.Sub(from)
	}
	if in < 40*time.Millisecond {
		t.Errorf("stalls cover %v of the 60ms busy loop, want at least 40ms (all stalls: %v)", in, evs)
	}
	if got := Overlapping(evs, time.Hour, busy, end); len(got) != 0 {
		t.Errorf("stalls longer than an hour: %d, want none", len(got))
	}
}

// TestOverlapping picks stalls by span and length from fixed events.
func TestOverlapping(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	evs := []Event{
		{Start: t0, Dur: ms(10)},             // 0..10
		{Start: t0.Add(ms(20)), Dur: ms(6)},  // 20..26
		{Start: t0.Add(ms(40)), Dur: ms(30)}, // 40..70
	}
	for _, c := range []struct {
		min      time.Duration
		from, to int
		want     []int
	}{
		{0, -5, -1, nil},
		{0, -5, 0, []int{0}},  // touching the start counts
		{0, 10, 15, []int{0}}, // touching the end counts
		{0, 11, 19, nil},      // between stalls
		{0, 5, 45, []int{0, 1, 2}},
		{ms(8), 5, 45, []int{0, 2}}, // longer than 8ms only
		{ms(30), 0, 100, nil},       // longer than, not as long as
		{0, 71, 1000, nil},
	} {
		got := Overlapping(evs, c.min, t0.Add(ms(c.from)), t0.Add(ms(c.to)))
		var idx []int
		for _, g := range got {
			for i, e := range evs {
				if e == g {
					idx = append(idx, i)
				}
			}
		}
		if fmt.Sprint(idx) != fmt.Sprint(c.want) {
			t.Errorf("Overlapping(min %v, %dms..%dms) = stalls %v, want %v", c.min, c.from, c.to, idx, c.want)
		}
	}
}

// TestQuietIsQuiet: sleeping alone is not a stall.
func TestQuietIsQuiet(t *testing.T) {
	m := Start()
	time.Sleep(50 * time.Millisecond)
	if total, _, _ := m.Stop(); total > 20*time.Millisecond {
		t.Errorf("got %v of stalls on a quiet sleep, want almost none", total)
	}
}
