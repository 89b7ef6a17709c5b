package server

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper/internal/jobstore"
)

// A callback_url is checked at enqueue against callbacks.allowed_hosts,
// alone and in a batch, with the field named and nothing stored.
func TestCallbackURLRefused(t *testing.T) {
	rdb := srv.Client(t)
	rdb.FlushAll(context.Background())
	f := newFixtureOn(t, rdb, generous, 1000, func(c *Config) {
		c.CallbackHosts = []string{"hooks.example.com", "127.0.0.1:9000"}
	})
	for _, tc := range []struct{ url, want string }{
		{"https://evil.example/x", "not in callbacks.allowed_hosts"},
		{"https://hooks.example.com:444/x", "not in callbacks.allowed_hosts"},
		{"https://u:p@hooks.example.com/x", "credentials"},
		{"http://127.0.0.1/x", "not in callbacks.allowed_hosts"},
		{"http://2130706433:9000/x", "not in callbacks.allowed_hosts"},
		{"http://0177.0.0.1:9000/x", "not in callbacks.allowed_hosts"},
		{"http://[::1]:9000/x", "not in callbacks.allowed_hosts"},
		{"http://[::ffff:127.0.0.1]:9000/x", "not in callbacks.allowed_hosts"},
		{"ftp://hooks.example.com/x", "http"},
		{"/hook", "http"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			before := f.backlog()
			for _, path := range []string{"/v1/jobs", "/v1/jobs/batch"} {
				job := fmt.Sprintf(`{"upstream":"stripe","path":"/x","callback_url":%q}`, tc.url)
				body, field := job, "callback_url"
				if path == "/v1/jobs/batch" {
					body, field = `{"jobs":[`+job+`]}`, "jobs[0].callback_url"
				}
				resp, problem := f.do("POST", path, body)
				if path == "/v1/jobs/batch" {
					// A batch answers each job apart.
					rs, _ := problem["results"].([]any)
					if len(rs) != 1 {
						t.Fatalf("batch: got %v", problem)
					}
					r, _ := rs[0].(map[string]any)
					if r["status"] != float64(400) {
						t.Fatalf("batch: got %v, want its job refused with 400", r)
					}
					problem, _ = r["error"].(map[string]any)
				} else if resp.StatusCode != 400 {
					t.Fatalf("%s: got %d %v, want 400", path, resp.StatusCode, problem)
				}
				if text := fmt.Sprint(problem["errors"]); !strings.Contains(text, field) || !strings.Contains(text, tc.want) {
					t.Errorf("%s: got %v, want %s and %q", path, problem["errors"], field, tc.want)
				}
			}
			if after := f.backlog(); after != before {
				t.Errorf("backlog went from %d to %d", before, after)
			}
		})
	}
}

// A job with an allowed callback_url shows it; once final it shows the
// callback's state, and POST /v1/jobs/{id}/callback/retry answers 409 until
// the callback has failed, 404 to another tenant.
func TestCallbackViewAndRetryRoute(t *testing.T) {
	rdb := srv.Client(t)
	rdb.FlushAll(context.Background())
	f := newFixtureOn(t, rdb, generous, 1000, func(c *Config) { c.CallbackHosts = []string{"HOOKS.example.com"} })
	nb := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	resp, job := f.do("POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","not_before":"`+nb+`","callback_url":"https://hooks.example.com/done"}`)
	if resp.StatusCode != 202 {
		t.Fatalf("enqueue: got %d %v", resp.StatusCode, job)
	}
	id := job["id"].(string)
	resp, body := f.do("POST", "/v1/jobs/"+id+"/callback/retry", "")
	if resp.StatusCode != 409 || !strings.Contains(fmt.Sprint(body["detail"]), "once it is final") {
		t.Fatalf("retry before final: got %d %v, want 409", resp.StatusCode, body)
	}
	if resp, _ := f.do("DELETE", "/v1/jobs/"+id, ""); resp.StatusCode != 200 {
		t.Fatalf("cancel: got %d", resp.StatusCode)
	}
	_, view := f.do("GET", "/v1/jobs/"+id, "")
	cb, _ := view["callback"].(map[string]any)
	if view["callback_url"] != "https://hooks.example.com/done" || cb["state"] != "pending" || cb["attempts"] != float64(0) {
		t.Fatalf("view: callback_url %v callback %v, want the URL and pending, 0 attempts", view["callback_url"], view["callback"])
	}
	if resp, body := f.do("POST", "/v1/jobs/"+id+"/callback/retry", ""); resp.StatusCode != 409 || !strings.Contains(fmt.Sprint(body["detail"]), "pending") {
		t.Fatalf("retry of a pending callback: got %d %v, want 409", resp.StatusCode, body)
	}
	// Its attempts run out (as a deliverer would record them).
	space := jobstore.For("", "stripe")
	c, err := space.ClaimCallbacks(context.Background(), rdb, time.Time{}, time.Minute, 10, 1)
	if err != nil || len(c) != 1 {
		t.Fatalf("claim: %v %v", c, err)
	}
	if _, err := space.CallbackDone(context.Background(), rdb, time.Time{}, c[0], false, "answered 500", 0, 1); err != nil {
		t.Fatal(err)
	}
	_, view = f.do("GET", "/v1/jobs/"+id, "")
	if cb, _ := view["callback"].(map[string]any); cb["state"] != "failed" || cb["last_error"] != "answered 500" || cb["attempts"] != float64(1) {
		t.Fatalf("failed: got %v", view["callback"])
	}
	if resp, _ := f.do("POST", "/v1/jobs/"+id+"/callback/retry", "", "Authorization", "Bearer ops-secret"); resp.StatusCode != 404 {
		t.Fatalf("retry by another tenant: got %d, want 404", resp.StatusCode)
	}
	resp, view = f.do("POST", "/v1/jobs/"+id+"/callback/retry", "")
	if cb, _ := view["callback"].(map[string]any); resp.StatusCode != 200 || cb["state"] != "pending" || cb["attempts"] != float64(0) {
		t.Fatalf("retry: got %d %v", resp.StatusCode, view)
	}
	// A job without a callback has nothing to retry.
	_, plain := f.do("POST", "/v1/jobs", `{"upstream":"stripe","path":"/y"}`)
	if resp, body := f.do("POST", "/v1/jobs/"+plain["id"].(string)+"/callback/retry", ""); resp.StatusCode != 409 || !strings.Contains(fmt.Sprint(body["detail"]), "no callback_url") {
		t.Fatalf("retry without a callback: got %d %v", resp.StatusCode, body)
	}
}
