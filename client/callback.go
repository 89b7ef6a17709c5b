package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
)

// RetryCallback delivers a job's failed callback again (its retries ran
// out): due at once, its attempts counted afresh, under the same
// webhook-id. A job whose callback has not failed answers ErrConflict.
func (c *Client) RetryCallback(ctx context.Context, id string) (*Job, error) {
	if id == "" {
		return nil, errors.New("retry callback: empty id")
	}
	var job Job
	if _, err := c.do(ctx, http.MethodPost, "/v1/jobs/"+pathSegment(id)+"/callback/retry", struct{}{}, &job); err != nil {
		return nil, fmt.Errorf("retry callback of %s: %w", id, err)
	}
	return &job, nil
}
