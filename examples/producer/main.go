// Command producer enqueues jobs through shaper's API the way a backend
// would: with an idempotency key per business operation (so a retried
// request cannot create a second job), automatic retry of 429 and 503 that
// honours Retry-After, and a batch for bulk work. Then it waits for one job.
//
//	shaper dev --api-key devkey &
//	go run ./examples/producer -api http://localhost:8080 -key devkey -upstream demo
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/shaperhq/shaper/client"
)

func main() {
	api := flag.String("api", "http://localhost:8080", "shaper API URL")
	key := flag.String("key", os.Getenv("SHAPER_API_KEY"), "API key (default $SHAPER_API_KEY)")
	upstream := flag.String("upstream", "demo", "upstream to call")
	n := flag.Int("n", 20, "jobs in the batch")
	flag.Parse()
	if err := run(*api, *key, *upstream, *n); err != nil {
		fmt.Fprintln(os.Stderr, "producer:", err)
		os.Exit(1)
	}
}

func run(api, key, upstream string, n int) error {
	c, err := client.New(api, key, client.WithRetry(5), client.WithMaxRetryWait(30*time.Second))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// One job per order: the idempotency key makes a resend harmless.
	job, err := c.Enqueue(ctx, client.JobRequest{
		Upstream:       upstream,
		Method:         "POST",
		Path:           "/v1/orders/1001/confirm",
		Headers:        map[string]string{"Content-Type": "application/json"},
		Body:           []byte(`{"notify": true}`),
		IdempotencyKey: "order-1001-confirm",
	})
	switch {
	case errors.Is(err, client.ErrRateLimited):
		return fmt.Errorf("still rate limited after retrying: %w", err)
	case errors.Is(err, client.ErrBacklogFull):
		return fmt.Errorf("the upstream's backlog is full; try later: %w", err)
	case err != nil:
		return err
	}
	fmt.Printf("enqueued %s (%s)\n", job.ID, job.State)

	// Bulk work goes in one request; admission charges one token per job.
	var reqs []client.JobRequest
	for i := 0; i < n; i++ {
		reqs = append(reqs, client.JobRequest{Upstream: upstream, Path: fmt.Sprintf("/v1/reports/%d", i)})
	}
	results, err := c.EnqueueBatch(ctx, reqs)
	if err != nil {
		return err
	}
	accepted := 0
	for _, r := range results {
		if r.Err == nil {
			accepted++
		} else {
			fmt.Printf("job %d refused: %v\n", r.Index, r.Err)
		}
	}
	fmt.Printf("batch: %d of %d accepted\n", accepted, len(results))

	done, err := c.Wait(ctx, job.ID)
	if err != nil {
		return err
	}
	fmt.Printf("%s %s after %d attempt(s)", done.ID, done.State, done.Attempts)
	if done.Response != nil {
		fmt.Printf("; the upstream answered %d: %s", done.Response.Status, done.Response.Body)
	}
	fmt.Println()
	return nil
}
