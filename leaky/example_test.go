package leaky_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/leaky"
)

// Pacing calls to an API that allows 100 requests per second and 800,000
// tokens per minute: every replica running this shares the same slots.
func ExampleBucket_Take() {
	rdb := redis.NewClient(&redis.Options{Addr: leaky.RedisAddrForExamples()})
	defer rdb.Close()

	bucket, err := leaky.New(rdb, leaky.Config{}).Bucket("openai", leaky.BucketConfig{
		Limits: []leaky.Limit{
			leaky.PerSecond(100),
			{Rate: 800000, Per: time.Minute, Cost: "tokens"},
		},
		Concurrency: 20,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	r, err := bucket.Take(ctx, leaky.Costs{"tokens": 1200})
	if err != nil {
		fmt.Println(err)
		return
	}
	// ... send the request now ...
	defer bucket.Release(ctx, r)
	fmt.Println(bucket.Config().Limits[1])
	// Output: 800000 tokens per 1m0s (burst 200000)
}
