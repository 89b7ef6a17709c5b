package server

import (
	"sort"
	"strings"
	"testing"
	"time"
)

// TestEveryBadFieldIsReported: a job that names an unknown upstream (or
// none) is still checked as far as it can be without one, so that one answer
// names every mistake; the status stays 404 for an unknown upstream.
func TestEveryBadFieldIsReported(t *testing.T) {
	f := newFixture(t, generous, 1000)
	for _, tc := range []struct {
		name, body string
		status     int
		fields     []string
	}{
		{"unknown upstream", `{"upstream":"twilio","method":"FETCH","path":"/x","ttl":"soon","max_attempts":500,"body":"a","body_base64":"YQ=="}`,
			404, []string{"body", "max_attempts", "method", "ttl", "upstream"}},
		{"no upstream", `{"path":"/x","not_before":"tomorrow"}`, 400, []string{"not_before", "upstream"}},
		{"unknown upstream alone", `{"upstream":"twilio","path":"/x"}`, 404, []string{"upstream"}},
		{"batch item", `{"jobs":[{"upstream":"twilio","ttl":"-1s"}]}`, 0, []string{"jobs[0].ttl", "jobs[0].upstream"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := "/v1/jobs"
			if strings.HasPrefix(tc.body, `{"jobs"`) {
				path = "/v1/jobs/batch"
			}
			resp, body := f.do("POST", path, tc.body)
			problem := body
			if tc.status == 0 {
				// A batch answers per item.
				results, _ := body["results"].([]any)
				if len(results) != 1 {
					t.Fatalf("got %d %v, want one result", resp.StatusCode, body)
				}
				problem, _ = results[0].(map[string]any)
				if e, _ := problem["error"].(map[string]any); e != nil {
					problem = e
				}
			} else if resp.StatusCode != tc.status {
				t.Fatalf("got %d %v, want %d", resp.StatusCode, body, tc.status)
			}
			errs, _ := problem["errors"].([]any)
			var got []string
			for _, e := range errs {
				field, _ := e.(map[string]any)["field"].(string)
				got = append(got, field)
			}
			sort.Strings(got)
			if strings.Join(got, " ") != strings.Join(tc.fields, " ") {
				t.Errorf("got fields %v, want %v (answer %v)", got, tc.fields, body)
			}
		})
	}
}

// TestCancelTwiceConflicts: cancelling a job is done once; a second DELETE
// is refused with 409 naming the state, as for any finished job, and the
// job stays cancelled.
func TestCancelTwiceConflicts(t *testing.T) {
	f := newFixture(t, generous, 1000)
	resp, body := f.do("POST", "/v1/jobs", `{"upstream":"stripe","path":"/x","not_before":"`+time.Now().Add(time.Hour).Format(time.RFC3339)+`"}`)
	if resp.StatusCode != 202 {
		t.Fatalf("enqueue: got %d %v, want 202", resp.StatusCode, body)
	}
	id, _ := body["id"].(string)
	if resp, got := f.do("DELETE", "/v1/jobs/"+id, ""); resp.StatusCode != 200 || got["state"] != "cancelled" {
		t.Fatalf("first cancel: got %d %v, want 200 cancelled", resp.StatusCode, got)
	}
	resp, got := f.do("DELETE", "/v1/jobs/"+id, "")
	if detail, _ := got["detail"].(string); resp.StatusCode != 409 || !strings.Contains(detail, "cancelled") {
		t.Fatalf("second cancel: got %d %v, want 409 naming the state", resp.StatusCode, got)
	}
	if resp, got := f.do("GET", "/v1/jobs/"+id, ""); resp.StatusCode != 200 || got["state"] != "cancelled" {
		t.Fatalf("after both: got %d %v, want the job cancelled", resp.StatusCode, got)
	}
}
