package server

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/queue"
)

// JobPage is the answer of GET /v1/jobs.
type JobPage struct {
	Jobs []JobView `json:"jobs"`
	// NextCursor continues the listing (pass it as cursor); "" on the last
	// page. A page may hold fewer jobs than the limit, even none, and
	// still have a next cursor: each page does a bounded amount of work.
	NextCursor string `json:"next_cursor"`
}

// listParams are the query parameters GET /v1/jobs takes.
func listParams() []string {
	return []string{"upstream", "state", "lane", "partition", "limit", "cursor"}
}

// handleList answers GET /v1/jobs: one page of an upstream's jobs (or,
// without upstream, of every upstream's in name order) of the caller's
// tenant (see queue.List), each as GET /v1/jobs/{id} shows it.
func (s *Server) handleList(w http.ResponseWriter, r *http.Request) {
	o, bad := s.listOptions(r)
	if bad != nil {
		writeProblem(w, *bad)
		return
	}
	page, err := s.q.List(r.Context(), o)
	switch {
	case errors.Is(err, queue.ErrBadCursor):
		writeProblem(w, problem{Type: problemInvalid, Title: "Invalid request", Status: http.StatusBadRequest,
			Detail: err.Error(), Errors: []fieldError{{Field: "cursor", Message: "pass next_cursor from the page before, with the same upstream, state, lane and partition"}}})
		return
	case errors.Is(err, queue.ErrUnknownLane):
		// Listing every upstream, with a lane none of them has.
		writeProblem(w, problem{Type: problemInvalid, Title: "Invalid request", Status: http.StatusBadRequest,
			Detail: err.Error(), Errors: []fieldError{{Field: "lane", Message: err.Error()}}})
		return
	case err != nil:
		s.internalError(w, r, "jobs", err)
		return
	}
	out := JobPage{Jobs: make([]JobView, 0, len(page.Jobs)), NextCursor: page.NextCursor}
	for _, info := range page.Jobs {
		out.Jobs = append(out.Jobs, jobView(info))
	}
	writeJSON(w, http.StatusOK, out)
}

// listOptions reads and checks the query, reporting every problem at once.
func (s *Server) listOptions(r *http.Request) (queue.ListOptions, *problem) {
	q := r.URL.Query()
	p := &fieldProblems{}
	for _, name := range slices.Sorted(maps.Keys(q)) {
		vs := q[name]
		switch {
		case !slices.Contains(listParams(), name):
			p.add(name, "unknown parameter (known: %s)", strings.Join(listParams(), ", "))
		case len(vs) > 1:
			p.add(name, "given %d times; give it once", len(vs))
		}
	}
	o := queue.ListOptions{Tenant: caller(r).Tenant, Upstream: q.Get("upstream"), State: queue.State(q.Get("state")),
		Lane: q.Get("lane"), Partition: q.Get("partition"), Cursor: q.Get("cursor")}
	up, known := s.ups[o.Upstream]
	if o.Upstream != "" && !known {
		p.add("upstream", "no upstream %q is configured (upstreams: %s)", o.Upstream, strings.Join(s.upstreamNames(), ", "))
	}
	if o.State != "" && !queue.ValidState(o.State) {
		p.add("state", "%q: want one of queued, scheduled, active, retrying, succeeded, dead, cancelled", o.State)
	}
	if o.Lane != "" && known {
		checkLane(p, up, &JobRequest{Lane: o.Lane})
	}
	if o.Partition != "" {
		if err := shaper.CheckPartition(o.Partition); err != nil {
			p.add("partition", "%v", err)
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > queue.MaxListLimit {
			p.add("limit", "%q: want a whole number from 1 to %d (default %d)", v, queue.MaxListLimit, queue.DefaultListLimit)
		}
		o.Limit = n
	}
	if len(p.list) == 0 {
		return o, nil
	}
	if len(p.list) == 1 && o.Upstream != "" && !known {
		return o, &problem{Type: problemNotFound, Title: "Unknown upstream", Status: http.StatusNotFound,
			Detail: fmt.Sprintf("no upstream %q is configured", o.Upstream), Errors: p.list}
	}
	return o, &problem{Type: problemInvalid, Title: "Invalid request", Status: http.StatusBadRequest,
		Detail: summarize(p.list), Errors: p.list}
}

// handleRetry answers POST /v1/jobs/{id}/retry: a dead or cancelled job of
// the caller's tenant is queued again (see queue.Retry).
func (s *Server) handleRetry(w http.ResponseWriter, r *http.Request) {
	info, err := s.q.Retry(r.Context(), r.PathValue("id"), caller(r).Tenant)
	if err != nil {
		s.jobError(w, r, err)
		return
	}
	s.log.Info("job retried", "job", info.ID, "by", caller(r).Name)
	writeJSON(w, http.StatusOK, jobView(info))
}

// RetryDeadResult is the answer of POST /v1/upstreams/{name}/retry-dead.
type RetryDeadResult struct {
	Upstream string `json:"upstream"`
	// Retried dead jobs are queued again; Skipped ones stay dead, their
	// sensitive headers gone.
	Retried int `json:"retried"`
	Skipped int `json:"skipped"`
}

// handleRetryDead answers POST /v1/upstreams/{name}/retry-dead (admin
// keys): every dead job of the upstream, of every tenant, is queued again.
func (s *Server) handleRetryDead(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if _, ok := s.ups[name]; !ok {
		s.upstreamError(w, r, name, queue.ErrUnknownUpstream)
		return
	}
	res, err := s.q.RetryDead(r.Context(), name)
	var full *queue.BacklogFullError
	if errors.As(err, &full) {
		retry := s.backlogRetryAfter(r.Context(), name, full)
		s.log.Info("dead jobs retried until the backlog filled", "upstream", name, "retried", res.Retried, "skipped", res.Skipped, "by", caller(r).Name)
		writeProblem(w, problem{Type: problemBacklogFull, Title: "Backlog full", Status: http.StatusServiceUnavailable,
			Detail:     fmt.Sprintf("%v; %d dead jobs were retried and %d skipped before it filled, the rest stay dead; retry in %ds", full, res.Retried, res.Skipped, retry),
			RetryAfter: retry})
		return
	}
	if err != nil {
		s.internalError(w, r, "jobs", err)
		return
	}
	s.log.Info("dead jobs retried", "upstream", name, "retried", res.Retried, "skipped", res.Skipped, "by", caller(r).Name)
	writeJSON(w, http.StatusOK, RetryDeadResult{Upstream: name, Retried: res.Retried, Skipped: res.Skipped})
}
