package queue_test

import (
	"context"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// A producer stores jobs for the upstream "stripe"; workers (package
// dispatcher) drain them later, at the upstream's limit. A repeated
// idempotency key finds the first job instead of storing a second.
func Example() {
	// miniredis stands in for Redis so that the example runs anywhere; any
	// go-redis client (Client, ClusterClient) to a real Redis works the same.
	mr, err := miniredis.Run()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	q, err := queue.New(rdb, queue.Config{Upstreams: []shaper.Upstream{
		{Name: "stripe", Limits: []leaky.Limit{leaky.PerSecond(1000)}, MaxPending: 1000, Retry: shaper.Retry{MaxAttempts: 5}},
	}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer q.Close()

	ctx := context.Background()
	for range 2 {
		info, created, err := q.Enqueue(ctx, &queue.Job{
			Tenant: "acme", Upstream: "stripe", Method: "POST", Path: "/v1/refunds",
			Body: []byte("charge=ch_1"), IdempotencyKey: "refund-42",
		})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(info.ID == queue.IdempotentID("acme", "stripe", "default", "refund-42"), info.State, "created:", created)
	}
	counts, err := q.Counts(ctx, "stripe")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("backlog:", counts["default"].Backlog())
	// Output:
	// true queued created: true
	// true queued created: false
	// backlog: 1
}

// An operator lists an upstream's cancelled jobs and sends one back to the
// queue: same ID and idempotency key, fresh attempts.
func ExampleQueue_Retry() {
	mr, err := miniredis.Run()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	q, err := queue.New(rdb, queue.Config{Upstreams: []shaper.Upstream{{Name: "stripe", Limits: []leaky.Limit{leaky.PerSecond(1000)}}}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer q.Close()

	ctx := context.Background()
	info, _, err := q.Enqueue(ctx, &queue.Job{Tenant: "acme", Upstream: "stripe", Path: "/v1/refunds", IdempotencyKey: "refund-42"})
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := q.Cancel(ctx, info.ID, "acme"); err != nil {
		fmt.Println(err)
		return
	}
	page, err := q.List(ctx, queue.ListOptions{Upstream: "stripe", Tenant: "acme", State: queue.StateCancelled})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, j := range page.Jobs {
		again, err := q.Retry(ctx, j.ID, "acme")
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(again.ID == info.ID, again.IdempotencyKey, again.State, again.Attempts, again.Retries)
	}
	// Output:
	// true refund-42 queued 0 1
}
