package window

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// randomLimit favours small rates, where denials are common, but also
// draws huge ones, whose sliding-window products pass 2^53. Per stays long
// enough that Redis, expiring keys on its own clock, cannot drop state the
// model still holds while the test runs.
func randomLimit(rng *rand.Rand, kind string) Limit {
	var rate int64
	switch r := rng.IntN(10); {
	case r < 3:
		rate = 1 + rng.Int64N(3)
	case r < 7:
		rate = 1 + rng.Int64N(20)
	case r < 9 || kind == "sl":
		rate = 1 + rng.Int64N(2_000)
	default:
		rate = maxRate - rng.Int64N(1_000)
	}
	var per time.Duration
	switch rng.IntN(3) {
	case 0:
		per = time.Minute
	case 1:
		per = 30*time.Second + time.Duration(rng.Int64N(int64(time.Hour)))
	default:
		per = maxPer - time.Duration(rng.Int64N(int64(24*time.Hour)))
	}
	return Limit{Rate: rate, Per: per.Truncate(time.Microsecond)}
}

// randomCost is mostly 1, sometimes anything up to rate, sometimes rate.
func randomCost(rng *rand.Rand, rate int64) int64 {
	switch r := rng.IntN(10); {
	case r < 6:
		return 1
	case r < 9:
		return 1 + rng.Int64N(min(rate, 50))
	case r < 10 && rate <= 2_000:
		return rate
	}
	return 1 + rng.Int64N(rate)
}

// randomStep moves the clock: not at all, by a hair, by up to a window,
// exactly onto or beside the next window boundary, far ahead, or now and
// then backwards, as Redis's clock may step.
func randomStep(rng *rand.Rand, now, per, rate int64) int64 {
	switch r := rng.IntN(20); {
	case r < 3:
		return 0
	case r < 5:
		return 1 + rng.Int64N(3)
	case r < 10:
		return rng.Int64N(per/rate + 1)
	case r < 14:
		return rng.Int64N(per)
	case r < 17:
		return windowStart(now, per) + per - now + rng.Int64N(3) - 1
	case r < 19:
		return per + rng.Int64N(2*per)
	}
	return -rng.Int64N(per / 4)
}

// The scripts and the pure-Go models agree on every field of every
// decision, over random limits, keys, costs and clock movements.
func TestScriptsMatchModels(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	rdb := srv.Client(t)
	keys := []string{"alice", "bob", "carol"}
	for _, a := range algorithms() {
		t.Run(a.name, func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			rng := rand.New(rand.NewPCG(seed, 2))
			for round := range 12 {
				l := randomLimit(rng, a.kind)
				per := l.per()
				clk := &clock{now: testNow + rng.Int64N(per)}
				lim, err := a.new(rdb, l, Config{Prefix: uniquePrefix(fmt.Sprintf("prop-%s-%d", a.kind, round)), Now: clk.Now})
				if err != nil {
					t.Fatal(err)
				}
				m := a.model(l)
				allowed, denied := 0, 0
				for op := range 150 {
					clk.now += randomStep(rng, clk.now, per, min(l.Rate, per))
					key := keys[rng.IntN(len(keys))]
					n := randomCost(rng, l.Rate)
					got, err := lim.Allow(ctx, key, n)
					if err != nil {
						t.Fatal(err)
					}
					want := result(m.allow(key, clk.now, n), l.Rate)
					if got != want {
						t.Fatalf("seed %d round %d op %d: %v, key %s, cost %d at %dµs: got %v, want %v",
							seed, round, op, l, key, n, clk.now, got, want)
					}
					if got.Allowed {
						allowed++
					} else {
						denied++
					}
				}
				if allowed == 0 || (denied == 0 && l.Rate < 1_000) {
					t.Logf("seed %d round %d: %v: only %d allowed and %d denied", seed, round, l, allowed, denied)
				}
			}
		})
	}
}

// modelProbe is a model's decision at now without keeping its effect.
type modelProbe func(now, n int64) decision

// The models' own promises, checked on random monotonic histories: a
// denial's RetryAfter is the earliest instant the same cost is admitted if
// nothing else arrives, and ResetAfter the earliest at which the whole
// allowance is back. Denials change nothing, and Remaining is what one more
// request could take right now.
func TestModelsKeepTheirPromises(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 3))
	for _, a := range algorithms() {
		for round := range 200 {
			l := randomLimit(rng, a.kind)
			per, rate := l.per(), l.Rate
			now := testNow + rng.Int64N(per)
			var cs counterState
			var log []int64
			step := func(now, n int64) decision {
				var d decision
				switch a.kind {
				case "fw":
					d, cs = fixedWindowModel(cs, now, per, rate, n)
				case "sw":
					d, cs = slidingWindowModel(cs, now, per, rate, n)
				default:
					d, log = slidingLogModel(log, now, per, rate, n)
				}
				return d
			}
			var probe modelProbe = func(now, n int64) decision {
				var d decision
				switch a.kind {
				case "fw":
					d, _ = fixedWindowModel(cs, now, per, rate, n)
				case "sw":
					d, _ = slidingWindowModel(cs, now, per, rate, n)
				default:
					d, _ = slidingLogModel(log, now, per, rate, n)
				}
				return d
			}
			for op := range 60 {
				now += max(0, randomStep(rng, now, per, min(rate, per)))
				n := randomCost(rng, rate)
				before := probe(now, n)
				d := step(now, n)
				where := fmt.Sprintf("seed %d %s round %d op %d: %v cost %d at %d", seed, a.name, round, op, l, n, now)
				if d != before {
					t.Fatalf("%s: probing gave %+v, deciding %+v", where, before, d)
				}
				if d.remaining < 0 || d.remaining > rate || d.resetAfter < 0 {
					t.Fatalf("%s: got %+v, want 0 <= remaining <= rate and resetAfter >= 0", where, d)
				}
				if d.allowed {
					if d.retryAfter != 0 || d.resetAfter <= 0 {
						t.Fatalf("%s: got %+v, want retryAfter 0 and resetAfter > 0", where, d)
					}
				} else {
					if d.retryAfter <= 0 {
						t.Fatalf("%s: got %+v, want retryAfter > 0", where, d)
					}
					if again := probe(now, n); again != d {
						t.Fatalf("%s: a denial changed the state: %+v then %+v", where, d, again)
					}
					if early := probe(now+d.retryAfter-1, n); early.allowed {
						t.Fatalf("%s: got %+v, but 1µs before retryAfter already %+v", where, d, early)
					}
					if on := probe(now+d.retryAfter, n); !on.allowed {
						t.Fatalf("%s: got %+v, but at retryAfter still %+v", where, d, on)
					}
				}
				if d.remaining > 0 {
					if more := probe(now, d.remaining); !more.allowed || more.remaining != 0 {
						t.Fatalf("%s: got %+v, but taking remaining gives %+v", where, d, more)
					}
				}
				if d.remaining < rate {
					if more := probe(now, d.remaining+1); more.allowed {
						t.Fatalf("%s: got %+v, but one more than remaining gives %+v", where, d, more)
					}
				}
				if d.resetAfter > 0 {
					if full := probe(now+d.resetAfter, rate); !full.allowed {
						t.Fatalf("%s: got %+v, but at resetAfter the full rate gets %+v", where, d, full)
					}
					if early := probe(now+d.resetAfter-1, rate); early.allowed {
						t.Fatalf("%s: got %+v, but 1µs before resetAfter the full rate already gets %+v", where, d, early)
					}
				}
			}
		}
	}
}
