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
	time.Sleep(20 * time.Millisecond)
	total, longest, n := m.Stop()
	if n < 1 || total < 40*time.Millisecond {
		t.Errorf("got %d stalls totalling %v (longest %v), want at least 40ms", n, total, longest)
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
