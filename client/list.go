package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
)

// ListJobsOptions select the jobs ListJobs returns; none is required.
type ListJobsOptions struct {
	// Upstream names the upstream whose jobs to list; empty lists every
	// upstream's, one after another in name order.
	Upstream string
	// State keeps only jobs in that state; empty lists every state.
	State State
	// Lane and Partition keep only jobs of that lane or partition.
	Lane      string
	Partition string
	// Limit is the most jobs a page holds, 1 to 200; zero is the server's
	// default (50).
	Limit int
	// Cursor continues a listing: JobPage.NextCursor of the page before,
	// with the same other options.
	Cursor string
}

// JobPage is one page of a listing.
type JobPage struct {
	Jobs []Job `json:"jobs"`
	// NextCursor continues the listing; empty on the last page. A page
	// can hold fewer jobs than the limit, even none, and still have a
	// NextCursor: the server bounds the work of each page.
	NextCursor string `json:"next_cursor"`
}

// ListJobs reads one page of an upstream's (or every upstream's) jobs of
// the key's tenant,
// newest first within each state (the server's reference says how each
// state is ordered). Follow NextCursor until it is empty for the rest. An
// unknown upstream is ErrNotFound; a bad option ErrInvalid.
func (c *Client) ListJobs(ctx context.Context, opts ListJobsOptions) (*JobPage, error) {
	q := url.Values{}
	for name, v := range map[string]string{"upstream": opts.Upstream, "state": string(opts.State), "lane": opts.Lane, "partition": opts.Partition, "cursor": opts.Cursor} {
		if v != "" {
			q.Set(name, v)
		}
	}
	if opts.Limit != 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	var page JobPage
	if _, err := c.do(ctx, http.MethodGet, "/v1/jobs?"+q.Encode(), nil, &page); err != nil {
		if opts.Upstream == "" {
			return nil, fmt.Errorf("list jobs: %w", err)
		}
		return nil, fmt.Errorf("list jobs of %s: %w", opts.Upstream, err)
	}
	if page.Jobs == nil {
		page.Jobs = []Job{}
	}
	return &page, nil
}

// RetryJob sends a dead or cancelled job back to its queue, under the same
// ID and idempotency key, with fresh attempts, and returns it. Its
// RetriedAt, Retries and PreviousError tell of the retry. A job in any
// other state is ErrConflict (so is one whose sensitive headers were
// deleted when it died); another tenant's, or none, is ErrNotFound.
func (c *Client) RetryJob(ctx context.Context, id string) (*Job, error) {
	if id == "" {
		return nil, errors.New("retry job: empty id")
	}
	var job Job
	if _, err := c.do(ctx, http.MethodPost, "/v1/jobs/"+pathSegment(id)+"/retry", struct{}{}, &job); err != nil {
		return nil, fmt.Errorf("retry job %s: %w", id, err)
	}
	return &job, nil
}

// RetryDeadResult is what RetryDead did.
type RetryDeadResult struct {
	Upstream string `json:"upstream"`
	// Retried dead jobs are queued again.
	Retried int `json:"retried"`
	// Skipped dead jobs stay dead: the sensitive headers they need were
	// dropped (their side key expired), so they cannot be sent again.
	Skipped int `json:"skipped"`
}

// RetryDead sends every dead job of an upstream (of every tenant;
// cancelled jobs stay cancelled) back to its queue, as RetryJob does, and
// says how many went back and how many stay dead because they cannot be
// sent again. It needs an admin key (ErrUnauthorized otherwise).
func (c *Client) RetryDead(ctx context.Context, upstream string) (*RetryDeadResult, error) {
	if upstream == "" {
		return nil, errors.New("retry dead jobs: empty upstream name")
	}
	var out RetryDeadResult
	if _, err := c.do(ctx, http.MethodPost, "/v1/upstreams/"+pathSegment(upstream)+"/retry-dead", struct{}{}, &out); err != nil {
		return nil, fmt.Errorf("retry dead jobs of %s: %w", upstream, err)
	}
	return &out, nil
}
