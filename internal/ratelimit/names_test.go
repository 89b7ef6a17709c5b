package ratelimit

import (
	"reflect"
	"testing"
)

// TestReadSkipsOnlyAnswersWithoutLimits: the scan that lets Read skip an
// answer with no rate-limit header never skips one that has any form
// Read knows, whatever the case of its names.
func TestReadSkipsOnlyAnswersWithoutLimits(t *testing.T) {
	forms := [][]string{
		{"Retry-After", "5"},
		{"RateLimit-Policy", `"default";q=100;w=60`, "RateLimit", `"default";r=0;t=30`},
		{"RateLimit-Limit", "100", "RateLimit-Remaining", "0", "RateLimit-Reset", "30"},
		{"x-ratelimit-limit", "100", "x-ratelimit-remaining", "0", "x-ratelimit-reset", "30"},
		{"X-Rate-Limit-Limit", "100", "X-Rate-Limit-Remaining", "0", "X-Rate-Limit-Reset", "30"},
		{"x-ratelimit-remaining-tokens", "0", "x-ratelimit-reset-tokens", "6m0s"},
		{"anthropic-ratelimit-tokens-remaining", "0", "anthropic-ratelimit-tokens-reset", "2023-08-09T14:29:23Z"},
	}
	for _, kv := range forms {
		h := header(append([]string{"Content-Type", "application/json", "Date", "Wed, 09 Aug 2023 14:00:00 GMT"}, kv...)...)
		got, all := Read(h, now), readAll(h, now)
		if reflect.DeepEqual(all, Reading{}) {
			t.Fatalf("%v: reads as nothing even in full; the case is wrong", kv)
		}
		if !reflect.DeepEqual(got, all) {
			t.Errorf("%v: got %+v, want %+v", kv, got, all)
		}
	}
	if !reflect.DeepEqual(Read(header("Content-Type", "application/json", "X-Request-Id", "r1"), now), Reading{}) {
		t.Error("an answer with no rate-limit header reads as something")
	}
}
