package window

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

func ExampleNewSlidingWindow() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()

	// A clock the example moves by hand; leave Config.Now unset to use
	// Redis's own, as every replica then shares it.
	start := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	now := start
	lim, err := NewSlidingWindow(rdb, PerSecond(2), Config{Now: func() time.Time { return now }})
	if err != nil {
		fmt.Println(err)
		return
	}
	// The example shares its Redis with the package's tests.
	if err := lim.Reset(ctx, "customer-42"); err != nil {
		fmt.Println(err)
		return
	}

	fmt.Println(lim.Limit())
	for _, at := range []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond, 1500 * time.Millisecond} {
		now = start.Add(at)
		res, err := lim.Allow(ctx, "customer-42", 1)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("at %v: %v\n", at, res)
	}
	// Output:
	// 2 per 1s
	// at 0s: allowed (1/2 left, reset in 2s)
	// at 100ms: allowed (0/2 left, reset in 1.9s)
	// at 200ms: denied (0/2 left, retry in 1.3s, reset in 1.8s)
	// at 1.5s: allowed (0/2 left, reset in 1.5s)
}

func ExampleLimit_Validate() {
	fmt.Println(PerMinute(600).Validate())
	fmt.Println(Limit{Rate: 100}.Validate())
	// Output:
	// <nil>
	// per 0s: must be at least 1ms
}
