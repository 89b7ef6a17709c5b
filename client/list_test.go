package client_test

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/shaperhq/shaper/client"
)

// TestListJobs: the options travel as query parameters, pages follow the
// cursor, and a bad option or an unknown upstream is the right sentinel.
func TestListJobs(t *testing.T) {
	f, c, _ := setup(t)
	ctx := context.Background()
	var want []string
	for range 5 {
		j, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe", Lane: "bulk", Partition: "p"})
		if err != nil {
			t.Fatal(err)
		}
		want = append([]string{j.ID}, want...)
	}
	c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"})
	opts := client.ListJobsOptions{Upstream: "stripe", State: client.StateQueued, Lane: "bulk", Partition: "p", Limit: 2}
	var got []string
	for {
		page, err := c.ListJobs(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range page.Jobs {
			got = append(got, j.ID)
		}
		last := f.log()[len(f.log())-1]
		q, _ := url.ParseQuery(last.Query)
		if last.Method != "GET" || last.Path != "/v1/jobs" || q.Get("upstream") != "stripe" || q.Get("state") != "queued" ||
			q.Get("lane") != "bulk" || q.Get("partition") != "p" || q.Get("limit") != "2" || q.Get("cursor") != opts.Cursor {
			t.Fatalf("got %s %s, want GET /v1/jobs with every option", last.Method, last.Path)
		}
		if page.NextCursor == "" {
			break
		}
		opts.Cursor = page.NextCursor
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	// Another tenant sees none of them.
	other, _ := newClient(t, f, otherKey)
	page, err := other.ListJobs(ctx, client.ListJobsOptions{Upstream: "stripe"})
	if err != nil || len(page.Jobs) != 0 || page.Jobs == nil {
		t.Fatalf("other tenant: got %+v, %v; want an empty list", page, err)
	}
	_, err = c.ListJobs(ctx, client.ListJobsOptions{Upstream: "twilio"})
	checkSentinel(t, err, client.ErrNotFound)
	_, err = c.ListJobs(ctx, client.ListJobsOptions{Upstream: "stripe", Limit: 500})
	checkSentinel(t, err, client.ErrInvalid)
	// Without an upstream: every upstream's jobs, and no upstream= sent.
	n := len(f.log())
	all, err := c.ListJobs(ctx, client.ListJobsOptions{})
	if err != nil || len(all.Jobs) == 0 {
		t.Fatalf("every upstream: got %+v, %v; want the tenant's jobs", all, err)
	}
	if got := f.log()[n:]; len(got) != 1 || strings.Contains(got[0].Query, "upstream") {
		t.Fatalf("every upstream: sent %+v, want one request without upstream", got)
	}
}

// TestRetryJob: a dead job comes back queued with fresh attempts; any
// other state is a conflict, another tenant's job not found.
func TestRetryJob(t *testing.T) {
	f, c, _ := setup(t)
	ctx := context.Background()
	f.setStates("active", "dead")
	job, _ := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"})
	c.Get(ctx, job.ID)
	dead, _ := c.Get(ctx, job.ID)
	if dead.State != client.StateDead {
		t.Fatalf("got %s, want dead", dead.State)
	}
	other, _ := newClient(t, f, otherKey)
	_, err := other.RetryJob(ctx, job.ID)
	checkSentinel(t, err, client.ErrNotFound)
	got, err := c.RetryJob(ctx, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != client.StateQueued || got.Attempts != 0 || got.Retries != 1 || got.RetriedAt.IsZero() || got.LastError != "" {
		t.Fatalf("got %+v, want queued with fresh attempts", got)
	}
	if last := f.log()[len(f.log())-1]; last.Method != "POST" || last.Path != "/v1/jobs/"+job.ID+"/retry" {
		t.Errorf("got %s %s", last.Method, last.Path)
	}
	_, err = c.RetryJob(ctx, job.ID)
	checkSentinel(t, err, client.ErrConflict)
	if _, err := c.RetryJob(ctx, ""); err == nil {
		t.Fatal("empty id: got no error")
	}
}

// TestRetryDead: the bulk retry returns the count and needs an admin key.
func TestRetryDead(t *testing.T) {
	f, c, _ := setup(t)
	ctx := context.Background()
	f.setStates("dead")
	for range 3 {
		j, _ := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe"})
		c.Get(ctx, j.ID)
	}
	_, err := c.RetryDead(ctx, "stripe")
	checkSentinel(t, err, client.ErrUnauthorized)
	admin, _ := newClient(t, f, adminKey)
	res, err := admin.RetryDead(ctx, "stripe")
	if err != nil || res.Retried != 3 || res.Upstream != "stripe" {
		t.Fatalf("got %+v, %v; want 3 retried", res, err)
	}
	if last := f.log()[len(f.log())-1]; last.Method != "POST" || last.Path != "/v1/upstreams/stripe/retry-dead" {
		t.Errorf("got %s %s", last.Method, last.Path)
	}
	_, err = admin.RetryDead(ctx, "twilio")
	checkSentinel(t, err, client.ErrNotFound)
}
