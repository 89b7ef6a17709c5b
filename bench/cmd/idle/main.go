// Command idle measures what an idle fleet costs Redis: nothing is queued.
// It starts its own redis-server, builds shaper from this tree, and for
// each number of configured upstreams and of replicas starts R `shaper
// work` replicas and one `shaper serve`, waits until every replica listens
// for wake-ups and every upstream has been looked at and left asleep, lets
// them settle, and counts the commands Redis serves per second over a
// minute (a whole number of its periodic calls: the one look per idle
// upstream per work.poll_interval that bounds a lost wake-up, and the
// dead-job trimmer's one call per upstream a minute), with Redis's CPU, the replicas' CPU and memory,
// and how long the replicas take to exit after SIGTERM. Beside shaper it
// runs plain asynq servers, one per queue, in child processes of this
// executable (one per replica), at asynq's default polling and at the 10 ms
// shaper used before issue 8, so that the figure can be read against what
// asynq alone costs.
//
// It prints a markdown table, the machine it ran on and the exact command.
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
