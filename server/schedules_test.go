package server

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper/schedule"
)

// TestScheduleBadRequests: every invalid schedule is a 400 naming each
// field at fault, and nothing is stored.
func TestScheduleBadRequests(t *testing.T) {
	f := newFixture(t, generous, 1000)
	job := `{"upstream":"stripe","method":"POST","path":"/v1/charges"}`
	cases := []struct {
		name, body string
		fields     []string
		detail     string
	}{
		{"no name", `{"cron":"@hourly","job":` + job + `}`, []string{"name"}, "name is required"},
		{"bad name", `{"name":"a b","cron":"@hourly","job":` + job + `}`, []string{"name"}, "letters, digits"},
		{"bad cron", `{"name":"n","cron":"61 * * * *","job":` + job + `}`, []string{"cron"}, "end of range"},
		{"sub-second every", `{"name":"n","cron":"@every 100ms","job":` + job + `}`, []string{"cron"}, "whole seconds"},
		{"bad zone", `{"name":"n","cron":"@hourly","timezone":"Mars/Olympus","job":` + job + `}`, []string{"timezone"}, "IANA"},
		{"bad catch_up", `{"name":"n","cron":"@hourly","catch_up":"all","job":` + job + `}`, []string{"catch_up"}, "last"},
		{"no job", `{"name":"n","cron":"@hourly"}`, []string{"job"}, "is required"},
		{"unknown upstream", `{"name":"n","cron":"@hourly","job":{"upstream":"twilio","path":"/x"}}`, []string{"job.upstream"}, `no upstream "twilio"`},
		{"job path off the upstream", `{"name":"n","cron":"@hourly","job":{"upstream":"stripe","path":"https://evil.example/x"}}`, []string{"job.path"}, "job.path"},
		{"job cost no limit counts", `{"name":"n","cron":"@hourly","job":{"upstream":"stripe","path":"/x","cost":{"tokens":5}}}`, []string{"job.cost.tokens"}, "counting"},
		{"job own idempotency key", `{"name":"n","cron":"@hourly","job":{"upstream":"stripe","path":"/x","idempotency_key":"k"}}`, []string{"job.idempotency_key"}, "schedule:NAME:UNIXTIME"},
		{"job not_before", `{"name":"n","cron":"@hourly","job":{"upstream":"stripe","path":"/x","not_before":"2026-01-01T00:00:00Z"}}`, []string{"job.not_before"}, "its tick"},
		{"job unknown field", `{"name":"n","cron":"@hourly","job":{"upstream":"stripe","path":"/x","colour":"red"}}`, []string{"job"}, "unknown field"},
		{"everything", `{"name":"","cron":"","timezone":"Nowhere","job":{"upstream":"stripe"}}`, []string{"name", "cron", "timezone", "job.path"}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, body := f.do("POST", "/v1/schedules", c.body)
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("got %d %v, want 400", resp.StatusCode, body)
			}
			var got []string
			errs, _ := body["errors"].([]any)
			for _, e := range errs {
				got = append(got, e.(map[string]any)["field"].(string))
			}
			if strings.Join(got, ",") != strings.Join(c.fields, ",") {
				t.Errorf("got fields %v, want %v (%v)", got, c.fields, body["detail"])
			}
			if d, _ := body["detail"].(string); !strings.Contains(d, c.detail) {
				t.Errorf("got detail %q, want it to contain %q", d, c.detail)
			}
		})
	}
	if n, _ := f.rdb.Keys(context.Background(), "*schedules*").Result(); len(n) != 0 {
		t.Errorf("got schedule keys %v after only invalid requests, want none", n)
	}
}

// TestScheduleLifecycle: made, read, listed per tenant, refused twice,
// paused, resumed, deleted.
func TestScheduleLifecycle(t *testing.T) {
	f := newFixture(t, generous, 1000)
	body := `{"name":"weekly","cron":"0 8 * * 1","timezone":"Europe/Berlin","job":{"upstream":"stripe","method":"POST","path":"/v1/payouts"}}`
	resp, v := f.do("POST", "/v1/schedules", body)
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("Location") != "/v1/schedules/weekly" {
		t.Fatalf("create: got %d %q %v, want 201 at /v1/schedules/weekly", resp.StatusCode, resp.Header.Get("Location"), v)
	}
	next, err := time.Parse(time.RFC3339, fmt.Sprint(v["next_run_at"]))
	if err != nil || next.In(mustZone(t, "Europe/Berlin")).Weekday() != time.Monday || next.Before(time.Now()) {
		t.Errorf("next_run_at: got %v (%v), want a Monday 08:00 in Berlin ahead", v["next_run_at"], err)
	}
	if v["source"] != "api" || v["catch_up"] != "last" || v["tenant"] != "billing" || v["paused"] != false {
		t.Errorf("got %v, want source api, catch_up last, tenant billing, not paused", v)
	}
	if resp, p := f.do("POST", "/v1/schedules", body); resp.StatusCode != http.StatusConflict {
		t.Errorf("repeat: got %d %v, want 409", resp.StatusCode, p)
	}
	// Another tenant neither sees it nor is kept from the name.
	ops := []string{"Authorization", "Bearer ops-secret"}
	if resp, _ := f.do("GET", "/v1/schedules/weekly", "", ops...); resp.StatusCode != http.StatusNotFound {
		t.Errorf("other tenant's get: got %d, want 404", resp.StatusCode)
	}
	if _, l := f.do("GET", "/v1/schedules", "", ops...); len(l["schedules"].([]any)) != 0 {
		t.Errorf("other tenant's list: got %v, want none", l)
	}
	if resp, _ := f.do("DELETE", "/v1/schedules/weekly", "", ops...); resp.StatusCode != http.StatusNotFound {
		t.Errorf("other tenant's delete: got %d, want 404", resp.StatusCode)
	}
	if resp, _ := f.do("POST", "/v1/schedules", body, ops...); resp.StatusCode != http.StatusCreated {
		t.Errorf("other tenant's own schedule of the name: got %d, want 201", resp.StatusCode)
	}
	if _, l := f.do("GET", "/v1/schedules", ""); len(l["schedules"].([]any)) != 1 {
		t.Errorf("list: got %v, want the one", l)
	}
	_, p := f.do("POST", "/v1/schedules/weekly/pause", "")
	if p["paused"] != true || p["next_run_at"] != nil {
		t.Errorf("paused: got %v, want paused and no next_run_at", p)
	}
	_, p = f.do("POST", "/v1/schedules/weekly/resume", "")
	if p["paused"] != false || p["next_run_at"] != v["next_run_at"] {
		t.Errorf("resumed: got %v, want next_run_at %v", p, v["next_run_at"])
	}
	if resp, _ := f.do("DELETE", "/v1/schedules/weekly", ""); resp.StatusCode != http.StatusNoContent {
		t.Errorf("delete: got %d, want 204", resp.StatusCode)
	}
	if resp, _ := f.do("GET", "/v1/schedules/weekly", ""); resp.StatusCode != http.StatusNotFound {
		t.Errorf("get after delete: got %d, want 404", resp.StatusCode)
	}
	if resp, _ := f.do("GET", "/v1/schedules/weekly", "", ops...); resp.StatusCode != http.StatusOK {
		t.Errorf("the other tenant's after delete: got %d, want 200", resp.StatusCode)
	}
}

