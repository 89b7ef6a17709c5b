package stall

import (
	"runtime"
	"testing"
	"time"
)

// TestSeesAStarvedProcess starves the monitor for 60ms with a busy loop on
// the only P the process has and expects the monitor to count most of it
// (the runtime preempts the loop every 10-20ms, so it sees several stalls).
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
	total, longest, n := m.Stop()
	if n < 1 || total < 40*time.Millisecond {
		t.Errorf("got %d stalls totalling %v (longest %v), want at least 40ms", n, total, longest)
	}
	evs := m.Events()
	if len(evs) != n {
		t.Fatalf("got %d events for %d stalls", len(evs), n)
	}
	// Each stall lies within the busy loop, give or take a sleep step
	// and the threshold.
	slop := Threshold + 2*time.Millisecond
	for _, e := range evs {
		if e.Start.Before(busy.Add(-slop)) || e.End().After(end.Add(slop)) {
			t.Errorf("stall %v+%v is outside the busy loop %v..%v", e.Start.Sub(busy), e.Dur, time.Duration(0), end.Sub(busy))
		}
	}
	if got := Overlapping(evs, 0, busy, end); len(got) != n {
		t.Errorf("Overlapping the busy loop: %d stalls, want %d", len(got), n)
	}
	if got := Overlapping(evs, 0, end.Add(time.Second), end.Add(2*time.Second)); len(got) != 0 {
		t.Errorf("Overlapping a later second: %d stalls, want none", len(got))
	}
	if got := Overlapping(evs, time.Hour, busy, end); len(got) != 0 {
		t.Errorf("stalls longer than an hour: %d, want none", len(got))
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
