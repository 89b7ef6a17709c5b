package main

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/shaperhq/shaper/bench/internal/sched"
	"github.com/shaperhq/shaper/fakeupstream"
)

// The fake upstream runs in this process and stamps an arrival when its
// handler runs, so a stall of this process (on a shared machine, say)
// bunches requests that shaper sent evenly, and a strict upstream may then
// refuse one. Each 429 is reported with what the upstream saw in the
// second before it and the longest this process's goroutines waited to
// run around it, so that the reader can tell shaper sending early from
// the measuring process standing still. The verdict counts every 429
// regardless.

// refusal is one 429, at a time since the producer started.
type refusal struct {
	At time.Duration
	// InSecond counts the arrivals in the second up to and including it,
	// Admitted those of them admitted.
	InSecond, Admitted int
	// Stall is the longest scheduling wait of this process within a second
	// of it; zero when none reached minStall.
	Stall time.Duration
}

// minStall is the shortest wait worth keeping: under half the default
// 20ms guard, a stall cannot push a paced send into the next window.
const minStall = 5 * time.Millisecond

// stalls samples this process's worst scheduling wait every second.
type stalls struct {
	mu   sync.Mutex
	seen []stallAt
}

type stallAt struct {
	At, Worst time.Duration
}

func (s *stalls) run(stop <-chan struct{}, t0 time.Time) {
	prev := sched.Read()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		now := sched.Read()
		if w := now.WorstSince(prev); w >= minStall {
			s.mu.Lock()
			s.seen = append(s.seen, stallAt{At: time.Since(t0), Worst: w})
			s.mu.Unlock()
		}
		prev = now
	}
}

// near is the longest stall sampled within span of at.
func (s *stalls) near(at, span time.Duration) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var worst time.Duration
	for _, x := range s.seen {
		if (x.At - at).Abs() <= span {
			worst = max(worst, x.Worst)
		}
	}
	return worst
}

// refusalsIn finds the 429s among recs with a Seq above after, their
// times taken as since the producer started (offset is how long after the
// fake started that was), and returns them with the highest Seq seen.
func refusalsIn(recs []fakeupstream.Record, after int64, offset time.Duration) (found []refusal, last int64) {
	last = after
	for i, r := range recs {
		if int64(r.Seq) <= after || r.Status != http.StatusTooManyRequests {
			continue
		}
		last = max(last, int64(r.Seq))
		f := refusal{At: r.At - offset}
		// recs are in arrival order: count back over the second before.
		for j := i; j >= 0 && recs[j].At > r.At-time.Second; j-- {
			f.InSecond++
			if recs[j].Admitted {
				f.Admitted++
			}
		}
		found = append(found, f)
	}
	return found, last
}

func describeRefusals(rs []refusal, limit int) string {
	var parts []string
	for i, r := range rs {
		if i == 10 {
			parts = append(parts, fmt.Sprintf("and %d more", len(rs)-10))
			break
		}
		stall := "no stall of this process over 5ms within 1s"
		if r.Stall > 0 {
			stall = fmt.Sprintf("this process stalled up to %v within 1s", r.Stall)
		}
		parts = append(parts, fmt.Sprintf("at %v: %d arrivals in the second up to it, %d admitted (limit %d); %s",
			r.At.Round(time.Millisecond), r.InSecond, r.Admitted, limit, stall))
	}
	return strings.Join(parts, "; ")
}
