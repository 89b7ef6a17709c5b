package fakeupstream

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The answers imitate what the real APIs send, as far as their clients
// (and shaper's dispatcher) look at them:
//
//   - Stripe: 429 with Stripe-Rate-Limited-Reason (global-rate,
//     global-concurrency, endpoint-rate) and an error object of type
//     invalid_request_error with code rate_limit; no Retry-After, as Stripe
//     documents none.
//   - OpenAI: x-ratelimit-limit-*, -remaining-* and -reset-* for requests and
//     the cost ("tokens") on every answer, resets as Go-style durations
//     ("1s", "6m0s", "12ms"); on 429 also retry-after in seconds and an error
//     with type "requests" or the cost's name and code rate_limit_exceeded.
//     A success's body carries usage.total_tokens: what the request used.
//   - IETF: the structured RateLimit-Policy and RateLimit fields of
//     draft-ietf-httpapi-ratelimit-headers-10 on every answer, one item per
//     rate limit; on 429 also Retry-After in seconds and the plain body.
//   - plain: 429 with Retry-After in seconds and a one-line text body.
//   - bare: a limit the upstream keeps to itself: no rate-limit header on
//     any answer, and a 429 with no Retry-After and a body that says nothing
//     about the limit.

// Stripe's reasons, from its rate-limit documentation.
const (
	stripeGlobalRate        = "global-rate"
	stripeGlobalConcurrency = "global-concurrency"
	stripeEndpointRate      = "endpoint-rate"
)

// echo is the body of a successful answer: enough to tell which request a
// stored result belongs to.
type echo struct {
	ID             string `json:"id"`
	Object         string `json:"object"`
	Method         string `json:"method"`
	Path           string `json:"path"`
	IdempotencyKey string `json:"idempotency_key"`
	Cost           int64  `json:"cost"`
	// Usage is set in the OpenAI style only, as OpenAI reports it.
	Usage *openAIUsage `json:"usage,omitempty"`
}

// openAIUsage is OpenAI's account of what a completion used. Only the
// total means anything here: the fake splits it into a prompt and a
// completion a quarter and three quarters, so that both are plausible.
type openAIUsage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

func usageOf(total int64) *openAIUsage {
	prompt := total / 4
	return &openAIUsage{PromptTokens: prompt, CompletionTokens: total - prompt, TotalTokens: total}
}

// Stripe serialises error fields in alphabetical order; so do we.
type stripeError struct {
	Error stripeErrorBody `json:"error"`
}

type stripeErrorBody struct {
	Code    string `json:"code,omitempty"`
	DocURL  string `json:"doc_url,omitempty"`
	Message string `json:"message"`
	Type    string `json:"type"`
}

type openAIError struct {
	Error openAIErrorBody `json:"error"`
}

type openAIErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func strPtr(s string) *string { return &s }

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, _ := json.Marshal(v) // only our own plain structs: cannot fail
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}

func writeText(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	fmt.Fprintln(w, msg)
}

// retryAfterSeconds renders a wait as Retry-After's whole seconds, rounded
// up so that a client that waits exactly that long is admitted.
func retryAfterSeconds(d time.Duration) string {
	return strconv.FormatInt(wholeSeconds(d), 10)
}

// wholeSeconds is d in seconds, rounded up; 0 for no time at all.
func wholeSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// OpenAIDuration renders a wait the way OpenAI's x-ratelimit-reset-*
// headers do ("12ms", "1s", "1.5s", "6m0s"): Go's duration syntax in whole
// milliseconds, rounded up so that waiting that long is enough.
func OpenAIDuration(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	return ((d + time.Millisecond - 1) / time.Millisecond * time.Millisecond).String()
}

func (s *Server) setIDHeader(w http.ResponseWriter, d decision) {
	if s.cfg.Style == StyleStripe {
		w.Header().Set("Request-Id", d.id)
	} else {
		w.Header().Set("X-Request-Id", d.id)
	}
}

// setLimitHeaders describes the limits in the style's own headers, on
// every answer of the styles that have some.
func (s *Server) setLimitHeaders(w http.ResponseWriter, d decision) {
	switch s.cfg.Style {
	case StyleOpenAI:
		s.setOpenAIHeaders(w, d)
	case StyleIETF:
		s.setIETFHeaders(w, d)
	}
}

// setOpenAIHeaders describes every configured limit as OpenAI does. OpenAI
// has one request quota, so the endpoint limit stands in for it when that
// is the one that refused.
func (s *Server) setOpenAIHeaders(w http.ResponseWriter, d decision) {
	set := func(unit string, v *verdict) {
		if v == nil {
			return
		}
		h := w.Header()
		h.Set("X-Ratelimit-Limit-"+unit, strconv.FormatInt(v.limit, 10))
		h.Set("X-Ratelimit-Remaining-"+unit, strconv.FormatInt(v.remaining, 10))
		h.Set("X-Ratelimit-Reset-"+unit, OpenAIDuration(v.reset))
	}
	requests := d.request
	if d.reason == overEndpoint {
		requests = d.endpoint
	}
	set("Requests", requests)
	if s.cfg.CostLimit != nil {
		set(s.cfg.CostLimit.Name, d.cost)
	}
}

