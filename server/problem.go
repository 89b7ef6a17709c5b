package server

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Problem types; httplimit answers 429s with its own.
const (
	problemBase             = "https://shaperhq.github.io/problems/"
	problemInvalid          = problemBase + "invalid-request"
	problemNotFound         = problemBase + "not-found"
	problemUnauthorized     = problemBase + "unauthorized"
	problemForbidden        = problemBase + "forbidden"
	problemTooLarge         = problemBase + "too-large"
	problemUnsupportedMedia = problemBase + "unsupported-media-type"
	problemBacklogFull      = problemBase + "backlog-full"
	problemConflict         = problemBase + "conflict"
	problemUnavailable      = problemBase + "unavailable"
	// problemStoreUnavailable is a 503 because Redis cannot be reached:
	// nothing was stored, and trying again shortly is right (unlike a full
	// backlog, which says when to come back from the drain rate).
	problemStoreUnavailable = problemBase + "store-unavailable"
)

// storeUnavailable is the 503 for a request that needed Redis and could not
// reach it.
func storeUnavailable(detail string) problem {
	return problem{Type: problemStoreUnavailable, Title: "Store unavailable", Status: http.StatusServiceUnavailable,
		Detail: detail, RetryAfter: 1}
}

// problem is an RFC 9457 problem detail, with the fields at fault.
type problem struct {
	Type       string       `json:"type"`
	Title      string       `json:"title"`
	Status     int          `json:"status"`
	Detail     string       `json:"detail,omitempty"`
	Errors     []fieldError `json:"errors,omitempty"`
	RetryAfter int64        `json:"retry_after,omitempty"`
}

type fieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

func writeProblem(w http.ResponseWriter, p problem) {
	body, _ := json.Marshal(p)
	if p.RetryAfter > 0 && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", strconv.FormatInt(p.RetryAfter, 10))
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(p.Status)
	w.Write(append(body, '\n'))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encoding the answer failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}
