package dispatcher

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/shaperhq/shaper/internal/wire"
)

// kind is what to do with a job after an attempt.
type kind int

const (
	kindDone     kind = iota // finished: keep the response
	kindRetry                // failed, may succeed later: back off, spend an attempt
	kindDead                 // failed for good
	kindPushback             // the upstream is saturated: wait, spend no attempt
)

// verdict is the reading of one upstream answer.
type verdict struct {
	kind kind
	// block, when positive, pauses the whole upstream for every replica.
	block       time.Duration
	blockReason string
	// wait is the least delay before this job's next attempt.
	wait   time.Duration
	reason string
}

// classify reads an upstream's HTTP answer. Quota headers that say the
// upstream has nothing left block it until their reset even on success;
// a 429 blocks it (or, for Stripe's endpoint-scoped reasons, only delays
// the job) until the time the headers give, else for fallback.
func classify(status int, h http.Header, now time.Time, fallback time.Duration) verdict {
	exhausted, reset := quotaExhausted(h, now)
	switch {
	case status >= 200 && status < 300:
		v := verdict{kind: kindDone}
		if exhausted {
			v.block, v.blockReason = reset, "quota_exhausted"
		}
		return v
	case status == http.StatusTooManyRequests:
		wait := retryAfter(h, now)
		if wait <= 0 && reset > 0 {
			wait = reset
		}
		if wait <= 0 {
			wait = fallback
		}
		v := verdict{kind: kindPushback, wait: wait, reason: "429 from upstream"}
		reason := strings.ToLower(strings.TrimSpace(h.Get("Stripe-Rate-Limited-Reason")))
		if reason != "" {
			v.reason += " (" + reason + ")"
		}
		// Stripe's endpoint-* and resource-specific limits concern one
		// endpoint or object; the rest of the upstream may go on.
		if !strings.HasPrefix(reason, "endpoint-") && reason != "resource-specific" {
			v.block, v.blockReason = wait, "429"
		}
		return v
	case status == http.StatusRequestTimeout, status == http.StatusTooEarly, status >= 500:
		return verdict{kind: kindRetry, wait: retryAfter(h, now), reason: "upstream answered " + strconv.Itoa(status)}
	case status >= 300 && status < 400:
		return verdict{kind: kindDead, reason: "upstream answered " + strconv.Itoa(status) + " (redirects are not followed)"}
	default:
		return verdict{kind: kindDead, reason: "upstream answered " + strconv.Itoa(status)}
	}
}

// retryAfter reads Retry-After by the rules shaper's API and client share;
// zero when there is none.
func retryAfter(h http.Header, now time.Time) time.Duration {
	d, _ := wire.ParseRetryAfter(h.Get("Retry-After"), now)
	return d
}

// quotaExhausted reports whether remaining-quota headers say nothing is
// left, and until when. It understands OpenAI's x-ratelimit-remaining-*
// with x-ratelimit-reset-* in Go duration form ("1s", "6m0s", "12ms"), and
// the common X-RateLimit-Remaining / X-RateLimit-Reset and RateLimit-*
// pairs, whose reset is delta seconds, or a Unix time if it is that large.
func quotaExhausted(h http.Header, now time.Time) (bool, time.Duration) {
	exhausted := false
	var reset time.Duration
	for _, kind := range []string{"requests", "tokens"} {
		rem := h.Get("X-Ratelimit-Remaining-" + kind)
		r := parseResetDuration(h.Get("X-Ratelimit-Reset-"+kind), now)
		if rem == "" {
			continue
		}
		if n, err := strconv.ParseFloat(strings.TrimSpace(rem), 64); err == nil && n <= 0 {
			exhausted = true
			reset = max(reset, r)
		}
	}
	for _, pair := range [][2]string{{"X-Ratelimit-Remaining", "X-Ratelimit-Reset"}, {"Ratelimit-Remaining", "Ratelimit-Reset"}} {
		rem := h.Get(pair[0])
		if rem == "" {
			continue
		}
		if n, err := strconv.ParseFloat(strings.TrimSpace(rem), 64); err == nil && n <= 0 {
			exhausted = true
			reset = max(reset, parseResetDuration(h.Get(pair[1]), now))
		}
	}
	return exhausted, reset
}

// parseResetDuration reads a reset value: a Go duration ("6m0s", "12ms",
// "1.5s"), delta seconds ("30"), or a Unix time in seconds.
func parseResetDuration(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if d, err := time.ParseDuration(v); err == nil {
		return max(d, 0)
	}
	n, err := strconv.ParseFloat(v, 64)
	if err != nil || n <= 0 {
		return 0
	}
	if n > 1e9 {
		return max(time.Unix(0, int64(n*1e9)).Sub(now), 0)
	}
	return time.Duration(n * float64(time.Second))
}

// responseClass is the metric label for an answer.
func responseClass(status int) string {
	switch {
	case status == http.StatusTooManyRequests:
		return "429"
	case status >= 500:
		return "5xx"
	case status >= 400:
		return "4xx"
	case status >= 300:
		return "3xx"
	default:
		return "2xx"
	}
}
