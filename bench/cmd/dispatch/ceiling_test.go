package main

import "testing"

func TestPaired(t *testing.T) {
	rs := func(rates ...float64) []drainResult {
		out := make([]drainResult, len(rates))
		for i, r := range rates {
			out[i].rate = r
		}
		return out
	}
	for _, tc := range []struct {
		name string
		a, b []drainResult
		want string
	}{
		{name: "round by round", a: rs(100, 300, 90), b: rs(100, 100, 100), want: "1.00× (0.90–3.00)"},
		// The ratio of medians would be 1.00× here; pairing shows shaper
		// behind in every round.
		{name: "pairs, not medians", a: rs(90, 180, 270), b: rs(100, 200, 300), want: "0.90× (0.90–0.90)"},
		{name: "a round without asynq's rate is left out", a: rs(50, 80), b: rs(0, 100), want: "0.80× (0.80–0.80)"},
		{name: "uneven lengths pair what they share", a: rs(120), b: rs(100, 100), want: "1.20× (1.20–1.20)"},
		{name: "nothing to pair", a: nil, b: rs(100), want: "–"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := paired(tc.a, tc.b); got != tc.want {
				t.Errorf("paired: got %q, want %q", got, tc.want)
			}
		})
	}
}
