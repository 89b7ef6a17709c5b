package server_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
	"github.com/shaperhq/shaper/server"
	"github.com/shaperhq/shaper/status"
	"github.com/shaperhq/shaper/tokenbucket"
)

// The enqueue API as `shaper serve` builds it: one producer key, one
// upstream, admission of 100 enqueues per key refilled at 20 a second. A
// producer POSTs a job and gets 202 with the job; a job the upstream's
// config cannot take gets 400 with a problem+json body naming the field.
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

	stripe := shaper.Upstream{Name: "stripe", BaseURL: "https://api.stripe.com", Limits: []leaky.Limit{leaky.PerSecond(25)},
		Retry: shaper.Retry{MaxAttempts: 5}}
	q, err := queue.New(rdb, queue.Config{Upstreams: []shaper.Upstream{stripe}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer q.Close()
	st, err := status.NewReader(rdb, q, "")
	if err != nil {
		fmt.Println(err)
		return
	}
	srv, err := server.New(rdb, q, st, server.Config{
		Keys:      []server.Key{{Name: "billing", Tenant: "acme", Secret: "sk_live_example"}},
		Admission: tokenbucket.Limit{Capacity: 100, Refill: 20, Per: time.Second},
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	api := httptest.NewServer(srv.Handler())
	defer api.Close()

	for _, body := range []string{
		`{"upstream": "stripe", "method": "POST", "path": "/v1/refunds", "body": "charge=ch_1", "idempotency_key": "refund-42"}`,
		`{"upstream": "stripe", "method": "POST", "path": "https://elsewhere.example/steal"}`,
	} {
		req, _ := http.NewRequest("POST", api.URL+"/v1/jobs", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer sk_live_example")
		req.Header.Set("Content-Type", "application/json")
		resp, err := api.Client().Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		var answer struct {
			ID, State string
			Errors    []struct{ Field string }
		}
		json.NewDecoder(resp.Body).Decode(&answer)
		resp.Body.Close()
		if resp.StatusCode == http.StatusAccepted {
			fmt.Println(resp.StatusCode, answer.State, answer.ID == queue.IdempotentID("acme", "stripe", "default", "refund-42"))
		} else {
			for _, e := range answer.Errors {
				fmt.Println(resp.StatusCode, resp.Header.Get("Content-Type"), "field:", e.Field)
			}
		}
	}
	// Output:
	// 202 queued true
	// 400 application/problem+json field: path
}
