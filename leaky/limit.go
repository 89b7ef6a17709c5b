package leaky

import (
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/shaperhq/shaper/internal/gcra"
)

// Limit is one rate an upstream imposes: at most Rate units in any window of
// length Per. A unit is one request, or one of a named cost such as "tokens"
// when Cost is set. Limits are values; build them with PerSecond, PerMinute
// or a literal, and check them with Validate.
type Limit struct {
	// Rate is the most units allowed in any window of length Per.
	Rate int64
	// Per is the window. At least a millisecond.
	Per time.Duration
	// Cost names the job cost this limit counts ("tokens"). Empty counts
	// each reservation as one request.
	Cost string
	// Burst is the most units that may be sent at the same instant. 0 or 1
	// spaces sends strictly evenly. For a cost limit, 0 means 25% of Rate
	// (at least 1), which is also the largest cost one reservation may
	// carry: a job of 50 tokens must fit a limit of 600 tokens per second.
	// A larger burst still never lets more than Rate units into any window
	// of length Per; it lowers the sustained rate instead (see Params):
	// with burst C, jobs that use all they reserve drain at
	// (Rate−C+1)/Rate × Per/(Per+guard) of Rate, about 74% for the default
	// on a per-second limit. Settling a job's cost to what it really used
	// (Bucket.Settle) gives the unused part back, which is where that
	// headroom usually goes.
	Burst int64
	// Adaptive makes Rate a ceiling rather than a known limit: the fleet
	// lowers the rate it paces at when the upstream pushes back and probes
	// back up while it does not (see Bucket.Feedback). The current rate is
	// kept in Redis, so every replica paces at the same one.
	Adaptive bool
}

// PerSecond is a limit of n requests per second with strictly even spacing.
func PerSecond(n int64) Limit { return Limit{Rate: n, Per: time.Second} }

// PerMinute is a limit of n requests per minute with strictly even spacing.
func PerMinute(n int64) Limit { return Limit{Rate: n, Per: time.Minute} }

// costName is what Cost may be: a short lowercase identifier.
var costName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)

// Unit is what the limit counts: "requests" or the cost's name.
func (l Limit) Unit() string {
	if l.Cost == "" {
		return "requests"
	}
	return l.Cost
}

// String renders a limit as in config: "100 requests per 1s",
// "800000 tokens per 1m0s (burst 8000)".
func (l Limit) String() string {
	s := fmt.Sprintf("%d %s per %v", l.Rate, l.Unit(), l.Per)
	if c := l.Capacity(); c > 1 {
		s += fmt.Sprintf(" (burst %d)", c)
	}
	return s
}

// Capacity is the most units the limit lets through at one instant, which is
// also the largest cost a single reservation may carry.
func (l Limit) Capacity() int64 {
	switch {
	case l.Burst > 1:
		return l.Burst
	case l.Burst == 0 && l.Cost != "":
		return max(1, l.Rate/4)
	}
	return 1
}

// Validate explains the first thing wrong with the limit, if anything.
func (l Limit) Validate() error {
	switch {
	case l.Rate < 1:
		return fmt.Errorf("rate %d: must be at least 1", l.Rate)
	case l.Per < time.Millisecond:
		return fmt.Errorf("per %v: must be at least 1ms", l.Per)
	case l.Per > 366*24*time.Hour:
		return fmt.Errorf("per %v: must be at most a year", l.Per)
	case l.Burst < 0:
		return fmt.Errorf("burst %d: must not be negative", l.Burst)
	case l.Burst > l.Rate:
		return fmt.Errorf("burst %d: must not exceed rate %d", l.Burst, l.Rate)
	case l.Cost != "" && !costName.MatchString(l.Cost):
		return fmt.Errorf("cost %q: must be a lowercase name of letters, digits and _", l.Cost)
	case l.Cost == "requests":
		return errors.New(`cost "requests": leave cost empty to count requests`)
	}
	if l.Per.Microseconds() < l.Rate {
		return fmt.Errorf("rate %d per %v: more than one per microsecond", l.Rate, l.Per)
	}
	return nil
}

// Params is the GCRA shape that enforces the limit with the given guard.
//
// The guard is time a send may slip after its slot (timer overshoot,
// scheduling, the trip to the upstream). Slots are spaced so that even if
// the first send of a run is late by the whole guard and a later one is on
// time, no window of length Per holds more than Rate units:
//
//	interval = ⌈(Per + guard) / (Rate − Capacity + 1)⌉
//
// With capacity C the bucket lets C units out at once, and any window of
// length W then holds fewer than C + W/interval units; the formula makes
// that at most Rate for W = Per + guard. The sustained rate is therefore
// (Rate−C+1)/Rate × Per/(Per+guard) of Rate: 98% for the default 20ms guard
// on a per-second limit with even spacing.
//
// With capacity 1 consecutive slots are Per/Rate plus a slack of
// guard/Rate apart (200µs at 100 per second, 400µs at 50). That slack is
// all an upstream that meters each gap has to spare (nginx's limit_req
// without burst refuses a request arriving less than Per/Rate after the
// last one, in whole milliseconds): a send late by more than the slack,
// followed by one on time, is refused. So where the slack is at least
// 200µs (at most 100 per Per at the default guard) Wait wakes precisely,
// watching the clock for the last 1.5ms rather than trusting a timer (see
// Reservation.Wait). The jitter of the wake-up and of the trip to the
// upstream (the client's write, the network, the upstream's own
// scheduling) still comes out of the same slack, and more of it than the
// slack is refused by such a meter. The
// slack is kept small on purpose: every 10ms of guard costs window
// upstreams 1% of a per-second rate, so widening it for meters would cost
// every upstream. Against a meter that sees more jitter, raise the guard
// (guard 100ms leaves 1ms at 100 per second, for 91% of the rate) or ask
// for a burst.
func (l Limit) Params(guard time.Duration) gcra.Params {
	c := l.Capacity()
	span := l.Per.Microseconds() + guard.Microseconds()
	return gcra.Params{Interval: gcra.CeilDiv(span, l.Rate-c+1), Capacity: c}
}

// SustainedRate is the long-run rate the limit allows with the guard, in
// units per Per: what a full backlog drains at.
func (l Limit) SustainedRate(guard time.Duration) float64 {
	p := l.Params(guard)
	return float64(l.Per.Microseconds()) / float64(p.Interval)
}