// IETF policy names for the request limits; the cost limit is named after
// its cost.
const (
	ietfRequestPolicy  = "default"
	ietfEndpointPolicy = "endpoint"
)

// setIETFHeaders states every rate limit as a draft-10 quota policy and
// its current state, items in the same order in both fields:
//
//	RateLimit-Policy: "default";q=40;w=1, "tokens";q=2000;w=1;qu="tokens"
//	RateLimit: "default";r=12;t=1, "tokens";r=1500;t=1
//
// q is the limit's Rate, whatever its algorithm, so that a client pacing at
// q per w keeps to it; w is Per in whole seconds, rounded up, so a Per that
// is not whole seconds is stated stricter than it is. r is what would be
// admitted now and t the seconds, rounded up, until the limit is back to
// its full allowance (what OpenAI's reset means). The endpoint limit's
// item carries the endpoint ("POST /v1/things") as its partition key pk.
// The concurrency cap is not stated: it is no rate, and the draft's
// concurrent-requests unit would be misread by a client that paces.
// Names are plain lowercase, so quoting them needs no escapes.
func (s *Server) setIETFHeaders(w http.ResponseWriter, d decision) {
	var policies, states []string
	// params are the policy's parameters after q and w, and the state's
	// after r and t.
	add := func(name string, l Limit, v *verdict, policyParams, stateParams string) {
		if v == nil {
			return
		}
		policies = append(policies, fmt.Sprintf("%q;q=%d;w=%d%s", name, l.Rate, wholeSeconds(l.Per), policyParams))
		states = append(states, fmt.Sprintf("%q;r=%d;t=%d%s", name, v.remaining, wholeSeconds(v.reset), stateParams))
	}
	add(ietfRequestPolicy, s.cfg.requestLimit(), d.request, "", "")
	if s.cfg.EndpointLimit != nil {
		pk := ";pk=:" + base64.StdEncoding.EncodeToString([]byte(d.endpointName)) + ":"
		add(ietfEndpointPolicy, *s.cfg.EndpointLimit, d.endpoint, pk, pk)
	}
	if cl := s.cfg.CostLimit; cl != nil {
		add(cl.Name, cl.limit(), d.cost, fmt.Sprintf(";qu=%q", cl.Name), "")
	}
	if len(policies) == 0 {
		return
	}
	w.Header().Set("RateLimit-Policy", strings.Join(policies, ", "))
	w.Header().Set("RateLimit", strings.Join(states, ", "))
}

// writeOK answers an admitted request. With a cost limit the answer says
// what the request used in the UsageHeader, in every style, so that a
// client can settle its estimate from a header as well as from OpenAI's
// body.
func (s *Server) writeOK(w http.ResponseWriter, d decision, rec *Record) int {
	s.setIDHeader(w, d)
	s.setLimitHeaders(w, d)
	if s.cfg.CostLimit != nil {
		w.Header().Set(UsageHeader, strconv.FormatInt(rec.Usage, 10))
	}
	body := echo{
		ID:             d.id,
		Object:         "echo",
		Method:         rec.Method,
		Path:           rec.Path,
		IdempotencyKey: rec.IdempotencyKey,
		Cost:           rec.Cost,
	}
	if s.cfg.Style == StyleOpenAI {
		body.Usage = usageOf(rec.Usage)
	}
	writeJSON(w, http.StatusOK, body)
	return http.StatusOK
}

func (s *Server) writeFailure(w http.ResponseWriter, d decision, status int) {
	s.setIDHeader(w, d)
	s.setLimitHeaders(w, d)
	msg := fmt.Sprintf("Simulated failure (%d %s); retry with the same idempotency key.", status, http.StatusText(status))
	switch s.cfg.Style {
	case StyleStripe:
		writeJSON(w, status, stripeError{stripeErrorBody{Message: msg, Type: "api_error"}})
	case StyleOpenAI:
		writeJSON(w, status, openAIError{openAIErrorBody{Message: msg, Type: "server_error"}})
	default:
		writeText(w, status, msg)
	}
}

// bareRefusal is the bare style's whole 429 body: it names no limit.
const bareRefusal = "Too Many Requests"

