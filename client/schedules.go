package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// ScheduleRequest makes a schedule: Job enqueued at each tick of Cron in
// Timezone, exactly once however many shaper replicas run, with the
// idempotency key schedule:NAME:UNIXTIME of its tick.
type ScheduleRequest struct {
	// Name is unique within the key's tenant: 1-100 letters, digits and ._-.
	Name string `json:"name"`
	// Cron is 5 fields ("0 8 * * 1"), 6 with leading seconds, "@every 1h"
	// (whole seconds) or "@hourly", "@daily", "@weekly", "@monthly", "@yearly".
	Cron string `json:"cron"`
	// Timezone is an IANA name ("Europe/Berlin"); empty is UTC.
	Timezone string `json:"timezone,omitempty"`
	// Job is checked as Enqueue's request is; its IdempotencyKey and
	// NotBefore must be empty (the schedule sets them).
	Job JobRequest `json:"job"`
	// Paused makes the schedule paused.
	Paused bool `json:"paused,omitempty"`
	// CatchUp is "last" (the default: of ticks missed while no replica
	// ran, the most recent runs once) or "none".
	CatchUp string `json:"catch_up,omitempty"`
}

// Schedule is a schedule as the server shows it.
type Schedule struct {
	Name     string     `json:"name"`
	Tenant   string     `json:"tenant"`
	Cron     string     `json:"cron"`
	Timezone string     `json:"timezone"`
	Job      JobRequest `json:"job"`
	CatchUp  string     `json:"catch_up"`
	Paused   bool       `json:"paused"`
	// Source is "api" or "config"; config schedules cannot be changed
	// through the API (ErrConflict).
	Source    string    `json:"source"`
	CreatedAt time.Time `json:"created_at"`
	// NextRunAt is the next tick; zero while paused.
	NextRunAt time.Time `json:"next_run_at,omitzero"`
	// LastRunAt is the tick of the last run, accepted or refused.
	LastRunAt time.Time `json:"last_run_at,omitzero"`
	// LastJobID is the job of the last accepted run.
	LastJobID string `json:"last_job_id,omitempty"`
	// LastError says why the last run's job was refused; empty when it
	// was accepted.
	LastError string `json:"last_error,omitempty"`
}

// CreateSchedule makes a schedule. A name the tenant already has is
// ErrConflict; an invalid schedule is ErrInvalid, whose Error names each
// field.
func (c *Client) CreateSchedule(ctx context.Context, req ScheduleRequest) (*Schedule, error) {
	var out Schedule
	if _, err := c.do(ctx, http.MethodPost, "/v1/schedules", req, &out); err != nil {
		return nil, fmt.Errorf("create schedule %s: %w", req.Name, err)
	}
	return &out, nil
}

// Schedules lists the key's tenant's schedules, by name.
func (c *Client) Schedules(ctx context.Context) ([]Schedule, error) {
	var out struct {
		Schedules []Schedule `json:"schedules"`
	}
	if _, err := c.do(ctx, http.MethodGet, "/v1/schedules", nil, &out); err != nil {
		return nil, fmt.Errorf("list schedules: %w", err)
	}
	return out.Schedules, nil
}

// Schedule reads one schedule (ErrNotFound).
func (c *Client) Schedule(ctx context.Context, name string) (*Schedule, error) {
	return c.scheduleCall(ctx, http.MethodGet, name, "", "get")
}

// DeleteSchedule removes a schedule made through the API; the jobs it
// made stay.
func (c *Client) DeleteSchedule(ctx context.Context, name string) error {
	if name == "" {
		return errors.New("delete schedule: empty name")
	}
	if _, err := c.do(ctx, http.MethodDelete, "/v1/schedules/"+pathSegment(name), nil, nil); err != nil {
		return fmt.Errorf("delete schedule %s: %w", name, err)
	}
	return nil
}

// PauseSchedule stops a schedule's runs until ResumeSchedule.
func (c *Client) PauseSchedule(ctx context.Context, name string) (*Schedule, error) {
	return c.scheduleCall(ctx, http.MethodPost, name, "/pause", "pause")
}

// ResumeSchedule runs a paused schedule again from its next tick; ticks
// while it was paused are not run.
func (c *Client) ResumeSchedule(ctx context.Context, name string) (*Schedule, error) {
	return c.scheduleCall(ctx, http.MethodPost, name, "/resume", "resume")
}

func (c *Client) scheduleCall(ctx context.Context, method, name, suffix, what string) (*Schedule, error) {
	if name == "" {
		return nil, fmt.Errorf("%s schedule: empty name", what)
	}
	var out Schedule
	if _, err := c.do(ctx, method, "/v1/schedules/"+pathSegment(name)+suffix, nil, &out); err != nil {
		return nil, fmt.Errorf("%s schedule %s: %w", what, name, err)
	}
	return &out, nil
}
