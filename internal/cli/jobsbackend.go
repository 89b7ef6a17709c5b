package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/client"
	"github.com/shaperhq/shaper/queue"
	"github.com/shaperhq/shaper/server"
)

// jobsBackend is where `shaper jobs` acts: a running API (with a key, so
// one tenant's jobs) or Redis through the config (as an operator: every
// tenant's jobs). Both answer with the API's job shape.
type jobsBackend interface {
	list(ctx context.Context, o client.ListJobsOptions) (*client.JobPage, error)
	get(ctx context.Context, id string) (*client.Job, error)
	// wait waits for a job to be final, a long poll of up to window at a
	// time, calling progress after each that ends with it not final.
	wait(ctx context.Context, id string, window time.Duration, progress func(*client.Job)) (*client.Job, error)
	retry(ctx context.Context, id string) (*client.Job, error)
	cancel(ctx context.Context, id string) (*client.Job, error)
	retryDead(ctx context.Context, upstream string) (*client.RetryDeadResult, error)
	close()
}

// openJobs picks the backend as pause and resume do: --config wins over
// --api, and $SHAPER_CONFIG over $SHAPER_API_URL.
func (o *jobsOptions) openJobs(ctx context.Context, f *Factory) (jobsBackend, error) {
	path := o.configPath
	if path == "" && o.api.api == "" {
		path = f.configPath("")
	}
	if path == "" && o.api.url(f) == "" {
		return nil, errors.New("give --config FILE or $SHAPER_CONFIG (through Redis), or --api URL or $SHAPER_API_URL (through the API)")
	}
	if path == "" {
		c, err := o.api.client(f)
		if err != nil {
			return nil, err
		}
		return apiJobs{c}, nil
	}
	cfg, err := f.loadConfig(path)
	if err != nil {
		return nil, err
	}
	rdb, err := f.redisClient(ctx, cfg)
	if err != nil {
		return nil, err
	}
	q, err := queue.New(rdb, queueConfig(cfg))
	if err != nil {
		rdb.Close()
		return nil, err
	}
	return redisJobs{q: q, rdb: rdb}, nil
}

type apiJobs struct{ c *client.Client }

func (a apiJobs) list(ctx context.Context, o client.ListJobsOptions) (*client.JobPage, error) {
	return a.c.ListJobs(ctx, o)
}
func (a apiJobs) get(ctx context.Context, id string) (*client.Job, error) { return a.c.Get(ctx, id) }
func (a apiJobs) retry(ctx context.Context, id string) (*client.Job, error) {
	return a.c.RetryJob(ctx, id)
}
func (a apiJobs) cancel(ctx context.Context, id string) (*client.Job, error) {
	return a.c.Cancel(ctx, id)
}
func (a apiJobs) retryDead(ctx context.Context, upstream string) (*client.RetryDeadResult, error) {
	return a.c.RetryDead(ctx, upstream)
}
func (a apiJobs) close() {}

// redisJobs acts on Redis directly, for every tenant (the operator holds
// the config, and with it Redis).
type redisJobs struct {
	q   *queue.Queue
	rdb redis.UniversalClient
}

// asJob turns a job read from Redis into the API's shape, through the
// API's own view of it, so that both backends print the same fields.
func asJob(i *queue.Info) (*client.Job, error) {
	b, err := json.Marshal(server.ViewJob(i))
	if err != nil {
		return nil, err
	}
	var j client.Job
	if err := json.Unmarshal(b, &j); err != nil {
		return nil, fmt.Errorf("job %s: %w", i.ID, err)
	}
	return &j, nil
}

func (r redisJobs) list(ctx context.Context, o client.ListJobsOptions) (*client.JobPage, error) {
	page, err := r.q.List(ctx, queue.ListOptions{Upstream: o.Upstream, State: queue.State(o.State), Lane: o.Lane,
		Partition: o.Partition, Limit: o.Limit, Cursor: o.Cursor})
	if err != nil {
		return nil, err
	}
	out := &client.JobPage{Jobs: []client.Job{}, NextCursor: page.NextCursor}
	for _, i := range page.Jobs {
		j, err := asJob(i)
		if err != nil {
			return nil, err
		}
		out.Jobs = append(out.Jobs, *j)
	}
	return out, nil
}

func (r redisJobs) one(i *queue.Info, err error) (*client.Job, error) {
	if err != nil {
		return nil, err
	}
	return asJob(i)
}

func (r redisJobs) get(ctx context.Context, id string) (*client.Job, error) {
	return r.one(r.q.Get(ctx, id, ""))
}
func (r redisJobs) retry(ctx context.Context, id string) (*client.Job, error) {
	return r.one(r.q.Retry(ctx, id, ""))
}
func (r redisJobs) cancel(ctx context.Context, id string) (*client.Job, error) {
	return r.one(r.q.Cancel(ctx, id, ""))
}
func (r redisJobs) retryDead(ctx context.Context, upstream string) (*client.RetryDeadResult, error) {
	res, err := r.q.RetryDead(ctx, upstream)
	if err != nil {
		return nil, err
	}
	return &client.RetryDeadResult{Upstream: upstream, Retried: res.Retried, Skipped: res.Skipped}, nil
}
func (r redisJobs) close() {
	r.q.Close()
	r.rdb.Close()
}
