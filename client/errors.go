package client

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"mime"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/shaperhq/shaper/internal/ratelimit"
	"github.com/shaperhq/shaper/internal/wire"
)

// Sentinels that errors.Is matches an *Error against, one per way a caller
// has to react differently.
var (
	// ErrRateLimited is a 429: the API key's admission allowance is spent.
	// Wait Error.RetryAfter (or use WithRetry).
	ErrRateLimited = errors.New("rate limited")
	// ErrBacklogFull is a 503 whose problem type is backlog-full: the
	// upstream's queue is at max_pending. Wait Error.RetryAfter, which the
	// server derives from how fast the backlog drains.
	ErrBacklogFull = errors.New("backlog full")
	// ErrUnavailable is any other 503: the server cannot reach Redis
	// (problem type store-unavailable; nothing was stored), or something in
	// between cannot reach the server (a proxy's 503). Retrying shortly is
	// right; Error.RetryAfter says when if the server said.
	ErrUnavailable = errors.New("service unavailable")
	// ErrNotFound is a 404: no such job for this key's tenant, or no such
	// upstream.
	ErrNotFound = errors.New("not found")
	// ErrInvalid is a 400, 413, 415 or 422: the request itself is wrong and
	// will be refused again as it is. Error.Fields names what is wrong.
	ErrInvalid = errors.New("invalid request")
	// ErrUnauthorized is a 401 (no or unknown API key) or 403 (the key may
	// not do this, e.g. pause without admin rights).
	ErrUnauthorized = errors.New("unauthorized")
	// ErrConflict is a 409: the job is already being dispatched or is
	// finished, so it can no longer be cancelled.
	ErrConflict = errors.New("conflict")
)

// Error is a request the server refused, read from its RFC 9457
// problem+json answer, or made up from the status and body when the answer
// is not one (a proxy's error page, say).
type Error struct {
	// StatusCode is the HTTP status, or for a batch item its own status.
	StatusCode int
	// Type is a URI naming the kind of problem; "about:blank" or empty
	// when the server gave none.
	Type string
	// Title is a short summary of the kind of problem; the status text when
	// the server gave none.
	Title string
	// Detail explains this occurrence, e.g. which limit was hit.
	Detail string
	// Instance is a URI for this occurrence, when the server gives one.
	Instance string
	// Fields lists the request fields at fault, for invalid requests.
	Fields []FieldError
	// RetryAfter is how long the server asks the caller to wait before
	// trying again (429 and 503); zero when it did not say.
	RetryAfter time.Duration
	// RateLimit is the admission allowance as the response's rate-limit
	// headers describe it; nil when it carried none.
	RateLimit *RateLimit

	// retryAfterKnown tells a Retry-After of zero ("now") from none.
	retryAfterKnown bool
}

// FieldError is one request field at fault and what is wrong with it.
type FieldError struct {
	// Field names the field as the request spells it, e.g. "upstream" or
	// "jobs[2].path".
	Field   string `json:"field"`
	Message string `json:"message"`
}

// String renders the pair as "field: message".
func (f FieldError) String() string {
	if f.Field == "" {
		return f.Message
	}
	return f.Field + ": " + f.Message
}

// Error renders the status, title, detail and fields, e.g.
// `400 Invalid request: 1 field is invalid (path: must be relative)`.
func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s", e.StatusCode, e.Title)
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	for i, f := range e.Fields {
		if i == 0 {
			b.WriteString(" (")
		} else {
			b.WriteString("; ")
		}
		b.WriteString(f.String())
	}
	if len(e.Fields) > 0 {
		b.WriteString(")")
	}
	return b.String()
}

// Is lets errors.Is match the sentinel for e's status.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrRateLimited:
		return e.StatusCode == http.StatusTooManyRequests
	case ErrBacklogFull:
		return e.StatusCode == http.StatusServiceUnavailable && e.Type == wire.TypeBacklogFull
	case ErrUnavailable:
		return e.StatusCode == http.StatusServiceUnavailable && e.Type != wire.TypeBacklogFull
	case ErrNotFound:
		return e.StatusCode == http.StatusNotFound
	case ErrInvalid:
		switch e.StatusCode {
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge,
			http.StatusUnsupportedMediaType, http.StatusUnprocessableEntity:
			return true
		}
	case ErrUnauthorized:
		return e.StatusCode == http.StatusUnauthorized || e.StatusCode == http.StatusForbidden
	case ErrConflict:
		return e.StatusCode == http.StatusConflict
	}
	return false
}

// RateLimit is an admission allowance as the server's rate-limit headers
// describe it (draft-ietf-httpapi-ratelimit-headers, with the older
// X-RateLimit-* trio and the other common spellings as a fallback).
type RateLimit struct {
	// Policy names the limit, e.g. "enqueue".
	Policy string
	// Limit is how many requests the allowance holds when full (the
	// policy's quota).
	Limit int64
	// Window is the policy's window: how long a spent allowance takes to
	// refill. Zero when the server did not say.
	Window time.Duration
	// Remaining is how many requests would be admitted right now.
	Remaining int64
	// Reset is how long until the allowance is full again.
	Reset time.Duration
}

