// Command enqueue measures how fast producers can put jobs into shaper
// through its HTTP API — `POST /v1/jobs` one job per request, and
// `POST /v1/jobs/batch` — with admission on, against one or more real
// `shaper serve` processes built from this tree, beside asynq's own
// Client.Enqueue on the same redis-server (which it starts itself) in the
// same run. It alternates the contenders over several rounds and prints
// medians, ratios, and what one job costs in Redis commands and CPU.
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
		fmt.Fprintln(os.Stderr, "enqueue:", err)
		os.Exit(1)
	}
}
