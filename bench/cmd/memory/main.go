// Command memory measures the Redis memory an idle key costs for each of
// shaper's limiters, and for github.com/go-redis/redis_rate/v10 beside them:
// on a redis-server it starts itself, it creates many keys with each limiter
// in turn (flushing in between) and divides the growth of INFO's
// used_memory by the number of keys. It prints a markdown table.
package main

import (
	"context"
	"fmt"
	"os"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "memory:", err)
		os.Exit(1)
	}
}
