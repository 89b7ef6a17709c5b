// Command overrides measures the Redis memory that operators' partition
// overrides cost (PUT /v1/upstreams/{name}/partitions/{partition}/limits):
// on a redis-server it starts itself, it gives -n partitions limits of
// their own through leaky.Bucket.PutPartitionLimits and divides the growth
// of INFO's used_memory by -n. It also times the take's lookup of one
// override (one HGET of the overrides hash, whatever their number). It
// prints a markdown table.
package main

import (
	"context"
	"fmt"
	"os"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "overrides:", err)
		os.Exit(1)
	}
}
