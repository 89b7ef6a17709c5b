package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shaperhq/shaper/dispatcher"
	"github.com/shaperhq/shaper/queue"
)

// listPages follows GET /v1/jobs from query to its last page with key,
// calling between (if set) after each page.
func (f *fixture) listPages(query, key string, between func()) []map[string]any {
	f.t.Helper()
	var all []map[string]any
	cursor := ""
	for pages := 0; ; pages++ {
		if pages > 500 {
			f.t.Fatal("more than 500 pages: the cursor does not advance")
		}
		path := "/v1/jobs?" + query
		if cursor != "" {
			path += "&cursor=" + url.QueryEscape(cursor)
		}
		resp, body := f.do("GET", path, "", "Authorization", "Bearer "+key)
		if resp.StatusCode != 200 {
			f.t.Fatalf("GET %s: %d %v", path, resp.StatusCode, body)
		}
		jobs, ok := body["jobs"].([]any)
		if !ok {
			f.t.Fatalf("GET %s: no jobs array in %v", path, body)
		}
		for _, j := range jobs {
			all = append(all, j.(map[string]any))
		}
		cursor, _ = body["next_cursor"].(string)
		if cursor == "" {
			return all
		}
		if between != nil {
			between()
		}
	}
}

func jobIDs(jobs []map[string]any) []string {
	out := make([]string, len(jobs))
	for i, j := range jobs {
		out[i], _ = j["id"].(string)
	}
	return out
}

func (f *fixture) enqueue(key, body string) string {
	f.t.Helper()
	resp, out := f.do("POST", "/v1/jobs", body, "Authorization", "Bearer "+key)
	if resp.StatusCode != 202 {
		f.t.Fatalf("enqueue %s: %d %v", body, resp.StatusCode, out)
	}
	return out["id"].(string)
}

// TestListJobs: a key lists its own tenant's jobs, newest first, each
// once across pages while both tenants keep enqueuing; the other tenant's
// never. A state filter keeps that state only.
func TestListJobs(t *testing.T) {
	f := newFixture(t, generous, 0)
	var billing []string
	for i := range 25 {
		billing = append(billing, f.enqueue("billing-secret", fmt.Sprintf(`{"upstream":"stripe","path":"/%d","lane":"%s"}`, i, []string{"default", "bulk"}[i%2])))
		f.enqueue("ops-secret", `{"upstream":"stripe","path":"/ops"}`)
	}
	later := f.enqueue("billing-secret", `{"upstream":"stripe","path":"/later","not_before":"`+time.Now().Add(time.Hour).Format(time.RFC3339)+`"}`)
	got := f.listPages("upstream=stripe&state=queued&limit=4", "billing-secret", func() {
		f.enqueue("billing-secret", `{"upstream":"stripe","path":"/new"}`)
		f.enqueue("ops-secret", `{"upstream":"stripe","path":"/new"}`)
	})
	want := slices.Clone(billing)
	slices.Reverse(want)
	if !slices.Equal(jobIDs(got), want) {
		t.Fatalf("got %v,\nwant billing's 25 first jobs newest first %v", jobIDs(got), want)
	}
	for _, j := range got {
		if j["tenant"] != "billing" || j["state"] != "queued" || j["upstream"] != "stripe" {
			t.Fatalf("listed %v", j)
		}
	}
	scheduled := f.listPages("upstream=stripe&state=scheduled", "billing-secret", nil)
	if !slices.Equal(jobIDs(scheduled), []string{later}) {
		t.Fatalf("scheduled: got %v, want only %s", jobIDs(scheduled), later)
	}
	bulk := f.listPages("upstream=stripe&lane=bulk", "billing-secret", nil)
	if len(bulk) != 12 {
		t.Fatalf("lane bulk: got %d jobs, want 12", len(bulk))
	}
	for _, j := range f.listPages("upstream=stripe", "ops-secret", nil) {
		if j["tenant"] != "ops" {
			t.Fatalf("ops's key listed %v", j)
		}
	}
}

