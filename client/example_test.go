package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/shaperhq/shaper/client"
)

// A producer hands shaper a call to Stripe and waits for Stripe's answer.
// (newFake stands in for `shaper serve` and its workers.)
func Example() {
	srv := newFake()
	defer srv.Close()
	srv.setStates("active", "succeeded")

	c, err := client.New(srv.URL(), "sk_producer")
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	job, err := c.Enqueue(ctx, client.JobRequest{
		Upstream:       "stripe",
		Method:         "POST",
		Path:           "/v1/charges",
		Headers:        map[string]string{"Content-Type": "application/x-www-form-urlencoded"},
		Body:           []byte("amount=100&currency=eur"),
		IdempotencyKey: "order-42",
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(job.ID, job.State)

	done, err := c.Wait(ctx, job.ID)
	if err != nil {
		panic(err)
	}
	fmt.Println(done.State, done.Attempts, done.Response.Status, string(done.Response.Body))
	// Output:
	// stripe.default.j1 queued
	// succeeded 1 200 amount=100&currency=eur
}

// Refusals are *client.Error values: errors.Is tells what to do, errors.As
// gives the details, such as how long to wait.
func ExampleError() {
	srv := newFake()
	defer srv.Close()
	srv.setTokens("sk_producer", 1) // admission lets one more enqueue through

	c, err := client.New(srv.URL(), "sk_producer")
	if err != nil {
		panic(err)
	}
	for i := range 2 {
		_, err := c.Enqueue(context.Background(), client.JobRequest{Upstream: "stripe"})
		var apiErr *client.Error
		switch {
		case err == nil:
			fmt.Println(i, "accepted")
		case errors.Is(err, client.ErrRateLimited) && errors.As(err, &apiErr):
			fmt.Println(i, "rate limited, retry in", apiErr.RetryAfter, "-", apiErr.RateLimit)
		default:
			fmt.Println(i, err)
		}
	}
	// Output:
	// 0 accepted
	// 1 rate limited, retry in 1s - "enqueue" 0/10 left, full in 2s
}

// With WithRetry the client waits out 429 and 503 refusals by itself, and
// gives the job an idempotency key so a retry can never enqueue it twice.
func ExampleWithRetry() {
	srv := newFake()
	defer srv.Close()
	srv.answer(rateLimited(0), backlogFull(0)) // two refusals, each "retry now"

	c, err := client.New(srv.URL(), "sk_producer", client.WithRetry(3), client.WithMaxRetryWait(30*time.Second))
	if err != nil {
		panic(err)
	}
	job, err := c.Enqueue(context.Background(), client.JobRequest{Upstream: "stripe"})
	if err != nil {
		panic(err)
	}
	fmt.Println(job.State, "after", len(srv.log()), "requests; key made up:", strings.HasPrefix(job.IdempotencyKey, "shaper-client-"))
	// Output:
	// queued after 3 requests; key made up: true
}

// A batch is admitted as a whole, then each job stands or falls on its own.
func ExampleClient_EnqueueBatch() {
	srv := newFake()
	defer srv.Close()

	c, err := client.New(srv.URL(), "sk_producer")
	if err != nil {
		panic(err)
	}
	results, err := c.EnqueueBatch(context.Background(), []client.JobRequest{
		{Upstream: "openai", Path: "/v1/embeddings", Body: []byte(`{"input":"hello"}`), Cost: map[string]int64{"tokens": 3}},
		{Upstream: "openai", Path: "https://elsewhere.example/v1/embeddings"},
		{Upstream: "smtp"},
	})
	if err != nil {
		panic(err)
	}
	for _, r := range results {
		if r.Err != nil {
			fmt.Println(r.Index, "refused:", r.Err, errors.Is(r.Err, client.ErrInvalid))
			continue
		}
		fmt.Println(r.Index, "accepted:", r.Job.ID)
	}
	// Output:
	// 0 accepted: openai.default.j1
	// 1 refused: 400 Invalid request: 1 field is invalid (path: must be relative to the upstream's base URL) true
	// 2 refused: 404 Not found: unknown upstream "smtp" false
}

// An operator reads an upstream's limits and backlog.
func ExampleClient_Upstream() {
	srv := newFake()
	defer srv.Close()

	c, err := client.New(srv.URL(), "sk_producer")
	if err != nil {
		panic(err)
	}
	st, err := c.Upstream(context.Background(), "stripe")
	if err != nil {
		panic(err)
	}
	for _, l := range st.Limits {
		fmt.Println(l)
	}
	fmt.Printf("draining %.1f/s, %d waiting, %d in flight\n", st.DrainRate.Last10s, st.Backlog.Total, st.InFlight)
	// Output:
	// 100 req/s
	// 800000 tokens/min
	// draining 98.2/s, 0 waiting, 3 in flight
}

// Pausing holds every worker off an upstream, for a while or until resumed;
// it takes an admin key.
func ExampleClient_Pause() {
	srv := newFake()
	defer srv.Close()

	c, err := client.New(srv.URL(), "sk_admin")
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	st, err := c.Pause(ctx, "stripe", 10*time.Minute)
	if err != nil {
		panic(err)
	}
	fmt.Println(st.Paused(time.Now()), st.PauseReason)
	if st, err = c.Resume(ctx, "stripe"); err != nil {
		panic(err)
	}
	fmt.Println(st.Paused(time.Now()))
	// Output:
	// true paused by operator
	// false
}

// An operator finds the dead jobs of an upstream, page by page, and sends
// them back to the queue with fresh attempts.
func ExampleClient_ListJobs() {
	srv := newFake()
	defer srv.Close()
	srv.setStates("dead")

	c, err := client.New(srv.URL(), "sk_producer")
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for range 3 {
		job, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe", Path: "/v1/refunds"})
		if err != nil {
			panic(err)
		}
		c.Get(ctx, job.ID) // the fake's workers move it along
	}
	opts := client.ListJobsOptions{Upstream: "stripe", State: client.StateDead, Limit: 2}
	for {
		page, err := c.ListJobs(ctx, opts)
		if err != nil {
			panic(err)
		}
		for _, j := range page.Jobs {
			again, err := c.RetryJob(ctx, j.ID)
			if err != nil {
				panic(err)
			}
			fmt.Println(again.ID, again.State, again.Attempts, again.Retries)
		}
		if page.NextCursor == "" {
			break
		}
		opts.Cursor = page.NextCursor
	}
	// Output:
	// stripe.default.j3 queued 0 1
	// stripe.default.j2 queued 0 1
	// stripe.default.j1 queued 0 1
}
