// Command jobmemory measures what one job costs Redis, in shaper and in
// plain asynq beside it: on a redis-server it starts itself, it stores N
// jobs with each subject in turn (flushing in between, after one job first
// so that the keys every job shares exist already) and divides the growth
// of INFO's used_memory by N. The subjects are a job queued in shaper, the
// same job succeeded and kept with its response, a task pending in asynq
// whose payload is the JSON of the same job, and that task completed and
// kept with a result. Each runs with Redis's default hash-max-listpack-value
// and with 1024, and with two body sizes. It also takes one queued job of
// each apart: the keys and members it adds, and the fields of its task hash.
//
// It prints markdown tables, the machine it ran on and the exact command.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "jobmemory:", err)
		os.Exit(1)
	}
}