// TestListBadParams: every bad parameter is a 400 (an unknown upstream
// alone a 404) naming it, and changes nothing.
func TestListBadParams(t *testing.T) {
	f := newFixture(t, generous, 0)
	for range 3 {
		f.enqueue("billing-secret", `{"upstream":"stripe","path":"/x"}`)
	}
	_, page := f.do("GET", "/v1/jobs?upstream=stripe&limit=1", "")
	cursor, _ := page["next_cursor"].(string)
	if cursor == "" {
		t.Fatalf("no cursor in %v", page)
	}
	for _, tc := range []struct {
		name, query string
		status      int
		want        string
	}{
		{"a lane no upstream has", "lane=vip", 400, "no upstream has it"},
		{"unknown upstream", "upstream=twilio", 404, `no upstream "twilio"`},
		{"bad state", "upstream=stripe&state=sleeping", 400, `state "sleeping": want one of queued`},
		{"bad lane", "upstream=stripe&lane=vip", 400, "lanes: default, bulk"},
		{"bad partition", "upstream=stripe&partition=a%0Ab", 400, "partition holds a control character"},
		{"zero limit", "upstream=stripe&limit=0", 400, "limit"},
		{"limit too big", "upstream=stripe&limit=201", 400, "from 1 to 200"},
		{"limit not a number", "upstream=stripe&limit=ten", 400, `"ten"`},
		{"unknown parameter", "upstream=stripe&colour=red", 400, "colour"},
		{"twice", "upstream=stripe&state=dead&state=queued", 400, "given 2 times"},
		{"bad cursor", "upstream=stripe&cursor=nope", 400, "cursor"},
		{"another listing's cursor", "upstream=stripe&state=dead&cursor=" + url.QueryEscape(cursor), 400, "belongs to a listing"},
		{"another tenant's cursor", "upstream=stripe&cursor=" + url.QueryEscape(cursor), 400, "cursor"},
		{"several", "upstream=twilio&state=x&limit=0", 400, "state"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "billing-secret"
			if tc.name == "another tenant's cursor" {
				key = "ops-secret"
			}
			before := f.backlog()
			resp, body := f.do("GET", "/v1/jobs?"+tc.query, "", "Authorization", "Bearer "+key)
			if resp.StatusCode != tc.status {
				t.Fatalf("got %d %v, want %d", resp.StatusCode, body, tc.status)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("Content-Type %q, want application/problem+json", ct)
			}
			if text := fmt.Sprint(body["detail"], body["errors"]); !strings.Contains(text, tc.want) {
				t.Errorf("got problem %v, want it to mention %q", body, tc.want)
			}
			if after := f.backlog(); after != before {
				t.Errorf("backlog went from %d to %d", before, after)
			}
		})
	}
	_, body := f.do("GET", "/v1/jobs?upstream=twilio&state=x&limit=0", "")
	if errs, _ := body["errors"].([]any); len(errs) != 3 {
		t.Errorf("got errors %v, want three: upstream, state and limit", body["errors"])
	}
}

