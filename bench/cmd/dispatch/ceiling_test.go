package main

import (
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

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

func TestParseReport(t *testing.T) {
	for _, tc := range []struct {
		line string
		want reportLine
		ok   bool
	}{
		{line: "ready", want: reportLine{kind: "ready"}, ok: true},
		{line: "startcpu 791047", want: reportLine{kind: "startcpu", n: 791047}, ok: true},
		{line: "t 1796166105851543996", want: reportLine{kind: "t", n: 1796166105851543996}, ok: true},
		{line: "end 2886", want: reportLine{kind: "end", n: 2886}, ok: true},
		{line: "end 0\r", want: reportLine{kind: "end", n: 0}, ok: true},
		// Lines that are not the report's are skipped, not misread.
		{line: "end", ok: false},
		{line: "t", ok: false},
		{line: "t 12x", ok: false},
		{line: "t -5", ok: false},
		{line: "startcpu 1.5", ok: false},
		{line: "ready now", ok: false},
		{line: "(node:123) Warning: something", ok: false},
		{line: "", ok: false},
	} {
		got, ok := parseReport(tc.line)
		if ok != tc.ok || got != tc.want {
			t.Errorf("parseReport(%q) = %+v, %v; want %+v, %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
}

// The report as bench/node/bullmq.mjs prints it, read as the parent reads
// it: ready once, the start-up CPU kept, every time, the end's count.
func TestChildReadsAReport(t *testing.T) {
	report := "startcpu 250000\nready\nstray output\nt 1000000000\nt 3000000000\nt 2000000000\nend 3\n"
	c := &child{ready: make(chan struct{}), times: make(chan time.Time, 8), reported: -1, ended: make(chan struct{})}
	c.read(io.NopCloser(strings.NewReader(report)))
	select {
	case <-c.ready:
	default:
		t.Fatal("not ready after a ready line")
	}
	if c.startCPU != 250*time.Millisecond {
		t.Errorf("startCPU %v, want 250ms", c.startCPU)
	}
	if c.reported != 3 {
		t.Errorf("reported %d, want 3", c.reported)
	}
	want := []time.Time{time.Unix(1, 0), time.Unix(3, 0), time.Unix(2, 0)}
	if !slices.EqualFunc(c.all, want, time.Time.Equal) {
		t.Errorf("times %v, want %v", c.all, want)
	}
	if got := middleRate([]time.Duration{time.Second, 3 * time.Second, 2 * time.Second}); got != 1 {
		t.Errorf("middleRate of the report's times: %v, want 1 job/s", got)
	}
}
