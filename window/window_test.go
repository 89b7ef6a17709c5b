package window

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
)

func TestLimitValidate(t *testing.T) {
	tests := []struct {
		limit Limit
		want  string // substring of the error; "" for valid
	}{
		{PerSecond(10), ""},
		{PerMinute(1), ""},
		{Limit{Rate: 1, Per: time.Millisecond}, ""},
		{Limit{Rate: maxRate, Per: maxPer}, ""},
		{Limit{Rate: 5, Per: 1500 * time.Microsecond}, ""},
		{Limit{Rate: 0, Per: time.Second}, "rate 0: must be at least 1"},
		{Limit{Rate: -3, Per: time.Second}, "rate -3"},
		{Limit{Rate: maxRate + 1, Per: time.Second}, "must be at most"},
		{Limit{Rate: 1, Per: 0}, "per 0s: must be at least 1ms"},
		{Limit{Rate: 1, Per: -time.Second}, "must be at least 1ms"},
		{Limit{Rate: 1, Per: 999 * time.Microsecond}, "at least 1ms"},
		{Limit{Rate: 1, Per: maxPer + time.Microsecond}, "at most 366 days"},
		{Limit{Rate: 1, Per: time.Second + time.Nanosecond}, "whole number of microseconds"},
	}
	for _, tt := range tests {
		err := tt.limit.Validate()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%v: got %v, want valid", tt.limit, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%v: got %v, want an error containing %q", tt.limit, err, tt.want)
		}
	}
}

func TestLimitString(t *testing.T) {
	for _, tt := range []struct {
		limit Limit
		want  string
	}{
		{PerSecond(10), "10 per 1s"},
		{PerMinute(600), "600 per 1m0s"},
		{Limit{Rate: 3, Per: 250 * time.Millisecond}, "3 per 250ms"},
	} {
		if got := tt.limit.String(); got != tt.want {
			t.Errorf("got %q, want %q", got, tt.want)
		}
	}
}

