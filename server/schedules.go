package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/shaperhq/shaper/metrics"
	"github.com/shaperhq/shaper/queue"
	"github.com/shaperhq/shaper/schedule"
	"github.com/shaperhq/shaper/status"
)

// The schedules API: POST/GET/DELETE /v1/schedules, pause and resume. A
// key sees and changes its tenant's schedules only. A schedule's job is
// checked exactly as POST /v1/jobs checks one (toJob), when it is made and
// at each run; its runs are made by schedule.Runner through ScheduleJobs.

// scheduleRequest is the body of POST /v1/schedules.
type scheduleRequest struct {
	Name     string          `json:"name"`
	Cron     string          `json:"cron"`
	Timezone string          `json:"timezone"`
	Job      json.RawMessage `json:"job"`
	Paused   bool            `json:"paused"`
	CatchUp  string          `json:"catch_up"`
}

func (s *Server) scheduleRoutes(handle func(string, http.Handler)) {
	s.schedules = schedule.NewStore(s.rdb, schedule.Config{Prefix: s.cfg.Prefix})
	handle("POST /v1/schedules", s.authed(s.handleScheduleCreate))
	handle("GET /v1/schedules", s.authed(s.handleScheduleList))
	handle("GET /v1/schedules/{name}", s.authed(s.handleScheduleGet))
	handle("DELETE /v1/schedules/{name}", s.authed(s.handleScheduleDelete))
	handle("POST /v1/schedules/{name}/pause", s.authed(s.handleSchedulePause))
	handle("POST /v1/schedules/{name}/resume", s.authed(s.handleScheduleResume))
}

