package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper/fakeupstream"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		check func(t *testing.T, o options)
	}{
		{"defaults", nil, func(t *testing.T, o options) {
			c := o.cfg
			if o.listen != "127.0.0.1:8090" || c.Algorithm != fakeupstream.SlidingLog || c.Style != fakeupstream.StylePlain ||
				c.Rate != 0 || c.Per != time.Second || c.EndpointLimit != nil || c.CostLimit != nil ||
				c.IdempotencyHeader != "Idempotency-Key" || c.MaxRecords != fakeupstream.DefaultMaxRecords {
				t.Errorf("defaults: %+v", o)
			}
		}},
		{"everything", []string{
			"-listen", ":0", "-algorithm", "token_bucket", "-rate", "100", "-per", "2s", "-burst", "10",
			"-concurrency", "4", "-endpoint-rate", "5", "-endpoint-per", "3s", "-endpoint-burst", "2",
			"-cost-name", "units", "-cost-header", "X-Units", "-cost-rate", "900", "-cost-per", "1h", "-cost-burst", "50",
			"-style", "openai", "-latency", "5ms", "-jitter", "2ms", "-fail-rate", "0.1", "-seed", "9",
			"-idempotency-header", "X-Idem", "-max-records", "1000",
		}, func(t *testing.T, o options) {
			want := fakeupstream.Config{
				Algorithm: fakeupstream.TokenBucket, Rate: 100, Per: 2 * time.Second, Burst: 10, Concurrency: 4,
				Style: fakeupstream.StyleOpenAI, Latency: 5 * time.Millisecond, Jitter: 2 * time.Millisecond,
				FailRate: 0.1, Seed: 9, IdempotencyHeader: "X-Idem", MaxRecords: 1000,
			}
			c := o.cfg
			if c.EndpointLimit == nil || *c.EndpointLimit != (fakeupstream.Limit{Rate: 5, Per: 3 * time.Second, Burst: 2}) {
				t.Errorf("endpoint limit %+v", c.EndpointLimit)
			}
			if c.CostLimit == nil || *c.CostLimit != (fakeupstream.CostLimit{Name: "units", Header: "X-Units", Rate: 900, Per: time.Hour, Burst: 50}) {
				t.Errorf("cost limit %+v", c.CostLimit)
			}
			c.EndpointLimit, c.CostLimit = nil, nil
			if o.listen != ":0" || c.Algorithm != want.Algorithm || c.Rate != want.Rate || c.Per != want.Per ||
				c.Burst != want.Burst || c.Concurrency != want.Concurrency || c.Style != want.Style ||
				c.Latency != want.Latency || c.Jitter != want.Jitter || c.FailRate != want.FailRate ||
				c.Seed != want.Seed || c.IdempotencyHeader != want.IdempotencyHeader || c.MaxRecords != want.MaxRecords {
				t.Errorf("got %+v, want %+v", c, want)
			}
		}},
		{"meter", []string{"-algorithm", "meter", "-rate", "50", "-burst", "2"}, func(t *testing.T, o options) {
			if c := o.cfg; c.Algorithm != fakeupstream.Meter || c.Rate != 50 || c.Burst != 2 {
				t.Errorf("got %+v, want the meter at 50 per second with burst 2", c)
			}
			if _, err := fakeupstream.New(o.cfg); err != nil {
				t.Errorf("New: %v", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parse(tc.args, io.Discard)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			tc.check(t, o)
		})
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		err    error
		stderr string
	}{
		{[]string{"-rate", "many"}, errUsage, `invalid value "many" for flag -rate`},
		{[]string{"-nope"}, errUsage, "flag provided but not defined: -nope"},
		{[]string{"extra"}, errUsage, `unexpected argument "extra"`},
		{[]string{"-h"}, flag.ErrHelp, "usage: thirdparty [flags]"},
		{[]string{"-h"}, flag.ErrHelp, `RateLimit-Policy: "default";q=40;w=1`},
		{[]string{"-h"}, flag.ErrHelp, "X-Fake-Usage: N"},
	} {
		var stderr strings.Builder
		_, err := parse(tc.args, &stderr)
		if !errors.Is(err, tc.err) || !strings.Contains(stderr.String(), tc.stderr) {
			t.Errorf("parse(%q): %v and %q, want %v and %q", tc.args, err, stderr.String(), tc.err, tc.stderr)
		}
	}
}

func TestRunRefusesBadConfig(t *testing.T) {
	err := run(context.Background(), []string{"-listen", "127.0.0.1:0", "-style", "github"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `style "github": want plain, stripe, openai, ietf or bare`) {
		t.Errorf("run: %v, want the bad style named", err)
	}
}

// start runs the command with args, reads the address it prints, and
// returns it with the first line and a stop that signals the command as
// SIGINT would and returns the rest of its output.
func start(t *testing.T, args ...string) (addr, first string, stop func() string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, stdout := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"-listen", "127.0.0.1:0"}, args...), stdout, io.Discard)
		stdout.Close()
	}()
	lines := bufio.NewScanner(out)
	if !lines.Scan() {
		cancel()
		t.Fatalf("no address printed: %v", <-done)
	}
	first = lines.Text()
	addr, ok := strings.CutPrefix(first, "listening on ")
	if !ok {
		cancel()
		t.Fatalf("first line %q", first)
	}
	addr, _, _ = strings.Cut(addr, " ")
	stopped := false
	stop = func() string {
		stopped = true
		cancel()
		var rest strings.Builder
		for lines.Scan() {
			rest.WriteString(lines.Text())
		}
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
		return rest.String()
	}
	t.Cleanup(func() {
		if !stopped {
			stop()
		}
	})
	return addr, first, stop
}