// String renders the allowance, e.g. `"enqueue" 0/10 left, full in 2s`.
func (r RateLimit) String() string {
	name := r.Policy
	if name == "" {
		name = "default"
	}
	return fmt.Sprintf("%q %d/%d left, full in %v", name, r.Remaining, r.Limit, r.Reset)
}

// problem is the RFC 9457 document, plus the shapes other servers use
// for a message, so a stray JSON error still says something.
type problem struct {
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Status     int             `json:"status"`
	Detail     string          `json:"detail"`
	Instance   string          `json:"instance"`
	Errors     json.RawMessage `json:"errors"`
	RetryAfter *float64        `json:"retry_after"`
	Message    string          `json:"message"`
	Error      json.RawMessage `json:"error"`
}

// newError builds the *Error for a non-2xx response whose body (possibly
// cut short) is raw.
func newError(resp *http.Response, raw []byte, now time.Time) *Error {
	e := &Error{StatusCode: resp.StatusCode}
	if looksJSON(resp.Header.Get("Content-Type"), raw) {
		var p problem
		if json.Unmarshal(raw, &p) == nil {
			e.fromProblem(p)
		}
	}
	if e.Title == "" && e.Detail == "" {
		e.Detail = textOf(raw)
	}
	if e.Title == "" {
		e.Title = http.StatusText(resp.StatusCode)
	}
	if d, ok := wire.ParseRetryAfter(resp.Header.Get("Retry-After"), now); ok {
		e.RetryAfter, e.retryAfterKnown = d, true
	}
	e.RateLimit = parseRateLimit(resp.Header, now)
	return e
}

// fromProblem fills e from a decoded problem document. The HTTP status
// stays authoritative; a batch item has no other.
func (e *Error) fromProblem(p problem) {
	e.Type, e.Title, e.Detail, e.Instance = p.Type, p.Title, p.Detail, p.Instance
	if e.StatusCode == 0 {
		e.StatusCode = p.Status
	}
	e.Fields = fieldErrors(p.Errors)
	if p.RetryAfter != nil && *p.RetryAfter >= 0 && *p.RetryAfter < math.MaxInt64/float64(time.Second) {
		e.RetryAfter = time.Duration(*p.RetryAfter * float64(time.Second))
		e.retryAfterKnown = true
	}
	if e.Detail == "" {
		e.Detail = p.Message
	}
	if e.Detail == "" && len(p.Error) > 0 {
		// {"error": "text"} or {"error": {"message": "text"}}, as many APIs do.
		var s string
		var o struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(p.Error, &s) == nil {
			e.Detail = s
		} else if json.Unmarshal(p.Error, &o) == nil {
			e.Detail = o.Message
		}
	}
}

// fieldErrors reads the problem's "errors" member, tolerating shapes other
// than the list of {field, message} it should be.
func fieldErrors(raw json.RawMessage) []FieldError {
	if len(raw) == 0 {
		return nil
	}
	var list []FieldError
	if json.Unmarshal(raw, &list) == nil {
		return list
	}
	var byField map[string]string
	if json.Unmarshal(raw, &byField) == nil {
		for f, m := range byField {
			list = append(list, FieldError{Field: f, Message: m})
		}
		return list
	}
	return nil
}

func looksJSON(contentType string, raw []byte) bool {
	mt, _, _ := mime.ParseMediaType(contentType)
	if mt == "application/json" || mt == wire.ContentTypeProblem || strings.HasSuffix(mt, "+json") {
		return true
	}
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && t[0] == '{'
}

// textOf is a short plain-text rendering of a body that is not a problem
// document, enough to tell a proxy's "upstream connect error" apart.
func textOf(raw []byte) string {
	const maxRunes = 200
	if !utf8.Valid(raw) {
		return ""
	}
	s := strings.Join(strings.Fields(string(raw)), " ")
	if utf8.RuneCountInString(s) > maxRunes {
		s = string([]rune(s)[:maxRunes]) + "…"
	}
	return s
}

// parseRateLimit reads the allowance from the response's rate-limit headers,
// in any form internal/ratelimit reads: the first quota the answer reports
// (the structured RateLimit field before the X-RateLimit-* trio), with the
// window and, if the quota lacks one, the limit of the policy of the same
// name. An answer that only states a policy gives that policy. nil when it
// gives neither.
func parseRateLimit(h http.Header, now time.Time) *RateLimit {
	r := ratelimit.Read(h, now)
	var rl RateLimit
	switch {
	case len(r.Quotas) > 0:
		q := r.Quotas[0]
		rl = RateLimit{Policy: q.Name, Limit: q.Limit, Remaining: q.Remaining, Reset: q.Reset}
	case len(r.Policies) > 0:
		rl.Policy = r.Policies[0].Name
	default:
		return nil
	}
	for _, p := range r.Policies {
		if p.Name == rl.Policy {
			rl.Window = p.Window
			if rl.Limit == 0 {
				rl.Limit = p.Quota
			}
			break
		}
	}
	// A server that names its policy only in RateLimit may still give the
	// limit in an unnamed form, X-RateLimit-Limit say.
	for _, q := range r.Quotas {
		if rl.Limit != 0 {
			break
		}
		if q.Name == "" || q.Name == rl.Policy {
			rl.Limit = q.Limit
		}
	}
	return &rl
}
