// Command pacing measures how strictly sends are paced to an upstream's
// limit by shaper's leaky bucket, shared through Redis by 1 or more replica
// processes, beside the naive way: each replica with its own
// golang.org/x/time/rate limiter at the full rate. Replicas are this same
// binary started again as child processes; each records the wall-clock time
// of every send, and the parent judges the merged sends as an upstream on
// this host would see them: achieved rate, the most sends in any window,
// gaps and lateness. It prints a markdown table, with medians when run for
// several rounds.
package main

import (
	"context"
	"fmt"
	"os"
)

func main() {
	ctx := context.Background()
	if os.Getenv(replicaEnv) != "" {
		if err := runReplica(ctx, os.Args[1:], os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "pacing replica:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "pacing:", err)
		os.Exit(1)
	}
}
