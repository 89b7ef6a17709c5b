package server

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// limitsRequest is the body of PUT .../limits: limits as the config gives
// them, per as a duration ("1s", "1m").
type limitsRequest struct {
	Limits []limitBody `json:"limits"`
}

type limitBody struct {
	Rate     int64  `json:"rate"`
	Per      string `json:"per"`
	Cost     string `json:"cost,omitempty"`
	Burst    int64  `json:"burst,omitempty"`
	Adaptive bool   `json:"adaptive,omitempty"`
}

// decodeLimits reads a PUT .../limits body, or writes its 400.
func (s *Server) decodeLimits(w http.ResponseWriter, r *http.Request) ([]leaky.Limit, bool) {
	var req limitsRequest
	if bad := s.decode(w, r, &req); bad != nil {
		writeProblem(w, *bad)
		return nil, false
	}
	var errs []fieldError
	out := make([]leaky.Limit, 0, len(req.Limits))
	for i, l := range req.Limits {
		d, err := time.ParseDuration(l.Per)
		if err != nil {
			errs = append(errs, fieldError{Field: fmt.Sprintf("limits[%d].per", i),
				Message: fmt.Sprintf("%q: want a duration such as 1s, 1m or 1h", l.Per)})
		}
		out = append(out, leaky.Limit{Rate: l.Rate, Per: d, Cost: l.Cost, Burst: l.Burst, Adaptive: l.Adaptive})
	}
	if req.Limits == nil {
		errs = append(errs, fieldError{Field: "limits", Message: "required: a list of limits, e.g. [{\"rate\": 100, \"per\": \"1s\"}]"})
	}
	if len(errs) > 0 {
		writeLimitProblems(w, errs)
		return nil, false
	}
	return out, true
}

func writeLimitProblems(w http.ResponseWriter, errs []fieldError) {
	parts := make([]string, len(errs))
	for i, e := range errs {
		parts[i] = e.Field + ": " + e.Message
	}
	writeProblem(w, problem{Type: problemInvalid, Title: "Invalid limits", Status: http.StatusBadRequest,
		Detail: strings.Join(parts, "; ") + "; nothing was changed", Errors: errs})
}

func problemsToFields(ps []shaper.Problem) []fieldError {
	out := make([]fieldError, len(ps))
	for i, p := range ps {
		out[i] = fieldError{Field: p.Field(), Message: p.Msg}
	}
	return out
}

// handlePutLimits replaces an upstream's limits for every replica.
func (s *Server) handlePutLimits(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if _, ok := s.st.Bucket(name); !ok {
		s.upstreamError(w, r, name, queue.ErrUnknownUpstream)
		return
	}
	limits, ok := s.decodeLimits(w, r)
	if !ok {
		return
	}
	ps, err := s.st.PutLimits(r.Context(), name, limits)
	if err != nil {
		s.internalError(w, r, "pacing", err)
		return
	}
	if len(ps) > 0 {
		writeLimitProblems(w, problemsToFields(ps))
		return
	}
	s.log.Info("upstream limits set", "upstream", name, "limits", describeLimits(limits), "by", caller(r).Name)
	s.handleUpstream(w, r)
}

// handleResetLimits puts an upstream's configured limits back in force.
func (s *Server) handleResetLimits(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if _, ok := s.st.Bucket(name); !ok {
		s.upstreamError(w, r, name, queue.ErrUnknownUpstream)
		return
	}
	if err := s.st.ResetLimits(r.Context(), name); err != nil {
		s.internalError(w, r, "pacing", err)
		return
	}
	s.log.Info("upstream limits reset to the config", "upstream", name, "by", caller(r).Name)
	s.handleUpstream(w, r)
}

// partitionPath reads the partition of a partition route, or writes its
// 400 (or 404 for an unknown upstream).
func (s *Server) partitionPath(w http.ResponseWriter, r *http.Request) (string, string, bool) {
	name, partition := r.PathValue("name"), r.PathValue("partition")
	if _, ok := s.st.Bucket(name); !ok {
		s.upstreamError(w, r, name, queue.ErrUnknownUpstream)
		return "", "", false
	}
	if err := shaper.CheckPartition(partition); err != nil {
		writeLimitProblems(w, []fieldError{{Field: "partition", Message: "not a valid partition: " + err.Error()}})
		return "", "", false
	}
	return name, partition, true
}

func (s *Server) handleGetPartitionLimits(w http.ResponseWriter, r *http.Request) {
	name, partition, ok := s.partitionPath(w, r)
	if !ok {
		return
	}
	pl, err := s.st.PartitionLimits(r.Context(), name, partition)
	if err != nil {
		s.internalError(w, r, "pacing", err)
		return
	}
	writeJSON(w, http.StatusOK, pl)
}

func (s *Server) handlePutPartitionLimits(w http.ResponseWriter, r *http.Request) {
	name, partition, ok := s.partitionPath(w, r)
	if !ok {
		return
	}
	limits, ok := s.decodeLimits(w, r)
	if !ok {
		return
	}
	ps, err := s.st.PutPartitionLimits(r.Context(), name, partition, limits)
	if err != nil {
		s.internalError(w, r, "pacing", err)
		return
	}
	if len(ps) > 0 {
		writeLimitProblems(w, problemsToFields(ps))
		return
	}
	s.log.Info("partition limits set", "upstream", name, "limits", describeLimits(limits), "by", caller(r).Name)
	s.handleGetPartitionLimits(w, r)
}

func (s *Server) handleResetPartitionLimits(w http.ResponseWriter, r *http.Request) {
	name, partition, ok := s.partitionPath(w, r)
	if !ok {
		return
	}
	if err := s.st.ResetPartitionLimits(r.Context(), name, partition); err != nil {
		s.internalError(w, r, "pacing", err)
		return
	}
	s.log.Info("partition limits reset to the config", "upstream", name, "by", caller(r).Name)
	s.handleGetPartitionLimits(w, r)
}

func describeLimits(ls []leaky.Limit) string {
	parts := make([]string, len(ls))
	for i, l := range ls {
		parts[i] = l.String()
	}
	return strings.Join(parts, ", ")
}
