// Command dispatch measures shaper's dispatch as a user runs it: real
// `shaper work` processes built from this tree draining a deep backlog into
// the fake upstream of package fakeupstream, on a redis-server it starts
// itself. Three sections:
//
//   - pacing: how exactly the upstream's limit is kept at several rates with
//     one and several replicas (achieved rate, most requests in any window,
//     spacing);
//   - ceiling: jobs per second with a no-op upstream and a limit too high to
//     matter, beside asynq's own no-op drain rate on the same Redis in the
//     same run, BullMQ's (node workers from bench/node, when node and npm
//     are there), and shaper's dispatcher with an in-process Go handler
//     (no HTTP), with Redis commands and CPU per job for each;
//   - pickup: how long a job enqueued on an idle upstream takes to reach it.
//
// It prints markdown tables and the exact command. Replicas that are not
// `shaper work` (asynq servers, the Go-handler dispatcher) are children of
// this executable, so every contender drains from its own processes.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/shaperhq/shaper/bench/internal/fleet"
)

func main() {
	fleet.ServeChild()
	if role := os.Getenv(fleet.EnvRole); role != "" {
		if err := runChild(role); err != nil {
			fmt.Fprintf(os.Stderr, "dispatch child %s: %v\n", role, err)
			os.Exit(1)
		}
		return
	}
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "dispatch:", err)
		os.Exit(1)
	}
}
