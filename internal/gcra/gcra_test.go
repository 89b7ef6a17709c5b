package gcra_test

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/shaperhq/shaper/internal/gcra"
	"github.com/shaperhq/shaper/internal/script"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

var srv *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &srv) }

// evalScript runs each Lua function once on the arguments and returns
// {earliest, take(earliest), remaining}.
var evalScript = script.New(gcra.LuaFunctions, `
local tat, now, interval, capacity, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local at = gcra_earliest(tat, now, interval, capacity, cost)
local nxt = gcra_take(tat, at, interval, cost)
return {at, nxt, gcra_remaining(tat, now, interval, capacity), gcra_remaining(nxt, now, interval, capacity)}
`)

// TestLuaMatchesGo holds the Lua functions to the Go ones on random inputs,
// including values near 2^50 where a float rounding slip would show.
func TestLuaMatchesGo(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 3000; i++ {
		p := gcra.Params{Interval: 1 + rng.Int64N(1_000_000), Capacity: 1 + rng.Int64N(1000)}
		if i%3 == 0 {
			p.Interval = 1 + rng.Int64N(gcra.MaxSpan/p.Capacity)
		}
		if p.Validate() != nil {
			continue
		}
		now := 1_700_000_000_000_000 + rng.Int64N(1_000_000_000_000)
		tat := now + rng.Int64N(2*p.Span()+1) - p.Span()
		if rng.IntN(5) == 0 {
			tat = 0
		}
		cost := 1 + rng.Int64N(p.Capacity)
		at := gcra.Earliest(tat, now, p, cost)
		next := gcra.Take(tat, at, p, cost)
		want := []int64{at, next, gcra.Remaining(tat, now, p), gcra.Remaining(next, now, p)}
		v, err := script.Run(ctx, rdb, "gcra.eval", evalScript, nil, tat, now, p.Interval, p.Capacity, cost)
		if err != nil {
			t.Fatal(err)
		}
		got, err := script.Ints(v, 4)
		if err != nil {
			t.Fatal(err)
		}
		for j := range want {
			if got[j] != want[j] {
				t.Fatalf("tat %d now %d %+v cost %d: Lua %v, Go %v", tat, now, p, cost, got, want)
			}
		}
	}
}

func TestAllow(t *testing.T) {
	p := gcra.Params{Interval: 100, Capacity: 3}
	now := int64(1000)
	tat := int64(0)
	// A full bucket lets capacity through at one instant, then refuses.
	for i, want := range []bool{true, true, true, false} {
		d := gcra.Allow(tat, now, p, 1)
		if d.Allowed != want {
			t.Fatalf("request %d: got allowed %v, want %v", i, d.Allowed, want)
		}
		if !d.Allowed {
			if d.TAT != tat || d.RetryAfter != 100 || d.Remaining != 0 || d.ResetAfter != 300 {
				t.Fatalf("denial: got %+v, want TAT unchanged, retry 100, remaining 0, reset 300", d)
			}
		} else if d.Remaining != int64(2-i) {
			t.Fatalf("request %d: got remaining %d, want %d", i, d.Remaining, 2-i)
		}
		tat = d.TAT
	}
	// One interval later exactly one more fits.
	if d := gcra.Allow(tat, now+100, p, 1); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after one interval: got %+v, want allowed with 0 left", d)
	}
	// A cost of 2 waits for two units of room.
	if d := gcra.Allow(tat, now+100, p, 2); d.Allowed || d.RetryAfter != 100 {
		t.Fatalf("cost 2 after one interval: got %+v, want denied for 100 more", d)
	}
}

func TestParamsValidate(t *testing.T) {
	for _, p := range []gcra.Params{{0, 1}, {1, 0}, {gcra.MaxSpan, 2}} {
		if p.Validate() == nil {
			t.Errorf("%+v: got valid, want an error", p)
		}
	}
	if err := (gcra.Params{Interval: 1, Capacity: 1}).Validate(); err != nil {
		t.Errorf("smallest params: %v", err)
	}
}
