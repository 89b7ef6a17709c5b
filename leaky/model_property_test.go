package leaky

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/script"
)

// TestScriptsMatchModel drives Redis and the Go model with the same random
// operations and demands the same answer to every one of them.
func TestScriptsMatchModel(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	for seed := uint64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, seed*7919))
			clock := newTestClock()
			conc := 0
			if seed%2 == 0 {
				conc = 1 + rng.IntN(3)
			}
			cfg := BucketConfig{
				Limits: []Limit{
					{Rate: int64(5 + rng.IntN(50)), Per: time.Second, Burst: int64(rng.IntN(4))},
					{Rate: int64(1000 + rng.IntN(5000)), Per: time.Minute, Cost: "tokens"},
				},
				Guard:       time.Duration(rng.IntN(20)) * time.Millisecond,
				Concurrency: conc,
				LeaseTTL:    time.Duration(1+rng.IntN(500)) * time.Millisecond,
			}
			b := newBucket(t, rdb, clock.Now, cfg)
			m := newModel()
			var booked []*Reservation
			for step := 0; step < 400; step++ {
				switch op := rng.IntN(10); {
				case op < 5:
					costs := Costs{"tokens": rng.Int64N(cfg.Limits[1].Capacity() + 1)}
					maxWait := []time.Duration{0, time.Millisecond, 50 * time.Millisecond, time.Second, time.Minute}[rng.IntN(5)]
					var opts []ReserveOption
					opts = append(opts, MaxWait(maxWait))
					lease := ""
					if conc > 0 {
						lease = fmt.Sprint("lease", rng.IntN(6))
						opts = append(opts, WithLease(lease))
					}
					r, err := b.Reserve(ctx, costs, opts...)
					if err != nil {
						t.Fatalf("step %d: %v", step, err)
					}
					now := clock.Last()
					want := m.reserve(now, maxWait.Microseconds(), lease, conc, cfg.LeaseTTL.Microseconds(), modelLimits(b, costs))
					if got := reply(r); !slices.Equal(normalize(got, now), normalize(want, now)) {
						t.Fatalf("step %d reserve %v wait %v: got %v, want %v", step, costs, maxWait, got, want)
					}
					if r.OK {
						booked = append(booked, r)
					}
				case op == 5 && len(booked) > 0:
					r := booked[rng.IntN(len(booked))]
					slot := r.Now.Add(r.Delay).UnixMicro()
					tats := slices.Clone(r.tats)
					got, err := b.Cancel(ctx, r)
					if err != nil {
						t.Fatalf("step %d: %v", step, err)
					}
					if want := m.cancel(clock.Last(), r.Lease, slot, tatKeys(b), tats); int64(got) != want {
						t.Fatalf("step %d cancel: got %d restored, want %d", step, got, want)
					}
					booked = slices.DeleteFunc(booked, func(x *Reservation) bool { return x == r })
				case op == 9 && rng.IntN(2) == 0:
					// Several reservations in one script call, as concurrent
					// callers share one: the same as one after another at
					// the same instant.
					k := 2 + rng.IntN(4)
					var calls []*script.Call[reserveReq, reserveRes]
					for c := 0; c < k; c++ {
						req := reserveReq{set: b.cur(), maxWait: []int64{0, 50_000, 1_000_000}[rng.IntN(3)], costs: []int64{1, rng.Int64N(cfg.Limits[1].Capacity() + 1)}}
						if conc > 0 {
							req.lease = fmt.Sprint("lease", rng.IntN(6))
						}
						calls = append(calls, &script.Call[reserveReq, reserveRes]{Req: req})
					}
					b.runReserve(ctx, calls)
					now := clock.Last()
					for c, call := range calls {
						if call.Err != nil {
							t.Fatalf("step %d batch call %d: %v", step, c, call.Err)
						}
						ls := modelLimits(b, Costs{"tokens": call.Req.costs[1]})
						want := m.reserve(now, call.Req.maxWait, call.Req.lease, conc, cfg.LeaseTTL.Microseconds(), ls)
						if !slices.Equal(normalize(call.Res.out, now), normalize(want, now)) {
							t.Fatalf("step %d batch call %d: got %v, want %v", step, c, call.Res.out, want)
						}
					}
				case op == 6:
					d := time.Duration(1+rng.IntN(300)) * time.Millisecond
					until, err := b.Block(ctx, d, "test")
					if err != nil {
						t.Fatalf("step %d: %v", step, err)
					}
					if want := m.block(clock.Last(), d.Microseconds(), "test"); until.UnixMicro() != want {
						t.Fatalf("step %d block %v: got until %d, want %d", step, d, until.UnixMicro(), want)
					}
				case op == 7 && rng.IntN(4) == 0:
					if err := b.Unblock(ctx); err != nil {
						t.Fatal(err)
					}
					m.blockUntil = 0
				case op == 8 && conc > 0:
					lease := fmt.Sprint("lease", rng.IntN(6))
					if err := b.ReleaseLease(ctx, lease); err != nil {
						t.Fatal(err)
					}
					delete(m.leases, lease)
				default:
					clock.Advance([]time.Duration{time.Microsecond, time.Millisecond, 30 * time.Millisecond, 400 * time.Millisecond, 3 * time.Second}[rng.IntN(5)])
				}
				assertTTLs(t, rdb, b)
			}
		})
	}
}

func modelLimits(b *Bucket, costs Costs) []modelLimit {
	var out []modelLimit
	for i, l := range b.cfg.Limits {
		c, _ := b.cost(l, costs)
		out = append(out, modelLimit{key: b.cur().keys[2+i], params: b.cur().params[i], cost: c})
	}
	return out
}

func tatKeys(b *Bucket) []string { return b.cur().keys[2:] }

// reply rebuilds the script's raw reply from a Reservation.
func reply(r *Reservation) []int64 {
	wait := r.RetryAfter
	if r.OK {
		wait = r.Delay
	}
	var ok, limit int64
	if r.OK {
		ok = 1
	}
	if r.Limit != nil {
		for i, l := range r.bucket.cfg.Limits {
			if l == *r.Limit {
				limit = int64(i + 1)
			}
		}
	}
	out := []int64{ok, wait.Microseconds(), int64(r.Reason), limit, r.Now.UnixMicro()}
	return append(out, r.tats...)
}

// normalize zeroes "before" TATs that are not in the future: Redis may have
// expired such a key or kept it, and either way it decides like no key.
func normalize(reply []int64, now int64) []int64 {
	out := slices.Clone(reply)
	for i := 5; i < len(out); i += 2 {
		if out[i] <= now {
			out[i] = 0
		}
	}
	return out
}

// assertTTLs checks that every key the bucket has written expires, and no
// later than its contents can matter plus the limit's window.
func assertTTLs(t *testing.T, rdb *redis.Client, b *Bucket) {
	t.Helper()
	ctx := context.Background()
	longest := b.cfg.MaxWait
	for _, l := range b.cfg.Limits {
		longest = max(longest, l.Per)
	}
	for _, k := range b.cur().keys {
		ttl, err := rdb.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case ttl == -2: // absent
		case ttl < 0:
			t.Fatalf("key %s has no TTL (PTTL %v)", k, ttl)
		case ttl > 10*time.Minute+b.cfg.LeaseTTL+longest:
			t.Fatalf("key %s has TTL %v, longer than anything it holds", k, ttl)
		}
	}
}