// TestRun starts the command, sends a request and stops it as a signal
// would.
func TestRun(t *testing.T) {
	addr, first, stop := start(t, "-rate", "1", "-style", "stripe")
	if !strings.Contains(first, "(sliding_log: 1 request per 1s per key, stripe style)") {
		t.Fatalf("first line %q", first)
	}
	for _, want := range []int{200, 429} {
		resp, err := http.Post(addr+"/v1/charges", "application/x-www-form-urlencoded", strings.NewReader("amount=1"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("status %d, want %d", resp.StatusCode, want)
		}
	}
	if rest := stop(); !strings.Contains(rest, "2 requests (sliding_log: 1 request per 1s per key), 1× 200, 1× 429") {
		t.Errorf("summary %q", rest)
	}
}

// TestRunStyles: the new styles and the usage header work end to end
// through the command's flags. The clock is real, so the test asks only
// what a second's margin cannot change.
func TestRunStyles(t *testing.T) {
	post := func(t *testing.T, addr string, headers map[string]string) *http.Response {
		t.Helper()
		r, _ := http.NewRequest(http.MethodPost, addr+"/v1/chat/completions", strings.NewReader(`{"max_tokens":400}`))
		r.Header.Set("Authorization", "Bearer k")
		for k, v := range headers {
			r.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	t.Run("ietf", func(t *testing.T) {
		addr, first, stop := start(t, "-style", "ietf", "-rate", "40", "-per", "1m", "-cost-rate", "2000", "-cost-per", "1m")
		if !strings.Contains(first, ", ietf style)") {
			t.Errorf("first line %q", first)
		}
		resp := post(t, addr, map[string]string{"X-Fake-Usage": "40"})
		if got, want := resp.Header.Get("RateLimit-Policy"), `"default";q=40;w=60, "tokens";q=2000;w=60;qu="tokens"`; got != want {
			t.Errorf("RateLimit-Policy %q, want %q", got, want)
		}
		if got, want := resp.Header.Get("RateLimit"), `"default";r=39;t=60, "tokens";r=1960;t=60`; got != want {
			t.Errorf("RateLimit %q, want %q", got, want)
		}
		if rest := stop(); !strings.Contains(rest, "cost declared 400, charged 40; ietf style") {
			t.Errorf("summary %q", rest)
		}
	})
	t.Run("bare", func(t *testing.T) {
		addr, _, stop := start(t, "-style", "bare", "-rate", "1", "-per", "1m")
		for _, want := range []int{200, 429} {
			resp := post(t, addr, nil)
			if resp.StatusCode != want || resp.Header.Get("Retry-After") != "" || resp.Header.Get("RateLimit") != "" {
				t.Errorf("status %d, Retry-After %q, RateLimit %q; want %d and neither header",
					resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("RateLimit"), want)
			}
		}
		if rest := stop(); !strings.Contains(rest, "1× 429") || !strings.Contains(rest, "429s by limit: requests 1; bare style") {
			t.Errorf("summary %q", rest)
		}
	})
}
