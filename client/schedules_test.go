package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shaperhq/shaper/client"
	"github.com/shaperhq/shaper/internal/testsupport/apicheck"
)

// TestSchedulesKeepToTheDocument drives the schedule methods against a
// real server, every exchange checked against the OpenAPI document.
func TestSchedulesKeepToTheDocument(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a server on a real redis-server")
	}
	base := realServer(t, 5)
	chk, err := apicheck.New()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.New(base, "billing-secret", client.WithHTTPClient(chk.Client(t)))
	if err != nil {
		t.Fatal(err)
	}
	req := client.ScheduleRequest{Name: "weekly", Cron: "0 8 * * 1", Timezone: "Europe/Berlin", CatchUp: "none",
		Job: client.JobRequest{Upstream: "stripe", Method: "POST", Path: "/v1/payouts", Body: []byte(`{"a":1}`), TTL: time.Hour}}
	s, err := c.CreateSchedule(ctx, req)
	if err != nil || s.Name != "weekly" || s.Tenant != "billing" || s.NextRunAt.IsZero() || s.Source != "api" || string(s.Job.Body) != `{"a":1}` || s.Job.TTL != time.Hour {
		t.Fatalf("CreateSchedule: got %+v, %v", s, err)
	}
	if _, err := c.CreateSchedule(ctx, req); !errors.Is(err, client.ErrConflict) {
		t.Errorf("CreateSchedule again: got %v, want ErrConflict", err)
	}
	bad := req
	bad.Name, bad.Cron = "bad", "every monday"
	if _, err := c.CreateSchedule(ctx, bad); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("CreateSchedule invalid: got %v, want ErrInvalid", err)
	}
	if l, err := c.Schedules(ctx); err != nil || len(l) != 1 || l[0].Name != "weekly" {
		t.Errorf("Schedules: got %+v, %v", l, err)
	}
	if p, err := c.PauseSchedule(ctx, "weekly"); err != nil || !p.Paused || !p.NextRunAt.IsZero() {
		t.Errorf("PauseSchedule: got %+v, %v", p, err)
	}
	if r, err := c.ResumeSchedule(ctx, "weekly"); err != nil || r.Paused || !r.NextRunAt.Equal(s.NextRunAt) {
		t.Errorf("ResumeSchedule: got %+v, %v", r, err)
	}
	if err := c.DeleteSchedule(ctx, "weekly"); err != nil {
		t.Errorf("DeleteSchedule: %v", err)
	}
	if _, err := c.Schedule(ctx, "weekly"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("Schedule after delete: got %v, want ErrNotFound", err)
	}
}
