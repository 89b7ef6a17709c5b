// Command thirdparty runs the fake rate-limited upstream of package
// fakeupstream on its own, for demos and for tests that need it in a separate
// process. It prints the address it listens on, serves until SIGINT or
// SIGTERM, then finishes the requests in flight and prints what it saw.
//
//	thirdparty -listen 127.0.0.1:0 -style openai -rate 100 -per 1s \
//	    -cost-rate 40000 -cost-per 1m
//
// -style picks how the upstream talks about its limits (-help lists what
// each sends): plain, stripe, openai, ietf (the IETF draft's RateLimit and
// RateLimit-Policy fields) or bare (a hidden limit: bare 429s only). A
// request may say what it really used of the cost limit in an X-Fake-Usage
// header; the cost limit then charges that instead of the declared cost.
//
// GET /_thirdparty/report shows the figures at any time; POST
// /_thirdparty/reset starts them afresh.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/shaperhq/shaper/fakeupstream"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errUsage):
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "thirdparty:", err)
		os.Exit(1)
	}
}

// errUsage marks bad flags, already explained on stderr by the flag package.
var errUsage = errors.New("usage")

// shutdownGrace is how long requests in flight get to finish on a signal.
const shutdownGrace = 10 * time.Second

// options are the command's flags.
type options struct {
	listen string
	cfg    fakeupstream.Config
	// The optional limits exist only when their rate is set.
	endpoint fakeupstream.Limit
	cost     fakeupstream.CostLimit
}

// styleHelp ends -help: what each style sends, and the usage header.
const styleHelp = `
Styles (-style):
  plain   429 with Retry-After (seconds) and a one-line text body.
  stripe  429 with Stripe-Rate-Limited-Reason (global-rate, endpoint-rate,
          global-concurrency) and a JSON error; no Retry-After.
  openai  x-ratelimit-limit/remaining/reset-requests and -tokens on every
          answer (reset like "1s", "6m0s", "12ms"); on 429 retry-after and a
          rate_limit_exceeded error; successes report usage.total_tokens.
  ietf    draft-ietf-httpapi-ratelimit-headers-10 fields on every answer:
            RateLimit-Policy: "default";q=40;w=1, "tokens";q=2000;w=1;qu="tokens"
            RateLimit: "default";r=12;t=1, "tokens";r=1500;t=1
          q is the rate per w seconds (w rounded up), r what is left now,
          t the seconds (rounded up) until the limit is back to its full
          allowance; an endpoint limit is the "endpoint" policy with the
          endpoint as pk. On 429 also Retry-After, and the plain body.
  bare    a hidden limit: no rate-limit header on any answer; a 429 has no
          Retry-After and the body "Too Many Requests".

A request's cost is its cost header (-cost-header) or its JSON body's
max_tokens. A request may add X-Fake-Usage: N to say what it really used:
the cost limit then charges N instead, when the request arrives, and a
success answers X-Fake-Usage: N (openai also usage.total_tokens: N).
Through shaper a job sends it as headers: {X-Fake-Usage: "40"}.
`

// parse reads the flags into a Config; errors are already printed to stderr.
func parse(args []string, stderr io.Writer) (options, error) {
	var o options
	var alg, style string
	fs := flag.NewFlagSet("thirdparty", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: thirdparty [flags]\n\nA fake rate-limited third-party API. Flags:")
		fs.PrintDefaults()
		fmt.Fprint(stderr, styleHelp)
	}
	c := &o.cfg
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8090", "`address` to listen on (port 0 picks a free one; the address is printed)")
	fs.StringVar(&alg, "algorithm", string(fakeupstream.SlidingLog), "how limits count: sliding_log, fixed_window, token_bucket or meter (nginx limit_req: no request less than -per/-rate after the last, in whole ms)")
	fs.Int64Var(&c.Rate, "rate", 0, "most requests per API key per -per (0: no request limit)")
	fs.DurationVar(&c.Per, "per", fakeupstream.DefaultPer, "the request limit's window or refill period")
	fs.Int64Var(&c.Burst, "burst", 0, "token_bucket capacity (0: -rate), or the meter's extra requests (nginx burst=N nodelay; 0: none)")
	fs.IntVar(&c.Concurrency, "concurrency", 0, "most requests in flight per API key (0: no cap)")
	fs.Int64Var(&o.endpoint.Rate, "endpoint-rate", 0, "most requests per API key and endpoint (method and path) per -endpoint-per (0: none)")
	fs.DurationVar(&o.endpoint.Per, "endpoint-per", fakeupstream.DefaultPer, "the endpoint limit's window or refill period")
	fs.Int64Var(&o.endpoint.Burst, "endpoint-burst", 0, "token_bucket capacity of the endpoint limit (0: -endpoint-rate)")
	fs.StringVar(&o.cost.Name, "cost-name", fakeupstream.DefaultCostName, "name of the cost the cost limit counts")
	fs.StringVar(&o.cost.Header, "cost-header", "", "request header carrying the cost (default X-Cost-<Name>); without it a JSON body's max_tokens")
	fs.Int64Var(&o.cost.Rate, "cost-rate", 0, "most cost per API key per -cost-per (0: no cost limit)")
	fs.DurationVar(&o.cost.Per, "cost-per", time.Minute, "the cost limit's window or refill period")
	fs.Int64Var(&o.cost.Burst, "cost-burst", 0, "token_bucket capacity of the cost limit (0: -cost-rate)")
	fs.StringVar(&style, "style", string(fakeupstream.StylePlain), "how answers describe the limits: plain, stripe, openai, ietf or bare (see below)")
	fs.DurationVar(&c.Latency, "latency", 0, "delay before every admitted answer")
	fs.DurationVar(&c.Jitter, "jitter", 0, "extra random delay, uniform in [0, jitter]")
	fs.Float64Var(&c.FailRate, "fail-rate", 0, "fraction of admitted requests answered 500 or 503")
	fs.Uint64Var(&c.Seed, "seed", 0, "seed for failures and jitter")
	fs.StringVar(&c.IdempotencyHeader, "idempotency-header", fakeupstream.DefaultIdempotencyHeader, "request header carrying the idempotency key")
	fs.IntVar(&c.MaxRecords, "max-records", fakeupstream.DefaultMaxRecords, "arrivals kept for the report")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return o, err
		}
		return o, errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "thirdparty: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return o, errUsage
	}
	c.Algorithm, c.Style = fakeupstream.Algorithm(alg), fakeupstream.Style(style)
	if o.endpoint.Rate != 0 || o.endpoint.Burst != 0 {
		c.EndpointLimit = &o.endpoint
	}
	if o.cost.Rate != 0 || o.cost.Burst != 0 {
		c.CostLimit = &o.cost
	}
	return o, nil
}

// run serves until ctx is done. It writes the listen address as the first
// line of stdout ("listening on http://ADDR") and a summary when it stops.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	s, err := fakeupstream.New(o.cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(stdout, "listening on http://%s (%s, %s style)\n", ln.Addr(), s.Report().Limit, s.Config().Style)

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	shutdownErr := srv.Shutdown(sctx)
	<-served // Serve returns ErrServerClosed as soon as Shutdown starts
	fmt.Fprintln(stdout, s.Report())
	if shutdownErr != nil {
		return fmt.Errorf("shutdown: %w", shutdownErr)
	}
	return nil
}
