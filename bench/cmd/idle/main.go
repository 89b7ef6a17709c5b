// Command idle measures what an idle fleet costs Redis: nothing is queued,
// yet every `shaper work` replica runs one asynq server per upstream (and
// lane), each polling its queue every work.poll_interval (10 ms). It starts
// its own redis-server, builds shaper from this tree, and for each number
// of configured upstreams and of replicas starts the replicas, lets them
// settle, and counts the commands Redis serves per second over a window,
// with Redis's CPU and the replicas' CPU and memory. Beside shaper it runs
// plain asynq servers, one per queue, in child processes of this executable
// (one per replica), at asynq's default polling and at shaper's 10 ms, so
// that the figure can be read against what asynq alone costs.
//
// This is the "before" figure of issue 8 (idle must cost nothing per
// upstream); it prints a markdown table, the machine it ran on and the
// exact command.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/shaperhq/shaper/bench/internal/fleet"
)

func main() {
	if os.Getenv(fleet.EnvRole) == roleAsynq {
		if err := runAsynqChild(); err != nil {
			fmt.Fprintln(os.Stderr, "idle asynq child:", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "idle:", err)
		os.Exit(1)
	}
}
