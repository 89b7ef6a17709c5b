package httplimit_test

import (
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/httplimit"
	"github.com/shaperhq/shaper/tokenbucket"
)

// Admission for an enqueue endpoint: a bucket of 2 per API key refilled at
// one per second, behind a load balancer on 10.0.0.0/8, failing open when
// Redis is down.
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: httplimit.RedisAddr()})
	defer rdb.Close()

	limit := tokenbucket.PerSecond(1, 2)
	lim, err := tokenbucket.New(rdb, limit, tokenbucket.Config{Prefix: "example-http"})
	if err != nil {
		panic(err)
	}
	mw, err := httplimit.New(lim, httplimit.Config{
		Policy:         httplimit.Policy{Name: "enqueue", Quota: limit.Capacity, Window: limit.Window()},
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		OnRedisError:   shaper.FailOpen,
	})
	if err != nil {
		panic(err)
	}
	api := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted)
	}))

	srv := httptest.NewServer(api)
	defer srv.Close()
	apiKey := rand.Text() // a new customer's key, with a full bucket
	for i := 0; i < 3; i++ {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/jobs", nil)
		req.Header.Set("Authorization", "Bearer "+apiKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("RateLimit"), resp.Header.Get("Retry-After") != "")
	}
	// Output:
	// 202 "enqueue";r=1;t=1 false
	// 202 "enqueue";r=0;t=2 false
	// 429 "enqueue";r=0;t=2 true
}

// A server that charges several units itself (a batch endpoint) writes the
// same headers with WriteHeaders and refuses with WriteTooManyRequests.
func ExampleWriteTooManyRequests() {
	policy := httplimit.Policy{Name: "enqueue", Quota: 10, Window: 10e9}
	res := shaper.Result{Allowed: false, Limit: 10, Remaining: 2, RetryAfter: 1500e6, ResetAfter: 8e9}
	w := httptest.NewRecorder()
	httplimit.WriteTooManyRequests(w, policy, res)
	fmt.Println(w.Code, w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit"), w.Header().Get("Retry-After"))
	fmt.Print(w.Body.String())
	// Output:
	// 429 "enqueue";q=10;w=10 "enqueue";r=2;t=8 2
	// {"type":"https://shaperhq.github.io/problems/rate-limited","title":"Rate limit exceeded","status":429,"detail":"Rate limit \"enqueue\" exceeded; retry in 2 seconds.","retry_after":2}
}
