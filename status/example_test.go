package status_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
	"github.com/shaperhq/shaper/status"
)

// What `shaper status` shows for an upstream with a backlog, and how an
// operator pauses and resumes it for every worker replica.
func Example() {
	// miniredis stands in for Redis so that the example runs anywhere.
	mr, err := miniredis.Run()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	q, err := queue.New(rdb, queue.Config{Upstreams: []shaper.Upstream{{Name: "stripe", Limits: []leaky.Limit{leaky.PerSecond(25)}}}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer q.Close()
	for i := range 3 {
		if _, _, err := q.Enqueue(ctx, &queue.Job{Upstream: "stripe", Path: fmt.Sprint("/v1/charges/", i)}); err != nil {
			fmt.Println(err)
			return
		}
	}
	r, err := status.NewReader(rdb, q, "")
	if err != nil {
		fmt.Println(err)
		return
	}

	show := func() {
		u, err := r.Upstream(ctx, "stripe")
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s: %s, backlog %d, paused %v", u.Name, u.Limits[0].Description, u.Backlog.Total, u.PausedUntil != nil)
		if u.PausedUntil != nil {
			fmt.Printf(" (%s, until resumed: %v)", u.PauseReason, u.UntilResumed(time.Now()))
		}
		fmt.Println()
	}
	show()
	if _, err := r.Pause(ctx, "stripe", 0, "incident 42"); err != nil { // 0: until resumed
		fmt.Println(err)
		return
	}
	show()
	if _, err := r.Resume(ctx, "stripe"); err != nil {
		fmt.Println(err)
		return
	}
	show()
	// Output:
	// stripe: 25 requests per 1s, backlog 3, paused false
	// stripe: 25 requests per 1s, backlog 3, paused true (incident 42, until resumed: true)
	// stripe: 25 requests per 1s, backlog 3, paused false
}
