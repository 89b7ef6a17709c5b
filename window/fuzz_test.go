package window

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
)

// Limits and arguments, whatever they are, never panic: invalid limits are
// refused by Validate and every constructor, invalid arguments by Allow
// with shaper.ErrInvalid, and valid ones get a decision from Redis whose
// key expires within the limit's TTL.
func FuzzLimitAndArguments(f *testing.F) {
	f.Add(int64(10), int64(time.Second), int64(1), "user-1")
	f.Add(int64(1), int64(time.Millisecond), int64(1), "k")
	f.Add(int64(0), int64(time.Second), int64(1), "k")
	f.Add(int64(-1), int64(-1), int64(-1), "")
	f.Add(int64(5), int64(999*time.Microsecond), int64(5), "k")
	f.Add(int64(5), int64(time.Second+1), int64(5), "k")
	f.Add(maxRate, int64(maxPer), maxRate, "huge")
	f.Add(maxRate+1, int64(maxPer)+1, int64(1), "k")
	f.Add(int64(maxLogRate+1), int64(time.Minute), int64(2), "k")
	f.Add(int64(3), int64(time.Minute), int64(4), "k")
	f.Add(int64(3), int64(time.Minute), int64(0), "k")
	f.Add(int64(3), int64(time.Minute), int64(1), "a{b}")
	f.Add(int64(3), int64(time.Minute), int64(1), strings.Repeat("x", maxKeyLen+1))
	f.Add(int64(1<<62), int64(1<<62), int64(1<<62), "\x00\xff")

	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	f.Cleanup(func() { rdb.Close() })
	prefix := uniquePrefix("fuzz")

	f.Fuzz(func(t *testing.T, rate, perNanos, n int64, key string) {
		l := Limit{Rate: rate, Per: time.Duration(perNanos)}
		per := l.Per
		valid := rate >= 1 && rate <= maxRate && per >= time.Millisecond && per <= maxPer && per%time.Microsecond == 0
		if err := l.Validate(); (err == nil) != valid {
			t.Fatalf("%v: Validate got %v, want valid=%v", l, err, valid)
		}
		_ = l.String()
		// Limiters with different limits must not share keys.
		prefix := fmt.Sprintf("%s-%d-%d", prefix, rate, perNanos)
		for _, a := range algorithms() {
			lim, err := a.new(rdb, l, Config{Prefix: prefix})
			wantOK := valid && (a.kind != "sl" || rate <= maxLogRate)
			if (err == nil) != wantOK {
				t.Fatalf("%s %v: got %v, want valid=%v", a.name, l, err, wantOK)
			}
			if err != nil {
				continue
			}
			span := a.windows * l.per()
			ttl := ttlMillis(span)
			if ttl*1000 <= span || ttl > span*11/10_000+1 {
				t.Fatalf("%s %v: got TTL %dms, want just over %dµs", a.name, l, ttl, span)
			}
			goodArgs := key != "" && len(key) <= maxKeyLen && !strings.ContainsAny(key, "{}") && n >= 1 && n <= rate
			if a.kind == "sl" && n > 1_000 {
				continue // valid, but slow to record for every fuzz input
			}
			ctx := context.Background()
			res, err := lim.Allow(ctx, key, n)
			if !goodArgs {
				if !errors.Is(err, shaper.ErrInvalid) {
					t.Fatalf("%s %v Allow(%q, %d): got %v, want ErrInvalid", a.name, l, key, n, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s %v Allow(%q, %d): %v", a.name, l, key, n, err)
			}
			if res.Limit != rate || res.Remaining < 0 || res.Remaining > rate || res.RetryAfter < 0 ||
				res.ResetAfter < 0 || res.ResetAfter > time.Duration(span)*time.Microsecond {
				t.Fatalf("%s %v Allow(%q, %d): got %v, not a sane result", a.name, l, key, n, res)
			}
			k := (&limiter{prefix: prefix, kind: a.kind}).redisKey(key)
			// A short window's key may be about to go (PTTL 0) or gone
			// (-2), which is fine; a key without expiry (-1) or with a
			// longer one is not.
			pttl, err := rdb.PTTL(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			if pttl == -1 || pttl > time.Duration(ttl)*time.Millisecond {
				t.Fatalf("%s %v: key %q: got PTTL %v, want at most %dms", a.name, l, k, pttl, ttl)
			}
		}
	})
}

// The models never panic and keep their invariants for any valid limit,
// start time (even before 1970) and sequence of steps and costs; the
// sliding log never puts more than Rate into any window while the clock
// only moves forward.
func FuzzModels(f *testing.F) {
	f.Add(int64(3), int64(1_000_000), testNow, []byte{0, 1, 2, 255, 128, 7, 7, 7})
	f.Add(int64(1), int64(1_000), int64(-5), []byte{1, 1, 1, 1})
	f.Add(maxRate, maxPer.Microseconds(), int64(0), []byte{200, 100, 255, 0, 3})
	f.Fuzz(func(t *testing.T, rate, perMicros, start int64, steps []byte) {
		l := Limit{Rate: rate, Per: time.Duration(perMicros) * time.Microsecond}
		if perMicros > maxPer.Microseconds() || l.Validate() != nil || start < -1<<52 || start > 1<<52 {
			return
		}
		if len(steps) > 300 {
			steps = steps[:300] // the log model copies itself per step
		}
		per := l.per()
		var fw, sw counterState
		var log []int64
		var admitted []admission
		now := start
		monotonic := true // a clock stepping back voids the log's promise
		for i, b := range steps {
			// The byte's low bits pick the step, its high bits the cost.
			switch b & 7 {
			case 1:
				now++
			case 2:
				now += per / 3
			case 3:
				now = windowStart(now, per) + per
			case 4:
				now += 2 * per
			case 5:
				now -= per / 5
				monotonic = monotonic && per/5 == 0
			case 6:
				now += int64(b) * per / 97
			}
			n := min(rate, 1+int64(b>>3)%max(1, rate))
			var ds [3]decision
			ds[0], fw = fixedWindowModel(fw, now, per, rate, n)
			ds[1], sw = slidingWindowModel(sw, now, per, rate, n)
			var d decision
			d, log = slidingLogModel(log, now, per, rate, n)
			ds[2] = d
			if d.allowed {
				admitted = append(admitted, admission{now, n})
			}
			for _, d := range ds {
				if d.remaining < 0 || d.remaining > rate || d.resetAfter < 0 || d.retryAfter < 0 ||
					d.allowed != (d.retryAfter == 0) {
					t.Fatalf("step %d (now %d, cost %d): got %+v for %v", i, now, n, d, l)
				}
			}
		}
		if monotonic {
			if got := busiestWindow(admitted, per); got > rate {
				t.Fatalf("sliding log admitted %d in one window of %v, limit %v", got, l.Per, l)
			}
		}
	})
}
