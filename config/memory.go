package config

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/shaperhq/shaper"
)

// EstimateBody is the size of a request body, and of a kept response, the
// memory estimate assumes: say so beside every figure.
const EstimateBody = 1024

// Memory is the Redis memory an upstream's config can reach, in bytes:
// its backlog at max_pending, its finished jobs at their count bounds,
// their tombstones, and its idempotency records at the drain rate for the
// window (if every job carries an idempotency key).
type Memory struct {
	Backlog, Succeeded, Dead, Tombstones, Records int64
	// DrainPerSecond is the rate the records are counted at: the lowest
	// sustained request rate of the upstream's limits; 0 when it has none
	// (then the records are bounded only by what is sent).
	DrainPerSecond float64
}

// Total is the sum of the parts.
func (m Memory) Total() int64 { return m.Backlog + m.Succeeded + m.Dead + m.Tombstones + m.Records }

// Memory estimates what the upstream can keep in Redis with bodies and
// kept responses of EstimateBody bytes, from shaper.MemoryCosts.
func (u *Upstream) Memory() Memory {
	c := shaper.MemoryCosts()
	m := Memory{
		Backlog:    u.MaxPending * (c.QueuedJob + EstimateBody),
		Succeeded:  u.ResultMaxCount * (c.FinishedJob + EstimateBody),
		Dead:       u.DeadMaxCount * (c.FinishedJob + 2*EstimateBody),
		Tombstones: (u.ResultMaxCount + u.DeadMaxCount) * c.Tombstone,
	}
	for _, l := range u.Limits {
		if l.Cost != "" {
			continue
		}
		ll := l.Leaky()
		per := ll.SustainedRate(time.Duration(u.Guard)) / ll.Per.Seconds()
		if m.DrainPerSecond == 0 || per < m.DrainPerSecond {
			m.DrainPerSecond = per
		}
	}
	// A record lives the window and up to two spans (window/24) more
	// before its bucket is dropped.
	m.Records = int64(math.Ceil(m.DrainPerSecond * time.Duration(u.IdempotencyWindow).Seconds() * (1 + 2.0/24) * float64(c.IdempotencyRecord)))
	return m
}

func (m Memory) describe(u *Upstream) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  Redis memory it can reach (bodies and responses of %s): %s in all: backlog %s (max_pending %d), succeeded %s (result_max_count %d), dead %s (dead_max_count %d), tombstones %s",
		size(EstimateBody), size(m.Total()), size(m.Backlog), u.MaxPending, size(m.Succeeded), u.ResultMaxCount, size(m.Dead), u.DeadMaxCount, size(m.Tombstones))
	if m.DrainPerSecond > 0 {
		fmt.Fprintf(&b, ", idempotency records %s (%s/s for %v; jobs cancelled or expired unsent add theirs)", size(m.Records), num(m.DrainPerSecond), time.Duration(u.IdempotencyWindow))
	} else {
		fmt.Fprintf(&b, ", idempotency records: no request limit bounds them (%d B per job sent with a key, kept %v)", shaper.MemoryCosts().IdempotencyRecord, time.Duration(u.IdempotencyWindow))
	}
	return b.String()
}

// size formats a size in binary units.
func size(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	f, i := float64(n), 0
	for f >= unit && i < 4 {
		f /= unit
		i++
	}
	return fmt.Sprintf("%.1f %s", f, []string{"B", "KiB", "MiB", "GiB", "TiB"}[i])
}
