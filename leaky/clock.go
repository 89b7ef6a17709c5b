package leaky

import (
	"sync"
	"time"
)

// offsetWindow bounds which round trips inform the clock offset: recent
// enough that the two clocks cannot have drifted apart meaningfully, many
// enough that one of them was probably quick.
const (
	offsetSamples = 32
	offsetMaxAge  = 2 * time.Second
)

// offsetEstimator relates Redis's clock to this process's monotonic clock.
//
// A script reads Redis's clock at some instant between the moment the call
// was issued and the moment its reply arrived. So for each round trip the
// offset θ = redis − local lies in [redisNow − received, redisNow − issued].
// Intersecting recent round trips gives bounds as tight as the quickest one.
// Waiting until slot − lo can never send early, and judging lateness from
// slot − hi can never call a late send punctual, whatever the clocks' skew
// and however long the request queued in Redis.
type offsetEstimator struct {
	epoch time.Time // local monotonic origin

	mu      sync.Mutex
	samples [offsetSamples]offsetSample
	n, next int
}

type offsetSample struct {
	at     time.Duration // local receive time since epoch
	lo, hi int64         // bounds on θ in µs
}

func newOffsetEstimator() *offsetEstimator {
	return &offsetEstimator{epoch: time.Now()}
}

// local is t as microseconds since the epoch on the monotonic clock.
func (e *offsetEstimator) local(t time.Time) int64 { return t.Sub(e.epoch).Microseconds() }

// toLocal turns a local microsecond count back into a time.
func (e *offsetEstimator) toLocal(us int64) time.Time {
	return e.epoch.Add(time.Duration(us) * time.Microsecond)
}

// observe records a round trip and returns the current bounds on θ.
func (e *offsetEstimator) observe(issued, received time.Time, redisNow int64) (lo, hi int64) {
	s := offsetSample{
		at: received.Sub(e.epoch),
		lo: redisNow - e.local(received),
		hi: redisNow - e.local(issued),
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.samples[e.next] = s
	e.next = (e.next + 1) % offsetSamples
	e.n = min(e.n+1, offsetSamples)
	lo, hi = s.lo, s.hi
	for i := 0; i < e.n; i++ {
		o := e.samples[i]
		if s.at-o.at > offsetMaxAge {
			continue
		}
		lo, hi = max(lo, o.lo), min(hi, o.hi)
	}
	if lo > hi {
		// The clocks jumped relative to each other: forget the past.
		e.samples[0], e.n, e.next = s, 1, 1
		return s.lo, s.hi
	}
	return lo, hi
}