func mustZone(t *testing.T, name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// TestScheduleRunsEnqueueRealJobs: a run is a job in the queue under
// schedule:NAME:UNIXTIME, shown as last_job_id; a run the queue refuses
// (backlog full) is shown as last_error and the schedule goes on; a
// schedule declared in the config cannot be changed through the API.
func TestScheduleRunsEnqueueRealJobs(t *testing.T) {
	f := newFixture(t, generous, 1)
	ctx := context.Background()
	resp, v := f.do("POST", "/v1/schedules", `{"name":"minutely","cron":"@every 1m","job":{"upstream":"stripe","method":"POST","path":"/v1/payouts","lane":"bulk"}}`)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: got %d %v", resp.StatusCode, v)
	}
	first, _ := time.Parse(time.RFC3339, v["next_run_at"].(string))
	at := first
	st := schedule.NewStore(f.rdb, schedule.Config{Now: func() time.Time { return at }})
	rn := schedule.NewRunner(st, f.s, schedule.RunnerConfig{Logger: quiet()})
	rn.Pass(ctx)
	got, err := st.Get(ctx, "billing", "minutely")
	if err != nil {
		t.Fatal(err)
	}
	info, err := f.q.Get(ctx, got.LastJobID, "billing")
	if err != nil {
		t.Fatalf("last_job_id %q: %v", got.LastJobID, err)
	}
	if want := fmt.Sprintf("schedule:minutely:%d", first.Unix()); info.IdempotencyKey != want || info.Lane != "bulk" || info.Tenant != "billing" {
		t.Errorf("job: got key %q lane %q tenant %q, want %q, bulk, billing", info.IdempotencyKey, info.Lane, info.Tenant, want)
	}
	// The backlog (max_pending 1) is full now: the next run is refused.
	at = first.Add(time.Minute)
	rn.Pass(ctx)
	got, _ = st.Get(ctx, "billing", "minutely")
	if !strings.Contains(got.LastError, "max_pending") || got.LastJobID != info.ID || !got.NextRunAt.Equal(first.Add(2*time.Minute)) {
		t.Errorf("refused run: got %+v next %v, want last_error naming max_pending, last_job_id %s, next %v",
			got.State, got.NextRunAt, info.ID, first.Add(2*time.Minute))
	}
	_, view := f.do("GET", "/v1/schedules/minutely", "")
	if view["last_error"] != got.LastError || view["last_job_id"] != info.ID {
		t.Errorf("API view: got %v, want last_error and last_job_id", view)
	}

	// A schedule the config declares is read-only here.
	cfgSch := &schedule.Schedule{Name: "nightly", Tenant: "billing", Cron: "0 3 * * *", Job: []byte(`{"upstream":"stripe","path":"/v1/x"}`)}
	if errs := f.s.CheckSchedule(cfgSch, "schedules[0]."); errs != nil {
		t.Fatalf("config schedule: %v", errs)
	}
	if err := st.Sync(ctx, []*schedule.Schedule{cfgSch}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ method, path string }{
		{"DELETE", "/v1/schedules/nightly"}, {"POST", "/v1/schedules/nightly/pause"}, {"POST", "/v1/schedules/nightly/resume"},
	} {
		if resp, p := f.do(c.method, c.path, ""); resp.StatusCode != http.StatusConflict {
			t.Errorf("%s %s: got %d %v, want 409", c.method, c.path, resp.StatusCode, p)
		}
	}
	if resp, _ := f.do("POST", "/v1/schedules", `{"name":"nightly","cron":"@hourly","job":{"upstream":"stripe","path":"/v1/x"}}`); resp.StatusCode != http.StatusConflict {
		t.Errorf("create over a config schedule: got %d, want 409", resp.StatusCode)
	}
	// Gone from the config, gone from Redis.
	if err := st.Sync(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if resp, _ := f.do("GET", "/v1/schedules/nightly", ""); resp.StatusCode != http.StatusNotFound {
		t.Errorf("after the config dropped it: got %d, want 404", resp.StatusCode)
	}
}
