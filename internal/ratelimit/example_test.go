package ratelimit_test

import (
	"fmt"
	"net/http"
	"time"

	"github.com/shaperhq/shaper/internal/ratelimit"
)

// An upstream at its limit: nothing is left, but the next request frees in
// a fortieth of the reset, not at the reset itself.
func ExampleRead() {
	h := http.Header{}
	h.Set("RateLimit-Policy", `"default";q=40;w=1`)
	h.Set("RateLimit", `"default";r=0;t=1`)
	h.Set("X-Ratelimit-Limit-Tokens", "150000")
	h.Set("X-Ratelimit-Remaining-Tokens", "149984")
	h.Set("X-Ratelimit-Reset-Tokens", "6m0s")

	r := ratelimit.Read(h, time.Now())
	for _, q := range r.Quotas {
		fmt.Println(q)
	}
	for _, p := range r.RequestPolicies() {
		fmt.Println("stated:", p)
	}
	if q, ok := r.Exhausted(); ok {
		fmt.Println("spent:", q.Name, "next unit in", q.NextUnit())
	}
	// Output:
	// "default" 0/40 requests left, resets in 1s
	// "tokens" 149984/150000 tokens left, resets in 6m0s
	// stated: "default" 40 requests per 1s
	// spent: default next unit in 25ms
}
