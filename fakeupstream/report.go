package fakeupstream

import (
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Report is what the upstream saw since it started or was last reset.
//
// Total, ByStatus, Rejected, InFlight and MaxInFlight count every request.
// Everything else is computed from the retained records (Records of them,
// the most recent), which is every request unless Dropped is above zero.
// Durations are in nanoseconds in JSON.
type Report struct {
	// Limit describes the limits enforced, e.g.
	// "sliding_log: 100 requests per 1s per key; 20 in flight per key".
	Limit string `json:"limit"`
	// Window is the request limit's Per: the window MaxInWindow uses.
	Window time.Duration `json:"window_ns"`
	// Style is whose answers the server imitates.
	Style Style `json:"style"`
	// Since is when the server started or was last reset.
	Since time.Time `json:"since"`

	// Total is how many requests arrived, answered or not.
	Total int64 `json:"total"`
	// ByStatus counts answers by status code; StatusClientClosed counts
	// clients that left before their answer.
	ByStatus map[int]int64 `json:"by_status"`
	// Rejected counts 429s: requests over the limits, each one a violation
	// by the client of the limit this upstream enforces.
	Rejected int64 `json:"rejected"`
	// RejectedBy splits Rejected by the limit that refused: "requests"
	// (the per-key request limit), "endpoint", "cost", "concurrency", and
	// "too_large" for a cost that no wait would let through. It counts the
	// same in every style, the bare one included, whatever the answer told
	// the client.
	RejectedBy map[string]int64 `json:"rejected_by"`
	// InFlight is how many admitted requests are still being answered.
	InFlight int `json:"in_flight"`
	// MaxInFlight is the most admitted requests answered at once, all keys
	// together.
	MaxInFlight int `json:"max_in_flight"`

	// Records is how many arrivals are retained; Dropped how many older
	// ones were let go to keep memory bounded.
	Records int   `json:"records"`
	Dropped int64 `json:"dropped"`
	// RatePerSecond is the achieved arrival rate (see RatePerSecond).
	RatePerSecond float64 `json:"rate_per_second"`
	// MaxInWindow is the most arrivals in any window of length Window,
	// MaxInTenth in any window of a tenth of it: a client paced at Rate per
	// Window stays at or under Rate and about Rate/10.
	MaxInWindow int `json:"max_in_window"`
	MaxInTenth  int `json:"max_in_tenth_window"`
	// MaxAdmittedInWindow is MaxInWindow over admitted requests only: the
	// server's own check on its limit.
	MaxAdmittedInWindow int `json:"max_admitted_in_window"`
	// Gaps summarises the intervals between consecutive arrivals.
	Gaps GapStats `json:"gaps"`
	// CostDeclared sums the admitted requests' declared costs (Record.Cost),
	// CostCharged what the cost limit charged them (Record.Usage): the
	// difference is what estimates overstated.
	CostDeclared int64 `json:"cost_declared"`
	CostCharged  int64 `json:"cost_charged"`

	// IdempotencyKeys counts distinct idempotency keys (per API key) seen.
	IdempotencyKeys int `json:"idempotency_keys"`
	// DuplicateKeys counts idempotency keys sent more than once: retries.
	DuplicateKeys int `json:"duplicate_idempotency_keys"`
	// DuplicateSuccesses counts idempotency keys answered 2xx more than
	// once: work a real upstream without idempotency would have done twice.
	DuplicateSuccesses int `json:"duplicate_idempotency_successes"`

	// Keys breaks the record down by API key ("" for requests without one).
	Keys map[string]KeyReport `json:"keys"`
}

// KeyReport is one API key's share of the record.
type KeyReport struct {
	Requests      int64   `json:"requests"`
	Succeeded     int64   `json:"succeeded"` // answered 2xx
	Rejected      int64   `json:"rejected"`  // answered 429
	Failed        int64   `json:"failed"`    // answered 5xx
	MaxInWindow   int     `json:"max_in_window"`
	RatePerSecond float64 `json:"rate_per_second"`
}

// String is a one-paragraph summary for logs and the command's exit.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d requests (%s)", r.Total, r.Limit)
	for _, code := range []int{200, 400, 413, 429, 499, 500, 503} {
		if n := r.ByStatus[code]; n > 0 {
			fmt.Fprintf(&b, ", %d× %d", n, code)
		}
	}
	fmt.Fprintf(&b, "; %.1f/s, at most %d per %v and %d per %v; gaps p1 %v p50 %v p99 %v; %d in flight at most; %d idempotency keys repeated, %d answered 2xx twice",
		r.RatePerSecond, r.MaxInWindow, r.Window, r.MaxInTenth, r.Window/10,
		r.Gaps.P1, r.Gaps.P50, r.Gaps.P99, r.MaxInFlight, r.DuplicateKeys, r.DuplicateSuccesses)
	if r.Dropped > 0 {
		fmt.Fprintf(&b, "; figures over the last %d records (%d dropped)", r.Records, r.Dropped)
	}
	var by []string
	for _, name := range []string{"requests", "endpoint", "cost", "concurrency", "too_large"} {
		if n := r.RejectedBy[name]; n > 0 {
			by = append(by, fmt.Sprintf("%s %d", name, n))
		}
	}
	if len(by) > 0 {
		fmt.Fprintf(&b, "; 429s by limit: %s", strings.Join(by, ", "))
	}
	if r.CostCharged != r.CostDeclared {
		fmt.Fprintf(&b, "; cost declared %d, charged %d", r.CostDeclared, r.CostCharged)
	}
	if r.Style != "" {
		fmt.Fprintf(&b, "; %s style", r.Style)
	}
	return b.String()
}

