package server

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/shaperhq/shaper/queue"
	"github.com/shaperhq/shaper/status"
)

func (s *Server) handleUpstreams(w http.ResponseWriter, r *http.Request) {
	all, err := s.st.All(r.Context())
	if err != nil {
		s.internalError(w, r, "status", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"upstreams": all})
}

func (s *Server) handleUpstream(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	st, err := s.st.Upstream(r.Context(), name)
	if err != nil {
		s.upstreamError(w, r, name, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// handleHistory is an upstream's drain rate over the last 15 minutes, which
// the status page's chart opens with.
func (s *Server) handleHistory(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	h, err := s.st.History(r.Context(), name)
	if err != nil {
		s.upstreamError(w, r, name, err)
		return
	}
	writeJSON(w, http.StatusOK, h)
}

func (s *Server) upstreamError(w http.ResponseWriter, r *http.Request, name string, err error) {
	if errors.Is(err, queue.ErrUnknownUpstream) {
		writeProblem(w, problem{Type: problemNotFound, Title: "Unknown upstream", Status: http.StatusNotFound,
			Detail: fmt.Sprintf("no upstream %q is configured", name)})
		return
	}
	s.internalError(w, r, "status", err)
}

type pauseRequest struct {
	For string `json:"for"`
}

func (s *Server) handlePause(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if _, ok := s.st.Bucket(name); !ok {
		s.upstreamError(w, r, name, queue.ErrUnknownUpstream)
		return
	}
	var d time.Duration // until resumed
	if r.ContentLength != 0 {
		var req pauseRequest
		if bad := s.decode(w, r, &req); bad != nil {
			writeProblem(w, *bad)
			return
		}
		if req.For != "" {
			v, err := time.ParseDuration(req.For)
			if err != nil || v <= 0 || v > status.Indefinitely {
				writeProblem(w, problem{Type: problemInvalid, Title: "Invalid request", Status: http.StatusBadRequest,
					Detail: fmt.Sprintf("for %q: must be a positive duration up to a year, such as 30s or 2h", req.For),
					Errors: []fieldError{{Field: "for", Message: "must be a positive duration such as 30s or 2h"}}})
				return
			}
			d = v
		}
	}
	until, err := s.st.Pause(r.Context(), name, d, "paused by "+caller(r).Name)
	if err != nil {
		s.internalError(w, r, "pacing", err)
		return
	}
	s.m.UpstreamBlocks.WithLabelValues(name, "pause").Inc()
	s.log.Info("upstream paused", "upstream", name, "until", until, "by", caller(r).Name)
	s.handleUpstream(w, r)
}

func (s *Server) handleResume(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if _, ok := s.st.Bucket(name); !ok {
		s.upstreamError(w, r, name, queue.ErrUnknownUpstream)
		return
	}
	moved, err := s.st.Resume(r.Context(), name)
	if err != nil {
		s.internalError(w, r, "pacing", err)
		return
	}
	s.log.Info("upstream resumed", "upstream", name, "by", caller(r).Name, "jobs_made_due", moved)
	s.handleUpstream(w, r)
}
