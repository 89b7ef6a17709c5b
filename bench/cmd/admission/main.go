// Command admission measures admission decisions per second of shaper's
// token bucket against github.com/go-redis/redis_rate/v10 on a redis-server
// it starts itself, at several numbers of concurrent callers over one hot
// key and over many keys, and the Redis memory an idle bucket costs. It
// prints a markdown table of medians over several alternating rounds.
package main

import (
	"context"
	"fmt"
	"os"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "admission:", err)
		os.Exit(1)
	}
}
