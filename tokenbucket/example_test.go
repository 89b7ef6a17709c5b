package tokenbucket_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/tokenbucket"
)

// redisAddr is where the test suite's Redis listens.
func redisAddr() string { return tokenbucket.RedisAddr() }

// A bucket of 3 tokens refilled at one per second: an idle key may burst 3
// requests, then one per second.
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer rdb.Close()

	lim, err := tokenbucket.New(rdb, tokenbucket.PerSecond(1, 3), tokenbucket.Config{Prefix: "example"})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	customer := "customer-" + rand.Text() // a new customer, with a full bucket
	for i := 0; i < 4; i++ {
		res, err := lim.Allow(ctx, customer, 1)
		if err != nil {
			panic(err)
		}
		fmt.Println(res.Allowed, res.Remaining)
	}
	// Output:
	// true 2
	// true 1
	// true 0
	// false 0
}

// Admission should not take the API down with Redis: wrap the limiter in a
// shaper.Fallible that falls back to an in-process bucket per replica.
func Example_failurePolicy() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer rdb.Close()

	limit := tokenbucket.PerSecond(10, 100)
	lim, err := tokenbucket.New(rdb, limit, tokenbucket.Config{Prefix: "example-policy"})
	if err != nil {
		panic(err)
	}
	admission := &shaper.Fallible{
		Limiter: lim,
		Policy:  shaper.FailLocal,
		Local:   tokenbucket.NewLocal(limit, nil),
		Name:    "admission",
	}
	res, err := admission.Allow(context.Background(), "customer-"+rand.Text(), 5)
	fmt.Println(res.Allowed, res.Remaining, err)
	// Output: true 95 <nil>
}

// Local is the same bucket in process memory, with time passed in.
func ExampleLocal() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	loc := tokenbucket.NewLocal(tokenbucket.PerSecond(2, 2), func() time.Time { return now })
	ctx := context.Background()
	for _, advance := range []time.Duration{0, 0, 0, 500 * time.Millisecond} {
		now = now.Add(advance)
		res, _ := loc.Allow(ctx, "k", 1)
		fmt.Println(res)
	}
	// Output:
	// allowed (1/2 left, reset in 500ms)
	// allowed (0/2 left, reset in 1s)
	// denied (0/2 left, retry in 500ms, reset in 1s)
	// allowed (0/2 left, reset in 1s)
}

func ExampleLimit_String() {
	fmt.Println(tokenbucket.PerSecond(10, 100))
	fmt.Println(tokenbucket.PerSecond(10, 100).Window())
	// Output:
	// 10/s refill, capacity 100
	// 10s
}
