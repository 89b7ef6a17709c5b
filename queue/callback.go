package queue

import (
	"context"
	"errors"
	"fmt"

	"github.com/shaperhq/shaper/internal/jobstore"
)

// Callback is how the delivery of a final job's callback_url stands.
type Callback struct {
	// State is pending (being delivered, or waiting to retry), delivered
	// (the receiver answered 2xx) or failed (the retries ran out).
	State     string `json:"state"`
	Attempts  int    `json:"attempts"`
	LastError string `json:"last_error,omitempty"`
	// Seq counts the job's final states; each is delivered under its own
	// webhook-id.
	Seq int `json:"-"`
}

// ErrNoCallbackToRetry: the job has no callback that failed (none at all,
// or one pending or delivered).
var ErrNoCallbackToRetry = errors.New("no failed callback to retry")

// readCallback fills in info.Callback, at one read, for a job that has a
// callback_url.
func (q *Queue) readCallback(ctx context.Context, info *Info) error {
	if info.CallbackURL == "" {
		return nil
	}
	st, err := jobstore.For(q.prefix, info.Upstream).ReadCallback(ctx, q.rdb, info.ID)
	if err != nil {
		return err
	}
	if st.State != "" {
		info.Callback = &Callback{State: st.State, Attempts: st.Attempts, LastError: st.LastError, Seq: st.Seq}
	}
	return nil
}

// RetryCallback delivers a failed callback again: the job's delivery is
// due at once, its attempts counted afresh. A job of another tenant is not
// found; one without a failed callback is left alone with
// ErrNoCallbackToRetry.
func (q *Queue) RetryCallback(ctx context.Context, id, tenant string) (*Info, error) {
	info, err := q.Get(ctx, id, tenant)
	if err != nil {
		return nil, err
	}
	if info.CallbackURL == "" {
		return info, fmt.Errorf("job %s has no callback_url: %w", id, ErrNoCallbackToRetry)
	}
	st, err := jobstore.For(q.prefix, info.Upstream).RetryCallback(ctx, q.rdb, id)
	if errors.Is(err, jobstore.ErrNoCallbackToRetry) {
		if st == "" {
			return info, fmt.Errorf("job %s is %s; its callback is sent once it is final: %w", id, info.State, ErrNoCallbackToRetry)
		}
		return info, fmt.Errorf("job %s's callback is %s: %w", id, st, ErrNoCallbackToRetry)
	}
	if err != nil {
		return nil, fmt.Errorf("retry callback of %s: %w", id, err)
	}
	return q.Get(ctx, id, tenant)
}
