package dispatcher

import (
	"net/http"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/queue"
)

// storedResponseHeaders are the patterns (see shaper.MatchHeader) of the
// response headers kept with a job: what a producer needs to read the
// answer and follow it up (content type, rate-limit state, the upstream's
// request id for a support ticket). Anything else, Set-Cookie above all,
// is dropped before the answer reaches Redis; the dispatcher still reads
// every header to classify the answer.
var storedResponseHeaders = []string{
	"Content-Type",
	"Retry-After",
	"RateLimit*",
	"X-RateLimit-*",
	"Stripe-Rate-Limited-Reason",
	"X-Request-Id",
	"Request-Id",
	"Openai-Request-Id",
	"X-Amzn-RequestId",
	"X-Amz-Request-Id",
}

// stored is what of an answer is kept with its job. A Go handler's headers
// are the handler's own choice, so only an HTTP answer's are filtered.
func (u *upstream) stored(resp *queue.Response) *queue.Response {
	out := &queue.Response{Status: resp.Status}
	if u.cfg.StoreResponse == shaper.StoreStatus {
		return out
	}
	for name, values := range resp.Headers {
		if u.base != nil && !storedHeader(name) {
			continue
		}
		if out.Headers == nil {
			out.Headers = map[string][]string{}
		}
		out.Headers[name] = values
	}
	if u.cfg.StoreResponse == shaper.StoreHeaders {
		return out
	}
	out.Body, out.Truncated = resp.Body, resp.Truncated
	return out
}

func storedHeader(name string) bool {
	if http.CanonicalHeaderKey(name) == "Set-Cookie" {
		return false
	}
	for _, p := range storedResponseHeaders {
		if shaper.MatchHeader(p, name) {
			return true
		}
	}
	return false
}