// TestRetryJob: a dead job, retried through the API, is sent again by a
// real dispatcher and succeeds; its attempts, errors and timestamps tell
// the story. Another tenant cannot retry it; a job in any other state is
// a 409; bulk retry needs an admin key.
func TestRetryJob(t *testing.T) {
	f := newFixture(t, generous, 0)
	var fail atomic.Bool
	fail.Store(true)
	var calls atomic.Int32
	ups := f.q.Upstreams()
	d, err := dispatcher.New(f.rdb, dispatcher.Config{Upstreams: ups, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Handle("mail", func(ctx context.Context, job *queue.Job) (*queue.Response, error) {
		calls.Add(1)
		if fail.Load() {
			return nil, dispatcher.Permanent(errors.New("mailbox full"))
		}
		return &queue.Response{Status: 200}, nil
	}); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	waitFor := func(id, state string) map[string]any {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			_, body := f.do("GET", "/v1/jobs/"+id, "")
			if body["state"] == state {
				return body
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %s: got %v, want %s", id, body, state)
			}
		}
	}
	id := f.enqueue("billing-secret", `{"upstream":"mail","task":"welcome","idempotency_key":"welcome-7","max_attempts":1}`)
	dead := waitFor(id, "dead")
	if dead["attempts"] != 1.0 || !strings.Contains(fmt.Sprint(dead["last_error"]), "mailbox full") {
		t.Fatalf("dead job: %v", dead)
	}
	listed := f.listPages("upstream=mail&state=dead", "billing-secret", nil)
	if !slices.Equal(jobIDs(listed), []string{id}) {
		t.Fatalf("dead jobs listed: %v, want %s", jobIDs(listed), id)
	}
	if resp, body := f.do("POST", "/v1/jobs/"+id+"/retry", "", "Authorization", "Bearer ops-secret"); resp.StatusCode != 404 {
		t.Fatalf("another tenant's retry: %d %v, want 404", resp.StatusCode, body)
	}
	if resp, body := f.do("POST", "/v1/upstreams/mail/retry-dead", "", "Authorization", "Bearer billing-secret"); resp.StatusCode != 403 {
		t.Fatalf("bulk retry with a producer key: %d %v, want 403", resp.StatusCode, body)
	}
	if _, got := f.do("GET", "/v1/jobs/"+id, ""); got["state"] != "dead" {
		t.Fatalf("after refused retries: %v, want still dead", got)
	}

	fail.Store(false)
	resp, retried := f.do("POST", "/v1/jobs/"+id+"/retry", "")
	// The dispatcher may take it before the answer reads it back.
	fresh := retried["state"] == "queued" && retried["attempts"] == 0.0 || retried["state"] == "active" || retried["state"] == "succeeded"
	if resp.StatusCode != 200 || retried["id"] != id || !fresh || retried["last_error"] != nil ||
		retried["idempotency_key"] != "welcome-7" || retried["created_at"] != dead["created_at"] || retried["retries"] != 1.0 ||
		!strings.Contains(fmt.Sprint(retried["previous_error"]), "mailbox full") || retried["retried_at"] == nil {
		t.Fatalf("retry: %d %v", resp.StatusCode, retried)
	}
	done2 := waitFor(id, "succeeded")
	if done2["attempts"] != 1.0 || done2["last_error"] != nil || calls.Load() != 2 {
		t.Fatalf("after retry: %v, %d calls; want succeeded at its first fresh attempt, 2 calls in all", done2, calls.Load())
	}
	if resp, body := f.do("POST", "/v1/jobs/"+id+"/retry", ""); resp.StatusCode != 409 || !strings.Contains(fmt.Sprint(body["detail"]), "succeeded") {
		t.Fatalf("retry of a succeeded job: %d %v, want 409", resp.StatusCode, body)
	}
	if resp, _ := f.do("POST", "/v1/jobs/mail.default.nope/retry", ""); resp.StatusCode != 404 {
		t.Fatalf("retry of an unknown job: %d, want 404", resp.StatusCode)
	}

	// Bulk: every dead job of every tenant, counted.
	fail.Store(true)
	var deadIDs []string
	for i := range 3 {
		key := []string{"billing-secret", "ops-secret"}[i%2]
		deadIDs = append(deadIDs, f.enqueue(key, fmt.Sprintf(`{"upstream":"mail","task":"t%d","max_attempts":1}`, i)))
	}
	for _, d := range deadIDs {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			info, err := f.q.Get(context.Background(), d, "")
			if err != nil {
				t.Fatal(err)
			}
			if info.State == queue.StateDead {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %s: %s, want dead", d, info.State)
			}
		}
	}
	fail.Store(false)
	resp, body := f.do("POST", "/v1/upstreams/mail/retry-dead", "", "Authorization", "Bearer ops-secret")
	if resp.StatusCode != 200 || body["upstream"] != "mail" || body["retried"] != 3.0 {
		t.Fatalf("retry-dead: %d %v, want 3 retried", resp.StatusCode, body)
	}
	if resp, _ := f.do("POST", "/v1/upstreams/twilio/retry-dead", "", "Authorization", "Bearer ops-secret"); resp.StatusCode != 404 {
		t.Fatalf("retry-dead of an unknown upstream: %d, want 404", resp.StatusCode)
	}
	for _, d := range deadIDs {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			info, err := f.q.Get(context.Background(), d, "")
			if err != nil {
				t.Fatal(err)
			}
			if info.State == queue.StateSucceeded {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %s: %s, want succeeded after retry-dead", d, info.State)
			}
		}
	}
}

// TestRetryCancelledJob: a cancelled job reads back with the attempts the
// DELETE showed, and a retry queues it again.
func TestRetryCancelledJob(t *testing.T) {
	f := newFixture(t, generous, 0)
	id := f.enqueue("billing-secret", `{"upstream":"stripe","path":"/x","not_before":"`+time.Now().Add(time.Hour).Format(time.RFC3339)+`"}`)
	if resp, body := f.do("POST", "/v1/jobs/"+id+"/retry", ""); resp.StatusCode != 409 {
		t.Fatalf("retry of a scheduled job: %d %v, want 409", resp.StatusCode, body)
	}
	_, cancelled := f.do("DELETE", "/v1/jobs/"+id, "")
	_, read := f.do("GET", "/v1/jobs/"+id, "")
	if cancelled["attempts"] != read["attempts"] || read["state"] != "cancelled" {
		t.Fatalf("DELETE answered %v, GET %v: want the same attempts", cancelled, read)
	}
	resp, got := f.do("POST", "/v1/jobs/"+id+"/retry", "")
	if resp.StatusCode != 200 || got["state"] != "queued" {
		t.Fatalf("retry of a cancelled job: %d %v", resp.StatusCode, got)
	}
}
