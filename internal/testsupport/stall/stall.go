// Package stall measures how long this machine stopped running a process
// that only wanted to wake every millisecond: virtual machines on a shared
// host are sometimes descheduled for tens of milliseconds, and no replica
// can send while that lasts. Throughput tests use it to tell "shaper left
// slots unused" apart from "nothing on this machine ran".
package stall

import (
	"sync"
	"time"
)

// Monitor sleeps in 1ms steps on its own goroutine and adds up every
// overshoot beyond Threshold.
type Monitor struct {
	threshold time.Duration
	stop      chan struct{}
	done      chan struct{}

	mu      sync.Mutex
	stalled time.Duration
	longest time.Duration
	count   int
	events  []Event
	wakes   int // sleeps measured
	late    int // of them, overshot by more than LateWake
}

// Event is one stall: the span in which the monitor's 1ms sleep overshot
// by more than Threshold.
type Event struct {
	Start time.Time
	Dur   time.Duration
}

// End is when the stall ended.
func (e Event) End() time.Time { return e.Start.Add(e.Dur) }

// Threshold is the overshoot of a 1ms sleep that counts as a stall: well
// above the timer slack of an idle Linux host (tens of µs to ~1ms).
const Threshold = 5 * time.Millisecond

// LateWake is the overshoot of a 1ms sleep that counts as a late wake-up:
// shorter than a stall, but as long as the slack a strictly spaced send
// has (a few hundred µs to a millisecond). A host where many wakes are late
// is starving its processes between stalls.
const LateWake = time.Millisecond

// LateShare is the share of the monitor's wakes so far that were late by
// more than LateWake, 0..1.
func (m *Monitor) LateShare() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.wakes == 0 {
		return 0
	}
	return float64(m.late) / float64(m.wakes)
}

// Start begins measuring. Call Stop to end it.
func Start() *Monitor {
	m := &Monitor{threshold: Threshold, stop: make(chan struct{}), done: make(chan struct{})}
	go m.run()
	return m
}

func (m *Monitor) run() {
	defer close(m.done)
	const step = time.Millisecond
	last := time.Now()
	for {
		select {
		case <-m.stop:
			return
		default:
		}
		time.Sleep(step)
		now := time.Now()
		over := now.Sub(last) - step
		m.mu.Lock()
		m.wakes++
		if over > LateWake {
			m.late++
		}
		m.mu.Unlock()
		if over > m.threshold {
			m.mu.Lock()
			m.stalled += over
			m.longest = max(m.longest, over)
			m.count++
			m.events = append(m.events, Event{Start: now.Add(-over), Dur: over})
			m.mu.Unlock()
		}
		last = now
	}
}

// Stop ends measuring and returns the total time lost to stalls, the
// longest one and how many there were.
func (m *Monitor) Stop() (total, longest time.Duration, count int) {
	close(m.stop)
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stalled, m.longest, m.count
}

// Events are the stalls seen so far, oldest first.
func (m *Monitor) Events() []Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Event(nil), m.events...)
}

// Overlapping are the stalls longer than min that overlap [from, to].
func Overlapping(events []Event, min time.Duration, from, to time.Time) []Event {
	var out []Event
	for _, e := range events {
		if e.Dur > min && !e.End().Before(from) && !e.Start.After(to) {
			out = append(out, e)
		}
	}
	return out
}
