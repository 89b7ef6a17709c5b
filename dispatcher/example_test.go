package dispatcher_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/dispatcher"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// A worker replica draining one upstream at 10 requests per second: it
// takes the job, waits for its send slot in the upstream's shared bucket,
// sends it, and stores the answer on the job. Run as many replicas as you
// like against one Redis; together they keep to the limit.
func Example() {
	// A stand-in for the third-party API.
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s got %q with key %s", r.Method, r.URL.Path, body, r.Header.Get("Idempotency-Key"))
	}))
	defer upstream.Close()
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

	// One description of the upstream serves the queue and the dispatcher.
	api := shaper.Upstream{
		Name: "api", BaseURL: upstream.URL, Limits: []leaky.Limit{leaky.PerSecond(10)},
		Retry: shaper.Retry{MaxAttempts: 3}, ResultRetention: time.Hour, // keep the answer an hour
	}
	q, err := queue.New(rdb, queue.Config{Upstreams: []shaper.Upstream{api}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer q.Close()
	job, _, err := q.Enqueue(ctx, &queue.Job{Upstream: "api", Method: "POST", Path: "/v1/hello", Body: []byte("hi"), IdempotencyKey: "hello-1"})
	if err != nil {
		fmt.Println(err)
		return
	}

	d, err := dispatcher.New(rdb, dispatcher.Config{
		Upstreams: []shaper.Upstream{api},
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	defer func() {
		stop()
		<-done
	}()

	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		info, err := q.Get(ctx, job.ID, "")
		if err != nil {
			fmt.Println(err)
			return
		}
		if info.State == queue.StateSucceeded {
			fmt.Println(info.State, "after", info.Attempts, "attempt:", info.Response.Status, string(info.Response.Body))
			return
		}
	}
	fmt.Println("the job did not finish")
	// Output:
	// succeeded after 1 attempt: 200 POST /v1/hello got "hi" with key hello-1
}
