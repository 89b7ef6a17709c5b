// Command proxy measures what shaper's proxy (ANY /proxy/{upstream}/{rest}
// on `shaper serve`) costs a call when there is room under the limit
// (issue 18, outcome 9), as a user runs it: a real `shaper serve` built
// from this tree, its own Redis, and an upstream in this process that
// answers a chat completion at once and enforces no limit. Two sections:
//
//   - latency: one caller, calls one after another, each round a run
//     straight at the upstream and a run through the proxy (in alternating
//     order), shaper's limit far above the rate reached: p50 and p99 of
//     each and what the proxy adds, paired by round;
//   - throughput: concurrent callers for a fixed time against the upstream
//     direct, through net/http/httputil.ReverseProxy (a child process of
//     this command, GOMAXPROCS as shaper's), through shaper's proxy, and
//     through nginx's proxy_pass when nginx is installed, in turn each
//     round: calls per second, and each one's ratio to ReverseProxy's in
//     the same round.
//
// It prints markdown tables, the machine and its load, and the exact
// command. Speed figures are for BENCHMARKS.md, never test assertions.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/shaperhq/shaper/bench/internal/fleet"
)

func main() {
	fleet.ServeChild()
	if os.Getenv(fleet.EnvRole) == roleReverseProxy {
		if err := serveReverseProxy(os.Getenv(envListen), os.Getenv(envTarget)); err != nil {
			fmt.Fprintln(os.Stderr, "proxy: reverse proxy child:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "proxy:", err)
		os.Exit(1)
	}
}
