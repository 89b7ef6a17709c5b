// Command listen measures what shaper makes of an upstream's answers
// (issue 9), as a user runs it: real `shaper work` processes built from
// this tree drain a deep backlog into the fake upstream of package
// fakeupstream, served in this process and enforcing a limit of its own.
// Three sections:
//
//   - table: each upstream style (plain, stripe, openai, ietf, and the
//     meter algorithm where the fake has it) × each counting algorithm
//     (sliding_log, fixed_window, token_bucket), shaper configured at
//     exactly the upstream's limit: the share of the limit received and
//     the 429s;
//   - adaptive: an upstream with a hidden limit answering bare 429s,
//     shaper configured with an adaptive limit well above it: the rate
//     delivered per 5 s;
//   - settle: jobs that estimate ten times the tokens they use, against an
//     upstream's token limit, with and without settling the cost from the
//     answer's usage.total_tokens: jobs per second.
//
// It prints markdown tables, the machine and its load, and the exact
// command.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/shaperhq/shaper/bench/internal/fleet"
)

func main() {
	fleet.ServeChild()
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "listen:", err)
		os.Exit(1)
	}
}
