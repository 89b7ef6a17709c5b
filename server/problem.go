package server

import (
	"encoding/json"
	"net/http"

	"github.com/shaperhq/shaper/internal/wire"
)

// Problem types, from the one list the client and httplimit share;
// httplimit answers 429s itself.
const (
	problemInvalid          = wire.TypeInvalid
	problemNotFound         = wire.TypeNotFound
	problemJobExpired       = wire.TypeJobExpired
	problemUnauthorized     = wire.TypeUnauthorized
	problemForbidden        = wire.TypeForbidden
	problemTooLarge         = wire.TypeTooLarge
	problemUnsupportedMedia = wire.TypeUnsupportedMedia
	problemBacklogFull      = wire.TypeBacklogFull
	problemConflict         = wire.TypeConflict
	problemUnavailable      = wire.TypeUnavailable
	// problemStoreUnavailable is a 503 because Redis cannot be reached:
	// nothing was stored, and trying again shortly is right (unlike a full
	// backlog, which says when to come back from the drain rate).
	problemStoreUnavailable = wire.TypeStoreUnavailable
)

// problem is an RFC 9457 problem detail, with the fields at fault.
type problem = wire.Problem

type fieldError = wire.FieldError

// storeUnavailable is the 503 for a request that needed Redis and could not
// reach it.
func storeUnavailable(detail string) problem {
	return problem{Type: problemStoreUnavailable, Title: "Store unavailable", Status: http.StatusServiceUnavailable,
		Detail: detail, RetryAfter: 1}
}

func writeProblem(w http.ResponseWriter, p problem) { wire.WriteProblem(w, p) }

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