func TestTTLMillis(t *testing.T) {
	for _, tt := range []struct{ span, want int64 }{
		{1_000, 2},         // 1ms + a tenth, rounded up
		{1_000_000, 1_100}, // 1s
		{2_000_000, 2_200}, // a sliding window counter's 2×1s
		{1_234_567, 1_359}, // 1.3580237s, rounded up
		{maxPer.Microseconds() * 2, maxPer.Milliseconds() * 2 * 11 / 10},
	} {
		if got := ttlMillis(tt.span); got != tt.want {
			t.Errorf("ttlMillis(%d): got %d, want %d", tt.span, got, tt.want)
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	noLeaks(t)
	rdb := srv.Client(t)
	for _, a := range algorithms() {
		if _, err := a.new(nil, PerSecond(1), Config{}); err == nil {
			t.Errorf("%s: nil client: got no error", a.name)
		}
		if _, err := a.new(rdb, PerSecond(0), Config{}); err == nil || !strings.Contains(err.Error(), "rate 0") {
			t.Errorf("%s: rate 0: got %v, want an error naming the rate", a.name, err)
		}
		if _, err := a.new(rdb, PerSecond(1), Config{Prefix: "a{b"}); err == nil || !strings.Contains(err.Error(), "braces") {
			t.Errorf("%s: prefix with a brace: got %v, want an error about braces", a.name, err)
		}
		lim, err := a.new(rdb, PerSecond(maxLogRate), Config{})
		if err != nil {
			t.Errorf("%s: rate %d: got %v, want valid", a.name, maxLogRate, err)
			continue
		}
		if got := lim.Limit(); got != PerSecond(maxLogRate) {
			t.Errorf("%s: Limit() got %v, want %v", a.name, got, PerSecond(maxLogRate))
		}
	}
	if _, err := NewSlidingLog(rdb, PerSecond(maxLogRate+1), Config{}); err == nil || !strings.Contains(err.Error(), "SlidingWindow") {
		t.Errorf("sliding log over %d: got %v, want an error pointing to SlidingWindow", maxLogRate, err)
	}
	if _, err := NewSlidingWindow(rdb, PerSecond(maxLogRate+1), Config{}); err != nil {
		t.Errorf("sliding window over %d: got %v, want valid", maxLogRate, err)
	}
}

// Bad arguments are refused before Redis sees them: an error wrapping
// shaper.ErrInvalid, and nothing written.
func TestAllowRejectsBadArguments(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	rdb := srv.Client(t)
	for _, a := range algorithms() {
		prefix := uniquePrefix("bad-" + a.kind)
		lim, err := a.new(rdb, PerSecond(3), Config{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		for _, tt := range []struct {
			key  string
			n    int64
			want string
		}{
			{"", 1, "empty key"},
			{"a{b", 1, "braces"},
			{"a}b", 1, "braces"},
			{strings.Repeat("k", maxKeyLen+1), 1, "at most 512"},
			{"k", 0, "cost 0: must be at least 1"},
			{"k", -1, "cost -1"},
			{"k", 4, "cost 4: exceeds the limit's rate 3"},
		} {
			res, err := lim.Allow(ctx, tt.key, tt.n)
			if !errors.Is(err, shaper.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%s: Allow(%.20q, %d): got %v, want ErrInvalid containing %q", a.name, tt.key, tt.n, err, tt.want)
			}
			if res != (shaper.Result{}) {
				t.Errorf("%s: Allow(%.20q, %d): got result %v, want the zero Result", a.name, tt.key, tt.n, res)
			}
		}
		if err := lim.Reset(ctx, "a{b"); !errors.Is(err, shaper.ErrInvalid) {
			t.Errorf("%s: Reset with a brace: got %v, want ErrInvalid", a.name, err)
		}
		keys, err := rdb.Keys(ctx, prefix+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) != 0 {
			t.Errorf("%s: got keys %q after refused calls, want none", a.name, keys)
		}
	}
}

// The fixed window's known weakness, shown: a client that spends its whole
// allowance just before a boundary and again just after gets 2× the limit
// through within 2ms. The sliding limiters hold the same traffic to the
// limit.
func TestFixedWindowAdmitsTwiceAcrossBoundary(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	rdb := srv.Client(t)
	const rate = 10
	boundary := windowStart(testNow, time.Second.Microseconds()) + time.Second.Microseconds()
	want := map[string]int{"fixed window": 2 * rate, "sliding log": rate, "sliding window": rate}
	for _, a := range algorithms() {
		clk := &clock{}
		lim, err := a.new(rdb, PerSecond(rate), Config{Prefix: uniquePrefix("boundary"), Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		admitted := 0
		for _, at := range []int64{boundary - 1_000, boundary + 1_000} {
			clk.now = at
			for range rate + 5 {
				res, err := lim.Allow(ctx, "client", 1)
				if err != nil {
					t.Fatal(err)
				}
				if res.Allowed {
					admitted++
				}
			}
		}
		if admitted != want[a.name] {
			t.Errorf("%s: got %d admitted within 2ms across a boundary, want %d", a.name, admitted, want[a.name])
		}
	}

	// The fixed window's denial just before the boundary points at it.
	clk := &clock{now: boundary - 1_000}
	fw, err := NewFixedWindow(rdb, PerSecond(rate), Config{Prefix: uniquePrefix("boundary-retry"), Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fw.Allow(ctx, "client", rate); err != nil {
		t.Fatal(err)
	}
	res, err := fw.Allow(ctx, "client", 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := (shaper.Result{Limit: rate, RetryAfter: time.Millisecond, ResetAfter: time.Millisecond}); res != want {
		t.Errorf("denial 1ms before the boundary: got %v, want %v", res, want)
	}
}

// admission is one admitted request in a simulated run.
type admission struct{ at, units int64 }

// busiestWindow is the most units admitted in any window [t, t+per), over
// windows starting at an admission (the busiest window always can).
func busiestWindow(adm []admission, per int64) int64 {
	var most, sum int64
	j := 0
	for i := range adm {
		for j < len(adm) && adm[j].at < adm[i].at+per {
			sum += adm[j].units
			j++
		}
		most = max(most, sum)
		sum -= adm[i].units
	}
	return most
}

// The sliding log is exact: over a long random arrival sequence, with
// bursts, equal timestamps and costs above 1, no window of length Per ever
// holds more than Rate admitted units, while the busiest are full. The
// fixed window, fed the same arrivals, overshoots.
func TestSlidingLogNeverExceedsLimit(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	rdb := srv.Client(t)
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 1))
	l := Limit{Rate: 10, Per: 10 * time.Second}
	per := l.per()

	type arrival struct{ at, units int64 }
	arrivals := make([]arrival, 3000)
	at := testNow + rng.Int64N(per)
	for i := range arrivals {
		switch r := rng.IntN(10); {
		case r < 2: // same µs as the last
		case r < 3:
			at += rng.Int64N(per) // a lull
		default:
			at += rng.Int64N(2 * per / l.Rate)
		}
		arrivals[i] = arrival{at, 1 + rng.Int64N(3)}
	}

	run := func(a algorithm) []admission {
		clk := &clock{}
		lim, err := a.new(rdb, l, Config{Prefix: uniquePrefix("exact"), Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		var adm []admission
		for _, ar := range arrivals {
			clk.now = ar.at
			res, err := lim.Allow(ctx, "client", ar.units)
			if err != nil {
				t.Fatal(err)
			}
			if res.Allowed {
				adm = append(adm, admission{ar.at, ar.units})
			}
		}
		return adm
	}
	algos := algorithms()
	if got := busiestWindow(run(algos[1]), per); got != l.Rate {
		t.Errorf("seed %d: sliding log: got %d units in the busiest window of %v, want exactly %d", seed, got, l.Per, l.Rate)
	}
	if got := busiestWindow(run(algos[0]), per); got <= l.Rate {
		t.Errorf("seed %d: fixed window: got at most %d units in any window of %v, want more than %d (the boundary burst)", seed, got, l.Per, l.Rate)
	}
}

// expiringKeys checks that every key under prefix has a TTL in (0, ttl] and
// returns the keys.
func expiringKeys(t *testing.T, rdb *redis.Client, prefix string, ttl int64) []string {
	t.Helper()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, prefix+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		pttl, err := rdb.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if pttl <= 0 || pttl > time.Duration(ttl)*time.Millisecond {
			t.Errorf("key %s: got PTTL %v, want in (0, %dms]", k, pttl, ttl)
		}
	}
	return keys
}

// Every key the package writes expires, whatever the last operation was,
// and its TTL is the state's lifetime (one window, two for the sliding
// window counter) plus a tenth. Keys are laid out as PREFIX:KIND:{KEY}.
func TestEveryKeyExpires(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	rdb := srv.Client(t)
	// A day, so that Redis's own clock will not cross a fixed window's
	// boundary in mid-test.
	l := Limit{Rate: 3, Per: 24 * time.Hour}
	for _, a := range algorithms() {
		t.Run(a.name, func(t *testing.T) {
			span := a.windows * l.per()
			ttl := ttlMillis(span)
			for _, useClock := range []bool{false, true} {
				prefix := uniquePrefix("ttl-" + a.kind)
				cfg := Config{Prefix: prefix}
				clk := &clock{now: testNow}
				if useClock {
					cfg.Now = clk.Now
				}
				lim, err := a.new(rdb, l, cfg)
				if err != nil {
					t.Fatal(err)
				}
				step := func(what string, advance, n int64, wantAllowed bool) {
					t.Helper()
					clk.now += advance
					res, err := lim.Allow(ctx, "user", n)
					if err != nil {
						t.Fatal(err)
					}
					if res.Allowed != wantAllowed {
						t.Fatalf("%s: got %v, want allowed=%v", what, res, wantAllowed)
					}
					keys := expiringKeys(t, rdb, prefix, ttl)
					if want := prefix + ":" + a.kind + ":{user}"; len(keys) != 1 || keys[0] != want {
						t.Fatalf("%s: got keys %q, want [%s]", what, keys, want)
					}
					if !res.Allowed {
						return
					}
					// Right after a write the state must outlive its use.
					// The tenth of margin (2.4h here) absorbs the test's own pace.
					if pttl := rdb.PTTL(ctx, keys[0]).Val(); pttl < time.Duration(span)*time.Microsecond {
						t.Errorf("%s: got PTTL %v after a write, want at least %v", what, pttl, time.Duration(span)*time.Microsecond)
					}
				}
				step("first", 0, 2, true)
				step("second", 1, 1, true)
				step("denied", 1, 1, false)
				step("denied, larger", 1, 3, false)
				if !useClock {
					continue
				}
				// Past the window; for the log this trims the first two.
				step("next window", l.per()+1_000, 1, true)
				if a.kind == "sl" {
					// A denial that trims part of the log: the entry from
					// "next window" leaves, the one from "half later" stays.
					step("half later", l.per()/2, 1, true)
					step("trimming denial", l.per()/2+1, 3, false)
				}
			}
		})
	}
}

// A cost equal to the rate and far above Lua's unpack limit (about 8000
// values) still records every unit in the sliding log.
func TestSlidingLogLargeCost(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	rdb := srv.Client(t)
	clk := &clock{now: testNow}
	prefix := uniquePrefix("large")
	lim, err := NewSlidingLog(rdb, PerMinute(maxLogRate), Config{Prefix: prefix, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int64{7_777, maxLogRate - 7_777 - 1, 1} {
		if res, err := lim.Allow(ctx, "k", n); err != nil || !res.Allowed {
			t.Fatalf("cost %d: got %v, %v; want allowed", n, res, err)
		}
	}
	if res, err := lim.Allow(ctx, "k", 1); err != nil || res.Allowed {
		t.Fatalf("one over: got %v, %v; want denied", res, err)
	}
	if got := rdb.ZCard(ctx, prefix+":sl:{k}").Val(); got != maxLogRate {
		t.Errorf("got %d log entries, want %d", got, maxLogRate)
	}
}

func TestReset(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	rdb := srv.Client(t)
	for _, a := range algorithms() {
		lim, err := a.new(rdb, PerMinute(2), Config{Prefix: uniquePrefix("reset")})
		if err != nil {
			t.Fatal(err)
		}
		for i, want := range []bool{true, true, false} {
			if res, err := lim.Allow(ctx, "k", 1); err != nil || res.Allowed != want {
				t.Fatalf("%s: call %d: got %v, %v; want allowed=%v", a.name, i, res, err, want)
			}
		}
		if err := lim.Reset(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		res, err := lim.Allow(ctx, "k", 2)
		if err != nil || !res.Allowed || res.Remaining != 0 {
			t.Errorf("%s: after Reset got %v, %v; want the full allowance", a.name, res, err)
		}
	}
}