// writeRefusal answers a request that was not admitted and returns the
// status it sent.
func (s *Server) writeRefusal(w http.ResponseWriter, d decision) int {
	s.setIDHeader(w, d)
	s.setLimitHeaders(w, d)
	if d.reason == badRequest {
		switch s.cfg.Style {
		case StyleStripe:
			writeJSON(w, d.err.status, stripeError{stripeErrorBody{Message: d.err.msg, Type: "invalid_request_error"}})
		case StyleOpenAI:
			writeJSON(w, d.err.status, openAIError{openAIErrorBody{Message: d.err.msg, Type: "invalid_request_error"}})
		default:
			writeText(w, d.err.status, d.err.msg)
		}
		return d.err.status
	}
	if d.retryAfter > 0 && s.cfg.Style != StyleStripe && s.cfg.Style != StyleBare {
		w.Header().Set("Retry-After", retryAfterSeconds(d.retryAfter))
	}
	const status = http.StatusTooManyRequests
	switch s.cfg.Style {
	case StyleStripe:
		reason := stripeGlobalRate
		switch d.reason {
		case overConcurrency:
			reason = stripeGlobalConcurrency
		case overEndpoint:
			reason = stripeEndpointRate
		}
		w.Header().Set("Stripe-Rate-Limited-Reason", reason)
		writeJSON(w, status, stripeError{stripeErrorBody{
			Code:    "rate_limit",
			DocURL:  "https://stripe.com/docs/error-codes/rate-limit",
			Message: s.stripeMessage(d),
			Type:    "invalid_request_error",
		}})
	case StyleOpenAI:
		msg, typ := s.openAIMessage(d)
		writeJSON(w, status, openAIError{openAIErrorBody{Message: msg, Type: typ, Code: strPtr("rate_limit_exceeded")}})
	case StyleBare:
		writeText(w, status, bareRefusal)
	default:
		writeText(w, status, s.plainMessage(d))
	}
	return status
}

// refused describes the limit that refused: its unit, its window, the
// limit as configured ("10 requests per 1s (burst 3)") and its verdict.
func (s *Server) refused(d decision) (unit string, per time.Duration, desc string, v verdict) {
	switch d.reason {
	case overCost:
		return s.cfg.CostLimit.Name, s.cfg.CostLimit.Per, s.cfg.CostLimit.String(), *d.cost
	case overEndpoint:
		return "requests", s.cfg.EndpointLimit.Per, withUnit(*s.cfg.EndpointLimit), *d.endpoint
	}
	return "requests", s.cfg.Per, withUnit(s.cfg.requestLimit()), *d.request
}

// withUnit renders a request limit as "10 requests per 1s (burst 3)".
func withUnit(l Limit) string {
	rate, rest, _ := strings.Cut(l.String(), " ")
	if l.Rate == 1 {
		return rate + " request " + rest
	}
	return rate + " requests " + rest
}

func (s *Server) stripeMessage(d decision) string {
	if d.reason == overConcurrency {
		return fmt.Sprintf("Too many concurrent requests: this API key may have at most %d in flight. Retry with exponential backoff.", s.cfg.Concurrency)
	}
	_, _, desc, _ := s.refused(d)
	if d.tooLarge {
		return fmt.Sprintf("This request costs more than the limit of %s allows at once.", desc)
	}
	scope := "this API key"
	if d.reason == overEndpoint {
		scope += " on this endpoint"
	}
	return fmt.Sprintf("Request rate limit exceeded: %s is limited to %s. Retry with exponential backoff.", scope, desc)
}

// openAIMessage is the error message and type, which names the exhausted
// quota: "requests" or the cost's name. Limit is what the limit admits at
// once, as in the x-ratelimit-limit-* header.
func (s *Server) openAIMessage(d decision) (msg, typ string) {
	if d.reason == overConcurrency {
		return fmt.Sprintf("Too many concurrent requests: Limit %d in flight. Please try again once an earlier request has finished.", s.cfg.Concurrency), "requests"
	}
	unit, per, _, v := s.refused(d)
	requested := int64(1)
	if d.reason == overCost {
		requested = d.charge
	}
	quota := unit
	if d.reason == overEndpoint {
		quota += " to this endpoint"
	}
	if d.tooLarge {
		return fmt.Sprintf("Request too large for %s per %v: Limit %d, Requested %d. Send a smaller request.", quota, per, v.limit, requested), unit
	}
	return fmt.Sprintf("Rate limit reached for %s per %v: Limit %d, Used %d, Requested %d. Please try again in %s.",
		quota, per, v.limit, v.limit-v.remaining, requested, OpenAIDuration(d.retryAfter)), unit
}

func (s *Server) plainMessage(d decision) string {
	if d.reason == overConcurrency {
		return fmt.Sprintf("rate limited: at most %d requests in flight per API key", s.cfg.Concurrency)
	}
	_, _, desc, _ := s.refused(d)
	if d.tooLarge {
		return fmt.Sprintf("request too large: costs more than the limit of %s allows at once", desc)
	}
	scope := "per API key"
	if d.reason == overEndpoint {
		scope += " and endpoint"
	}
	return fmt.Sprintf("rate limited: over %s %s", desc, scope)
}
