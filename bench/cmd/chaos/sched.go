package main

import "time"

// The fake upstream runs in this process and stamps an arrival only when
// its handler runs, so a stall of this process bunches arrivals that were
// sent evenly. The run samples, every second, the longest any goroutine
// waited to run, so that a window over the limit can be told apart from
// senders that were early.

// stall is the longest scheduling wait in the second before At.
type stall struct {
	At    time.Duration `json:"at_ns"`
	Worst time.Duration `json:"worst_ns"`
}

// minStall is the shortest wait worth keeping: under half the default
// 20ms guard, a stall cannot push a paced send into the next window.
const minStall = 5 * time.Millisecond

// worstNear is the longest stall sampled within span of at.
func worstNear(stalls []stall, at, span time.Duration) time.Duration {
	var worst time.Duration
	for _, s := range stalls {
		if (s.At - at).Abs() <= span {
			worst = max(worst, s.Worst)
		}
	}
	return worst
}
