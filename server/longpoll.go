package server

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/shaperhq/shaper/queue"
)

// A producer learns a job's outcome without polling: GET /v1/jobs/{id}
// with ?wait= holds the answer until the job is final or the wait ends,
// and an enqueue with Prefer: wait=N (RFC 7240) answers 200 with the final
// job when it finishes within N seconds. Both wait in queue.Wait, which
// one subscription per process wakes (jobstore.Finals): a waiter costs
// Redis nothing while it waits.

// parseWait reads the wait query parameter: a Go duration ("30s",
// "1m") or a number of seconds ("30", "2.5"), from 0 to queue.MaxWait.
func parseWait(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		secs, nerr := strconv.ParseFloat(v, 64)
		if nerr != nil || math.IsNaN(secs) || math.IsInf(secs, 0) {
			return 0, fmt.Errorf("%q: must be a duration such as 30s or a number of seconds, at most %v", v, queue.MaxWait)
		}
		if secs > queue.MaxWait.Seconds() {
			// Before the conversion, which could overflow.
			return 0, fmt.Errorf("%q: must be at most %v", v, queue.MaxWait)
		}
		d = time.Duration(secs * float64(time.Second))
	}
	switch {
	case d < 0:
		return 0, fmt.Errorf("%q: must not be negative", v)
	case d > queue.MaxWait:
		return 0, fmt.Errorf("%q: must be at most %v", v, queue.MaxWait)
	}
	return d, nil
}

// preferWait reads the wait preference of Prefer headers (RFC 7240: a
// comma-separated list of preferences, each with ;-parameters; the first
// of a name counts): whole seconds, capped at queue.MaxWait. A preference
// the server cannot read is ignored, as RFC 7240 asks, so ok is false
// then, as without one.
func preferWait(h http.Header) (secs int64, ok bool) {
	for _, line := range h.Values("Prefer") {
		for _, pref := range strings.Split(line, ",") {
			tok, _, _ := strings.Cut(pref, ";")
			name, val, hasVal := strings.Cut(strings.TrimSpace(tok), "=")
			if !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			val = strings.Trim(strings.TrimSpace(val), `"`)
			n, err := strconv.ParseInt(val, 10, 64)
			if !hasVal || err != nil || n < 0 {
				return 0, false
			}
			return min(n, int64(queue.MaxWait/time.Second)), true
		}
	}
	return 0, false
}

// writeWaitProblem answers a wait parameter that cannot be read.
func writeWaitProblem(w http.ResponseWriter, err error) {
	writeProblem(w, problem{Type: problemInvalid, Title: "Invalid request", Status: http.StatusBadRequest,
		Detail: "wait " + err.Error(), Errors: []fieldError{{Field: "wait", Message: err.Error()}}})
}

// handleGetWait answers GET /v1/jobs/{id}?wait=D: the job once it is
// final, or as it is when D has passed (or the client leaves, or the
// server shuts down).
func (s *Server) handleGetWait(w http.ResponseWriter, r *http.Request, v string) {
	d, err := parseWait(v)
	if err != nil {
		writeWaitProblem(w, err)
		return
	}
	info, err := s.q.Wait(r.Context(), r.PathValue("id"), caller(r).Tenant, d)
	if err != nil {
		s.jobError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, jobView(info))
}

// waitedOutcome is o after waiting up to secs for its job to become final
// (Prefer: wait): 200 with the final job, or o as it was. It reports
// whether the job is final. An outcome without a job (a refusal) is left
// alone.
func (s *Server) waitedOutcome(r *http.Request, o outcome, secs int64) (outcome, bool) {
	outs, finals := s.waitedOutcomes(r, []outcome{o}, secs)
	return outs[0], finals == 1
}

// waitedOutcomes is waitedOutcome for a batch's outcomes, in one wait: each
// that becomes final in time is answered 200 with its final job. It
// returns how many of those with a job are final.
func (s *Server) waitedOutcomes(r *http.Request, outs []outcome, secs int64) ([]outcome, int) {
	var ids []string
	var at []int
	for i, o := range outs {
		var id string
		switch j := o.job.(type) {
		case accepted:
			id = j.ID
		case JobView:
			id = j.ID
		default:
			continue
		}
		ids, at = append(ids, id), append(at, i)
	}
	if len(ids) == 0 {
		return outs, 0
	}
	infos, errs := s.q.WaitAll(r.Context(), ids, caller(r).Tenant, time.Duration(secs)*time.Second)
	finals := 0
	for k, i := range at {
		if errs[k] != nil || infos[k] == nil || !infos[k].State.Final() {
			continue
		}
		outs[i] = outcome{status: http.StatusOK, job: jobView(infos[k])}
		finals++
	}
	return outs, finals
}

// preferenceApplied says the wait was applied: the answer is final.
func preferenceApplied(w http.ResponseWriter, secs int64) {
	w.Header().Set("Preference-Applied", "wait="+strconv.FormatInt(secs, 10))
}

// waitBatch applies a batch's Prefer: wait to its outcomes (see
// processAll): the seconds waited when every job stored is final, else -1.
func (s *Server) waitBatch(r *http.Request, outs []outcome) int64 {
	secs, ok := preferWait(r.Header)
	if !ok {
		return -1
	}
	stored := 0
	for _, o := range outs {
		if o.problem == nil {
			stored++
		}
	}
	if _, finals := s.waitedOutcomes(r, outs, secs); stored == 0 || finals < stored {
		return -1
	}
	return secs
}
