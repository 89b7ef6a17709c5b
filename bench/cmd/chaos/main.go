// Command chaos states what shaper loses and repeats when its processes
// crash: it puts N jobs through a real `shaper serve` into a real
// redis-server (append-only file, fsync every second), drains them with
// four `shaper work` processes into the fake upstream of
// examples/thirdparty held at its limit, kills a worker with SIGKILL every
// few seconds (and starts it again), crashes Redis once with SIGKILL and
// restarts it on its file, and then counts: jobs accepted, delivered, lost
// (and in what state each lost one was left), delivered twice, the worst
// window the upstream saw against its limit, and how long the stragglers
// of the killed workers took to come back.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// Ctrl-C or SIGTERM ends the run early; run still kills every child.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(1)
	}
}
