// Command soak runs shaper for a long stretch at a steady rate, as a user
// runs it (issue 12): one `shaper serve` and several `shaper work` processes
// built from this tree, its own redis-server (noeviction), and the fake
// upstream of package fakeupstream served in this process, enforcing the
// same limit shaper is configured with. A producer enqueues jobs through
// `POST /v1/jobs` at a fixed rate, open loop, each with an idempotency key
// and a ~100-byte body; the upstream answers ~50 bytes, which finished jobs
// keep. Finished jobs and their idempotency records are bounded by short
// retentions, so Redis's memory must reach a plateau within minutes and
// stay there.
//
// Every -sample it records Redis's used_memory and RSS, its key count, the
// RSS of serve and of each worker, the jobs enqueued, admitted by the
// upstream and refused by it (429), and the backlog. At the end it prints
// the samples as a markdown table, a summary, the machine and the exact
// command. It exits non-zero if the upstream answered any 429 or the drain
// fell behind the producer.
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
	fleet.ServeChild()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	failed, err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
	if failed {
		os.Exit(1)
	}
}
