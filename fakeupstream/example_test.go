package fakeupstream_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/shaperhq/shaper/fakeupstream"
)

// A Stripe-like upstream that allows 2 requests per second per API key.
// Three requests at one instant: the third is refused the way Stripe
// refuses it, and the report counts the violation.
func Example() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	upstream, err := fakeupstream.New(fakeupstream.Config{
		Rate:  2,
		Per:   time.Second,
		Style: fakeupstream.StyleStripe,
		Now:   func() time.Time { return now }, // a still clock keeps the example exact
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := httptest.NewServer(upstream)
	defer srv.Close()

	for i := range 3 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", nil)
		req.Header.Set("Authorization", "Bearer sk_test_123")
		req.Header.Set("Idempotency-Key", fmt.Sprint("charge-", i))
		resp, err := srv.Client().Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		if reason := resp.Header.Get("Stripe-Rate-Limited-Reason"); reason != "" {
			fmt.Println(resp.StatusCode, reason)
		} else {
			fmt.Println(resp.StatusCode)
		}
	}
	rep := upstream.Report()
	fmt.Printf("%d requests, %d rejected, at most %d in any %v\n", rep.Total, rep.Rejected, rep.MaxInWindow, rep.Window)
	// Output:
	// 200
	// 200
	// 429 global-rate
	// 3 requests, 1 rejected, at most 3 in any 1s
}

// Judging a run of send times against "at most 3 per second".
func ExampleMaxInWindow() {
	ms := func(v int) time.Duration { return time.Duration(v) * time.Millisecond }
	sends := []time.Duration{ms(0), ms(400), ms(900), ms(1000), ms(1300)}
	fmt.Println(fakeupstream.MaxInWindow(sends, time.Second)) // (300ms, 1300ms] holds four
	fmt.Println(fakeupstream.GapPercentiles(sends).P50)       // gaps 100, 300, 400, 500ms
	// Output:
	// 4
	// 300ms
}

// An upstream that states its limits in the IETF draft's structured
// fields: 3 requests and 2,000 tokens per second per API key. The second
// request declares 400 tokens but says it used 40, and is charged 40.
func Example_ietf() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	upstream, err := fakeupstream.New(fakeupstream.Config{
		Rate:      3,
		CostLimit: &fakeupstream.CostLimit{Rate: 2000, Per: time.Second},
		Style:     fakeupstream.StyleIETF,
		Now:       func() time.Time { return now },
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := httptest.NewServer(upstream)
	defer srv.Close()

	for i, used := range []string{"", "40", "", ""} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/completions", nil)
		req.Header.Set("Authorization", "Bearer sk_test_123")
		req.Header.Set("X-Cost-Tokens", "400")
		if used != "" {
			req.Header.Set(fakeupstream.UsageHeader, used)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		if i == 0 {
			fmt.Println("RateLimit-Policy:", resp.Header.Get("RateLimit-Policy"))
		}
		line := fmt.Sprint(resp.StatusCode, " RateLimit: ", resp.Header.Get("RateLimit"))
		if ra := resp.Header.Get("Retry-After"); ra != "" {
			line += " Retry-After: " + ra
		}
		fmt.Println(line)
	}
	// Output:
	// RateLimit-Policy: "default";q=3;w=1, "tokens";q=2000;w=1;qu="tokens"
	// 200 RateLimit: "default";r=2;t=1, "tokens";r=1600;t=1
	// 200 RateLimit: "default";r=1;t=1, "tokens";r=1560;t=1
	// 200 RateLimit: "default";r=0;t=1, "tokens";r=1160;t=1
	// 429 RateLimit: "default";r=0;t=1, "tokens";r=1160;t=1 Retry-After: 1
}
