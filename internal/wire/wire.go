// Package wire is the HTTP format that shaper's API server, its Go client,
// the httplimit middleware and the dispatcher must agree on, written down
// once: RFC 9457 problem documents and their type URIs, how a Retry-After
// value is read, and how a request carries its API key. It is stdlib only,
// so the client, which may not import the server, can share it.
package wire

import (
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Problem types: the type URI of each kind of refusal. Clients branch on
// them (a full backlog and an unreachable store are both 503).
const (
	ProblemBase            = "https://shaperhq.github.io/problems/"
	TypeInvalid            = ProblemBase + "invalid-request"
	TypeNotFound           = ProblemBase + "not-found"
	TypeJobExpired         = ProblemBase + "job-expired" // a 404: finished, no longer kept
	TypeUnauthorized       = ProblemBase + "unauthorized"
	TypeForbidden          = ProblemBase + "forbidden"
	TypeTooLarge           = ProblemBase + "too-large"
	TypeUnsupportedMedia   = ProblemBase + "unsupported-media-type"
	TypeConflict           = ProblemBase + "conflict"
	TypeRateLimited        = ProblemBase + "rate-limited"
	TypeBacklogFull        = ProblemBase + "backlog-full"
	TypeStoreUnavailable   = ProblemBase + "store-unavailable"
	TypeLimiterUnavailable = ProblemBase + "limiter-unavailable"
	TypeUnavailable        = ProblemBase + "unavailable"
)

// ContentTypeProblem is the media type of a problem document.
const ContentTypeProblem = "application/problem+json"

// maxRetryAfterSeconds keeps a huge Retry-After from overflowing a Duration.
const maxRetryAfterSeconds = int64(math.MaxInt64 / time.Second)

// Problem is an RFC 9457 problem document as shaper writes it, with the
// request fields at fault and, on 429 and 503, when to retry.
type Problem struct {
	Type   string       `json:"type"`
	Title  string       `json:"title"`
	Status int          `json:"status"`
	Detail string       `json:"detail,omitempty"`
	Errors []FieldError `json:"errors,omitempty"`
	// RetryAfter repeats the Retry-After header, in seconds.
	RetryAfter int64 `json:"retry_after,omitempty"`
}

// FieldError is one request field at fault and what is wrong with it.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// WriteProblem answers with p as application/problem+json. A positive
// RetryAfter also sets the Retry-After header, unless the caller set it.
func WriteProblem(w http.ResponseWriter, p Problem) {
	body, _ := json.Marshal(p) // strings, ints and a slice of strings always encode
	body = append(body, '\n')
	h := w.Header()
	if p.RetryAfter > 0 && h.Get("Retry-After") == "" {
		h.Set("Retry-After", strconv.FormatInt(p.RetryAfter, 10))
	}
	h.Set("Content-Type", ContentTypeProblem)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(p.Status)
	w.Write(body)
}

// ParseRetryAfter reads a Retry-After value (RFC 9110 §10.2.3): delay
// seconds or an HTTP date, a past date meaning now. Fractional seconds
// ("1.5") are accepted too, since some APIs send them. ok is false for an
// absent, negative or unreadable value.
func ParseRetryAfter(v string, now time.Time) (d time.Duration, ok bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0, false
		}
		return time.Duration(min(n, maxRetryAfterSeconds)) * time.Second, true
	}
	if secs, err := strconv.ParseFloat(v, 64); err == nil {
		if secs < 0 || math.IsNaN(secs) {
			return 0, false
		}
		return time.Duration(min(secs, float64(maxRetryAfterSeconds)) * float64(time.Second)), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, t.Sub(now)), true
	}
	return 0, false
}

// ErrNotBearer is an Authorization header that is not "Bearer KEY".
var ErrNotBearer = errors.New(`Authorization must be "Bearer KEY"`)

// APIKey is the API key a request carries: the token of `Authorization:
// Bearer KEY` (scheme in any case, spaces around the key ignored), else the
// X-API-Key header; "" when there is neither. An Authorization header of
// any other form is ErrNotBearer, never a fall back to X-API-Key: a request
// that means to authenticate some other way has no API key.
func APIKey(r *http.Request) (string, error) {
	if auth := r.Header.Get("Authorization"); auth != "" {
		scheme, token, _ := strings.Cut(auth, " ")
		token = strings.TrimSpace(token)
		if !strings.EqualFold(scheme, "Bearer") || token == "" {
			return "", ErrNotBearer
		}
		return token, nil
	}
	return strings.TrimSpace(r.Header.Get("X-API-Key")), nil
}
