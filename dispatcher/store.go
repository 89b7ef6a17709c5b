package dispatcher

import (
	"net/http"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/queue"
)

// defaultStoredHeaders are the patterns (see shaper.MatchHeader) of the
// response headers kept with a job when the upstream names none
// (store_response_headers): what a producer needs to read the answer and
// follow it up (content type, rate-limit state, the upstream's request id
// for a support ticket). Anything else is dropped before the answer
// reaches Redis; the dispatcher still reads every header to classify the
// answer.
func defaultStoredHeaders() []string {
	return []string{
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
}

// stored is what of an answer is kept with its job. A Go handler's headers
// are the handler's own choice, so only an HTTP answer's are filtered.
func (u *upstream) stored(resp *queue.Response) *queue.Response {
	out := &queue.Response{Status: resp.Status}
	if u.cfg.StoreResponse == shaper.StoreStatus {
		return out
	}
	for name, values := range resp.Headers {
		if u.base != nil && !u.storedHeader(name) {
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

// storedHeader reports whether an HTTP answer's header is kept. Set-Cookie
// never is, whatever store_response_headers say: it is a credential the
// upstream gives the sender, not something a producer reads.
func (u *upstream) storedHeader(name string) bool {
	if http.CanonicalHeaderKey(name) == "Set-Cookie" {
		return false
	}
	patterns := u.cfg.StoreResponseHeaders
	if len(patterns) == 0 {
		patterns = defaultStoredHeaders()
	}
	for _, p := range patterns {
		if shaper.MatchHeader(p, name) {
			return true
		}
	}
	return false
}
