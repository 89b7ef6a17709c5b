package server

import (
	"errors"
	"net/http"

	"github.com/shaperhq/shaper/internal/callback"
	"github.com/shaperhq/shaper/queue"
)

// CallbackView is how a final job's callback delivery stands:
// pending (being delivered or waiting to retry), delivered or failed.
type CallbackView struct {
	State     string `json:"state"`
	Attempts  int    `json:"attempts"`
	LastError string `json:"last_error,omitempty"`
}

func callbackView(c *queue.Callback) *CallbackView {
	if c == nil {
		return nil
	}
	return &CallbackView{State: c.State, Attempts: c.Attempts, LastError: c.LastError}
}

// checkCallback reads callback_url: an absolute http(s) URL whose host is
// in callbacks.allowed_hosts. The job remembers the key it came with,
// whose secret signs its callbacks.
func (s *Server) checkCallback(p *fieldProblems, req *JobRequest, job *queue.Job, k *keyEntry) {
	if req.CallbackURL == "" {
		return
	}
	if err := callback.CheckURL(req.CallbackURL, s.cfg.CallbackHosts); err != nil {
		if errors.Is(err, callback.ErrHostNotAllowed) && len(s.cfg.CallbackHosts) == 0 {
			p.add("callback_url", "%v (none are configured, so no callback_url is accepted)", err)
			return
		}
		p.add("callback_url", "%v", err)
		return
	}
	job.CallbackURL, job.CallbackKey = req.CallbackURL, k.Name
}

// handleCallbackRetry answers POST /v1/jobs/{id}/callback/retry: a job of
// the key's tenant whose callback failed is delivered again, its attempts
// counted afresh; 409 when there is no failed callback.
func (s *Server) handleCallbackRetry(w http.ResponseWriter, r *http.Request) {
	info, err := s.q.RetryCallback(r.Context(), r.PathValue("id"), caller(r).Tenant)
	if err != nil {
		s.jobError(w, r, err)
		return
	}
	s.log.Info("callback retried", "job", info.ID, "by", caller(r).Name)
	writeJSON(w, http.StatusOK, jobView(info))
}
