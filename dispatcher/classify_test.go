package dispatcher

import (
	"net/http"
	"testing"
	"time"

	"github.com/shaperhq/shaper/internal/ratelimit"
	"github.com/shaperhq/shaper/queue"
)

func TestClassify(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Set(kv[i], kv[i+1])
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		status int
		h      http.Header
		want   verdict
	}{
		{"ok", 200, h(), verdict{kind: kindDone}},
		{"created", 201, h(), verdict{kind: kindDone}},
		// At the limit a remaining of 0 is normal: 100 per 1m frees a
		// request every 600ms, sooner than a 1s spacing holds anyway.
		{"ok at the limit, next request frees soon", 200, h("x-ratelimit-limit-requests", "100",
			"x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "1m0s"), verdict{kind: kindDone}},
		// 10 per 1m frees one every 6s: held that long, not the full reset.
		{"ok but the next request frees later than spacing", 200, h("x-ratelimit-limit-requests", "10",
			"x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "1m0s"),
			verdict{kind: kindDone, block: 6 * time.Second, blockReason: "quota_exhausted"}},
		{"ok, no limit given: the reset is all we know", 200, h("x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "6m0s"),
			verdict{kind: kindDone, block: 6 * time.Minute, blockReason: "quota_exhausted"}},
		{"ok with tokens left", 200, h("x-ratelimit-remaining-tokens", "10", "x-ratelimit-reset-tokens", "1s"), verdict{kind: kindDone}},
		{"ok, generic remaining 0, delta reset", 200, h("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "30"),
			verdict{kind: kindDone, block: 30 * time.Second, blockReason: "quota_exhausted"}},
		{"ok, github remaining 0 of 5000, epoch reset", 200, h("X-RateLimit-Limit", "5000", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1795953645"),
			verdict{kind: kindDone}},
		{"ok, ietf draft remaining 0", 200, h("RateLimit-Policy", `"default";q=2;w=10`, "RateLimit", `"default";r=0;t=8`),
			verdict{kind: kindDone, block: 4 * time.Second, blockReason: "quota_exhausted"}},
		{"429 retry-after seconds", 429, h("Retry-After", "7"),
			verdict{kind: kindPushback, wait: 7 * time.Second, block: 7 * time.Second, blockReason: "429", refused: true, reason: "429 from upstream"}},
		{"429 retry-after date", 429, h("Retry-After", now.Add(90*time.Second).Format(http.TimeFormat)),
			verdict{kind: kindPushback, wait: 90 * time.Second, block: 90 * time.Second, blockReason: "429", refused: true, reason: "429 from upstream"}},
		{"429 openai reset in ms", 429, h("x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "12ms"),
			verdict{kind: kindPushback, wait: 12 * time.Millisecond, block: 12 * time.Millisecond, blockReason: "429", refused: true, reason: "429 from upstream"}},
		{"429 openai tokens longer than requests", 429, h("x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "1s",
			"x-ratelimit-remaining-tokens", "0", "x-ratelimit-reset-tokens", "1m30.5s"),
			verdict{kind: kindPushback, wait: 90500 * time.Millisecond, block: 90500 * time.Millisecond, blockReason: "429", refused: true, reason: "429 from upstream"}},
		{"429 github epoch reset", 429, h("X-RateLimit-Limit", "5000", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1795953645"),
			verdict{kind: kindPushback, wait: 45 * time.Second, block: 45 * time.Second, blockReason: "429", refused: true, reason: "429 from upstream"}},
		{"429 ietf draft", 429, h("RateLimit-Policy", `"default";q=40;w=1`, "RateLimit", `"default";r=0;t=1`),
			verdict{kind: kindPushback, wait: time.Second, block: time.Second, blockReason: "429", refused: true, reason: "429 from upstream"}},
		{"ok, a partition's quota at 0 holds nothing", 200, h("RateLimit-Policy", `"endpoint";q=2;w=60;pk=:UE9TVCAvdjE=:`,
			"RateLimit", `"endpoint";r=0;t=50;pk=:UE9TVCAvdjE=:`), verdict{kind: kindDone}},
		{"429 on a partition's quota delays only the job", 429, h("RateLimit-Policy", `"default";q=40;w=1, "endpoint";q=2;w=60;pk=:UE9TVCAvdjE=:`,
			"RateLimit", `"default";r=30;t=1, "endpoint";r=0;t=50;pk=:UE9TVCAvdjE=:`, "Retry-After", "50"),
			verdict{kind: kindPushback, wait: 50 * time.Second, reason: "429 from upstream (endpoint, one partition's quota)"}},
		{"429 bare", 429, h(), verdict{kind: kindPushback, bare: true, refused: true, reason: "429 from upstream"}},
		{"429 stripe global", 429, h("Stripe-Rate-Limited-Reason", "global-rate"),
			verdict{kind: kindPushback, bare: true, refused: true, reason: "429 from upstream (global-rate)"}},
		{"429 stripe global concurrency", 429, h("Stripe-Rate-Limited-Reason", "global-concurrency"),
			verdict{kind: kindPushback, bare: true, refused: true, reason: "429 from upstream (global-concurrency)"}},
		{"429 stripe endpoint only delays the job", 429, h("Stripe-Rate-Limited-Reason", "endpoint-rate"),
			verdict{kind: kindPushback, reason: "429 from upstream (endpoint-rate)"}},
		{"503 with retry-after", 503, h("Retry-After", "3"), verdict{kind: kindRetry, wait: 3 * time.Second, reason: "upstream answered 503"}},
		{"500", 500, h(), verdict{kind: kindRetry, reason: "upstream answered 500"}},
		{"408", 408, h(), verdict{kind: kindRetry, reason: "upstream answered 408"}},
		{"425", 425, h(), verdict{kind: kindRetry, reason: "upstream answered 425"}},
		{"400", 400, h(), verdict{kind: kindDead, reason: "upstream answered 400"}},
		{"404", 404, h(), verdict{kind: kindDead, reason: "upstream answered 404"}},
		{"302", 302, h("Location", "https://elsewhere"), verdict{kind: kindDead, reason: "upstream answered 302 (redirects are not followed)"}},
	} {
		got := classify(tc.status, tc.h, ratelimit.Read(tc.h, now), time.Second)
		if got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestBackoff(t *testing.T) {
	for n := 1; n <= 12; n++ {
		ceiling := min(time.Second<<(n-1), time.Minute)
		for i := 0; i < 50; i++ {
			d := backoff(n, time.Second, time.Minute)
			if d < time.Second || d > ceiling {
				t.Fatalf("backoff(%d) = %v, want within [1s, %v]", n, d, ceiling)
			}
		}
	}
	if d := backoff(1, time.Second, time.Minute); d != time.Second {
		t.Fatalf("first retry: got %v, want the minimum", d)
	}
}

// A hand-back's words are for asynq's tools; its kind and what it waits
// for are fields, which end records as the typed mark.
func TestOutcomeLastError(t *testing.T) {
	now := time.Date(2026, 11, 30, 14, 2, 0, 0, time.UTC)
	for _, tc := range []struct {
		o        outcome
		kind     outcomeKind
		waitsFor string
		want     string
	}{
		{pushedBack(verdict{wait: time.Minute, reason: "429 from upstream", until: now.Add(7250 * time.Millisecond)}, now),
			outHandBack, queue.WaitingPushback, "waiting for pushback: upstream blocked until 2026-11-30T14:02:07.250Z (429 from upstream)"},
		{pushedBack(verdict{wait: time.Second, reason: "429 from upstream (endpoint-rate)"}, now),
			outHandBack, queue.WaitingPushback, "waiting for pushback: job held until 2026-11-30T14:02:01.000Z (429 from upstream (endpoint-rate))"},
		{handBack(time.Second, "sensitive headers unreadable"), outHandBack, "", "waiting: sensitive headers unreadable"},
		{retryAfter(time.Second, "attempt 1 of 3: upstream answered 503"), outRetry, "", "attempt 1 of 3: upstream answered 503"},
		{dead("upstream answered %d", 400), outDead, "", "upstream answered 400"},
		{succeeded(nil), outSucceeded, "", ""},
	} {
		if tc.o.kind != tc.kind || tc.o.waitsFor != tc.waitsFor || tc.o.lastError() != tc.want {
			t.Errorf("got %v waiting for %q, %q; want %v waiting for %q, %q", tc.o.kind, tc.o.waitsFor, tc.o.lastError(), tc.kind, tc.waitsFor, tc.want)
		}
	}
}