func (s *Server) handleScheduleCreate(w http.ResponseWriter, r *http.Request) {
	var req scheduleRequest
	if bad := s.decode(w, r, &req); bad != nil {
		writeProblem(w, *bad)
		return
	}
	sch := &schedule.Schedule{Name: req.Name, Tenant: caller(r).Tenant, Cron: req.Cron, Timezone: req.Timezone,
		Job: req.Job, Paused: req.Paused, CatchUp: schedule.CatchUp(req.CatchUp), Source: schedule.SourceAPI}
	if errs := s.CheckSchedule(sch, ""); errs != nil {
		writeProblem(w, problem{Type: problemInvalid, Title: "Invalid schedule", Status: http.StatusBadRequest,
			Detail: summarize(errs), Errors: errs})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	v, err := s.schedules.Create(ctx, sch)
	switch {
	case errors.Is(err, schedule.ErrExists):
		writeProblem(w, problem{Type: problemConflict, Title: "Schedule exists", Status: http.StatusConflict,
			Detail: fmt.Sprintf("tenant %s has a schedule named %s; delete it first, or choose another name", sch.Tenant, sch.Name),
			Errors: []fieldError{{Field: "name", Message: "is taken"}}})
		return
	case errors.Is(err, schedule.ErrTooMany):
		writeProblem(w, problem{Type: problemConflict, Title: "Too many schedules", Status: http.StatusConflict, Detail: err.Error()})
		return
	case err != nil:
		s.internalError(w, r, "schedules", err)
		return
	}
	w.Header().Set("Location", "/v1/schedules/"+url.PathEscape(v.Name))
	writeJSON(w, http.StatusCreated, v)
}

func (s *Server) handleScheduleList(w http.ResponseWriter, r *http.Request) {
	vs, err := s.schedules.List(r.Context(), caller(r).Tenant)
	if err != nil {
		s.internalError(w, r, "schedules", err)
		return
	}
	if vs == nil {
		vs = []schedule.View{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"schedules": vs})
}

func (s *Server) handleScheduleGet(w http.ResponseWriter, r *http.Request) {
	v, err := s.schedules.Get(r.Context(), caller(r).Tenant, r.PathValue("name"))
	s.scheduleAnswer(w, r, v, err)
}

func (s *Server) handleScheduleDelete(w http.ResponseWriter, r *http.Request) {
	err := s.schedules.Delete(r.Context(), caller(r).Tenant, r.PathValue("name"))
	if err != nil {
		s.scheduleAnswer(w, r, schedule.View{}, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleSchedulePause(w http.ResponseWriter, r *http.Request) {
	v, err := s.schedules.Pause(r.Context(), caller(r).Tenant, r.PathValue("name"))
	s.scheduleAnswer(w, r, v, err)
}

func (s *Server) handleScheduleResume(w http.ResponseWriter, r *http.Request) {
	v, err := s.schedules.Resume(r.Context(), caller(r).Tenant, r.PathValue("name"))
	s.scheduleAnswer(w, r, v, err)
}

// scheduleAnswer writes v, or the problem err calls for.
func (s *Server) scheduleAnswer(w http.ResponseWriter, r *http.Request, v schedule.View, err error) {
	name := r.PathValue("name")
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, v)
	case errors.Is(err, schedule.ErrNotFound):
		writeProblem(w, problem{Type: problemNotFound, Title: "Schedule not found", Status: http.StatusNotFound,
			Detail: fmt.Sprintf("tenant %s has no schedule named %q", caller(r).Tenant, name)})
	case errors.Is(err, schedule.ErrConfigOwned):
		writeProblem(w, problem{Type: problemConflict, Title: "Schedule declared in the config", Status: http.StatusConflict,
			Detail: fmt.Sprintf("schedule %s is declared in the config (schedules:); change, pause or remove it there", name)})
	default:
		s.internalError(w, r, "schedules", err)
	}
}

// CheckSchedule reports every problem of a schedule, fields named from
// prefix ("schedules[2]." in a config): its name, cron, timezone,
// catch_up, and its job, checked as POST /v1/jobs checks one (but the
// schedule sets the idempotency key, and a run is sent at its tick, so
// job.idempotency_key and job.not_before are refused). nil when it is
// valid.
func (s *Server) CheckSchedule(sch *schedule.Schedule, prefix string) []fieldError {
	p := &fieldProblems{prefix: prefix}
	if err := schedule.CheckName(sch.Name); err != nil {
		p.add("name", "%v", err)
	}
	loc, zerr := schedule.LoadZone(sch.Timezone)
	if _, err := schedule.ParseCron(sch.Cron, loc); err != nil {
		p.add("cron", "%v", err)
	}
	if zerr != nil {
		p.add("timezone", "%v", zerr)
	}
	switch sch.CatchUp {
	case "", schedule.CatchUpLast, schedule.CatchUpNone:
	default:
		p.add("catch_up", "%q: must be last (run the most recent missed tick once, the default) or none", sch.CatchUp)
	}
	if len(sch.Job) == 0 || string(sch.Job) == "null" {
		p.add("job", "is required: the job each tick enqueues, as POST /v1/jobs takes it")
		return p.list
	}
	req, err := decodeJob(sch.Job)
	if err != nil {
		p.add("job", "%s", describeJSONError(err))
		return p.list
	}
	if req.IdempotencyKey != "" {
		p.add("job.idempotency_key", "is set by the schedule: each run's key is schedule:NAME:UNIXTIME of its tick")
	}
	if req.NotBefore != "" {
		p.add("job.not_before", "a schedule's run is sent at its tick; leave not_before out")
	}
	if _, _, errs := s.toJob(&req, &keyEntry{Key: Key{Tenant: sch.Tenant}}, s.cfg.Now(), prefix+"job."); errs != nil {
		p.list = append(p.list, errs...)
	}
	return p.list
}

func decodeJob(raw json.RawMessage) (JobRequest, error) {
	var req JobRequest
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	err := dec.Decode(&req)
	return req, err
}

// Enqueue makes one run of sch (schedule.Jobs): its job, checked again
// against the upstreams as configured now, enqueued under key. A job that
// is no longer valid or finds its backlog full is refused, as
// schedule.Run says; only a Redis failure is an error.
func (s *Server) Enqueue(ctx context.Context, sch *schedule.Schedule, key string) (schedule.Run, error) {
	req, err := decodeJob(sch.Job)
	if err != nil {
		return schedule.Run{Refused: "job: " + describeJSONError(err)}, nil
	}
	job, _, errs := s.toJob(&req, &keyEntry{Key: Key{Tenant: sch.Tenant}}, s.cfg.Now(), "job.")
	if errs != nil {
		s.m.JobsRejected.WithLabelValues(s.upstreamLabel(req.Upstream), "invalid").Inc()
		return schedule.Run{Refused: summarize(errs)}, nil
	}
	job.IdempotencyKey = key
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	info, created, err := s.q.Enqueue(ctx, job)
	switch {
	case errors.Is(err, queue.ErrBacklogFull):
		s.m.JobsRejected.WithLabelValues(job.Upstream, "backlog_full").Inc()
		return schedule.Run{Refused: err.Error()}, nil
	case errors.Is(err, queue.ErrUnknownUpstream), errors.Is(err, queue.ErrUnknownLane):
		return schedule.Run{Refused: err.Error()}, nil
	case err != nil:
		s.m.RedisErrors.WithLabelValues("schedules").Inc()
		return schedule.Run{}, err
	}
	if created {
		s.m.JobsEnqueued.WithLabelValues(info.Upstream, info.Lane).Inc()
	}
	return schedule.Run{JobID: info.ID, Created: created}, nil
}

// NewScheduleJobs is the checker and maker of schedules' jobs for a
// process that serves no API (`shaper work`): the same checks as the API
// server's, against q's upstreams. Its API methods are not served.
// callbackHosts is callbacks.allowed_hosts, which a job's callback_url is
// checked against as the API checks it (else a worker would refuse a run
// that a serve replica accepts).
func NewScheduleJobs(q *queue.Queue, st *status.Reader, m *metrics.Metrics, callbackHosts []string) (*Server, error) {
	s := &Server{cfg: Config{Now: time.Now, CallbackHosts: callbackHosts}, q: q, st: st, m: metrics.OrDiscard(m), ups: map[string]upstreamEntry{}}
	if err := s.addUpstreams(q, st); err != nil {
		return nil, err
	}
	return s, nil
}

// addUpstreams records the upstreams jobs are checked against: those the
// queue stores them for, with the same defaults, so the two can never
// disagree.
func (s *Server) addUpstreams(q *queue.Queue, st *status.Reader) error {
	for _, u := range q.Upstreams() {
		b, ok := st.Bucket(u.Name)
		if !ok {
			return fmt.Errorf("server: upstream %s has no status source", u.Name)
		}
		e := upstreamEntry{Upstream: u, bucket: b, costs: map[string]bool{}, headers: map[string]bool{}}
		if u.BaseURL != "" {
			base, err := url.Parse(u.BaseURL)
			if err != nil {
				return fmt.Errorf("server: upstream %s: base URL: %w", u.Name, err)
			}
			e.base = base
		}
		for _, l := range u.Limits {
			if l.Cost != "" {
				e.costs[l.Cost] = true
			}
		}
		for _, h := range u.WorkerHeaders() {
			e.headers[http.CanonicalHeaderKey(h)] = true
		}
		s.ups[u.Name] = e
	}
	return nil
}