// Report summarises what the server saw. The figures are computed after
// the lock is released, so reporting does not stall traffic for long.
func (s *Server) Report() Report {
	s.mu.Lock()
	recs := s.recordsLocked()
	r := Report{
		Limit:       s.cfg.describe(),
		Style:       s.cfg.Style,
		RejectedBy:  make(map[string]int64, len(s.rejectedBy)),
		Window:      s.cfg.Per,
		Since:       s.since,
		Total:       int64(s.arrivals),
		ByStatus:    make(map[int]int64, len(s.byStatus)),
		Rejected:    s.byStatus[http.StatusTooManyRequests],
		InFlight:    s.flying,
		MaxInFlight: s.maxInFlight,
		Records:     len(s.records),
		Dropped:     int64(s.arrivals) - int64(len(s.records)),
	}
	for code, n := range s.byStatus {
		r.ByStatus[code] = n
	}
	for name, n := range s.rejectedBy {
		r.RejectedBy[name] = n
	}
	s.mu.Unlock()

	all := make([]time.Duration, 0, len(recs))
	var admittedTimes []time.Duration
	perKey := map[string][]time.Duration{}
	r.Keys = map[string]KeyReport{}
	type idem struct{ key, idem string }
	type idemCount struct{ sent, ok int }
	idems := map[idem]idemCount{}
	for _, rec := range recs {
		all = append(all, rec.At)
		if rec.Admitted {
			admittedTimes = append(admittedTimes, rec.At)
			r.CostDeclared += rec.Cost
			r.CostCharged += rec.Usage
		}
		perKey[rec.Key] = append(perKey[rec.Key], rec.At)
		k := r.Keys[rec.Key]
		k.Requests++
		switch {
		case rec.Status >= 200 && rec.Status < 300:
			k.Succeeded++
		case rec.Status == http.StatusTooManyRequests:
			k.Rejected++
		case rec.Status >= 500 && rec.Status < 600:
			k.Failed++
		}
		r.Keys[rec.Key] = k
		if rec.IdempotencyKey != "" {
			id := idem{rec.Key, rec.IdempotencyKey}
			c := idems[id]
			c.sent++
			if rec.Status >= 200 && rec.Status < 300 {
				c.ok++
			}
			idems[id] = c
		}
	}
	for key, times := range perKey {
		k := r.Keys[key]
		k.MaxInWindow = MaxInWindow(times, r.Window)
		k.RatePerSecond = RatePerSecond(times)
		r.Keys[key] = k
	}
	r.IdempotencyKeys = len(idems)
	for _, c := range idems {
		if c.sent > 1 {
			r.DuplicateKeys++
		}
		if c.ok > 1 {
			r.DuplicateSuccesses++
		}
	}
	r.RatePerSecond = RatePerSecond(all)
	r.MaxInWindow = MaxInWindow(all, r.Window)
	r.MaxInTenth = MaxInWindow(all, r.Window/10)
	r.MaxAdmittedInWindow = MaxInWindow(admittedTimes, r.Window)
	r.Gaps = GapPercentiles(all)
	return r
}
