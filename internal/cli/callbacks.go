package cli

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/config"
	"github.com/shaperhq/shaper/internal/callback"
	"github.com/shaperhq/shaper/metrics"
	"github.com/shaperhq/shaper/queue"
	"github.com/shaperhq/shaper/server"
)

// newDeliverer is the callback deliverer of a worker replica (or of dev),
// nil when no callback can exist (callbacks.allowed_hosts is empty): then
// a replica looks at no due set at all. It delivers the callbacks of every
// configured upstream's jobs, whichever upstreams the replica drains,
// reading them through a queue of its own that done closes.
func newDeliverer(rdb redis.UniversalClient, cfg *config.Config, secrets config.CallbackSecrets, m *metrics.Metrics, log *slog.Logger) (cd *callback.Deliverer, done func(), err error) {
	cb := cfg.Callbacks
	if len(cb.AllowedHosts) == 0 {
		return nil, func() {}, nil
	}
	q, err := queue.New(rdb, queue.Config{Upstreams: cfg.AllUpstreams(), Prefix: cfg.Redis.Prefix})
	if err != nil {
		return nil, nil, err
	}
	cd, err = callback.New(rdb, callback.Config{
		Queue:        q,
		Upstreams:    cfg.UpstreamNames(),
		Prefix:       cfg.Redis.Prefix,
		AllowedHosts: cb.AllowedHosts,
		Secret:       secrets.For,
		Limits:       cb.CallbackLimits(),
		MaxAttempts:  cb.Retry.MaxAttempts,
		MinBackoff:   time.Duration(cb.Retry.MinBackoff),
		MaxBackoff:   time.Duration(cb.Retry.MaxBackoff),
		View: func(i *queue.Info) ([]byte, error) {
			return json.Marshal(server.ViewJob(i))
		},
		Metrics: m,
		Logger:  log.With("component", "callbacks"),
	})
	if err != nil {
		q.Close()
		return nil, nil, err
	}
	return cd, func() { q.Close() }, nil
}

// runDeliverer runs cd (when not nil) beside run, both on ctx: when either
// returns, the other is stopped, and both are waited for.
func runDeliverer(ctx context.Context, cd *callback.Deliverer, run func(context.Context) error) error {
	if cd == nil {
		return run(ctx)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		cd.Run(ctx)
		cancel()
	}()
	err := run(ctx)
	cancel()
	<-done
	return err
}
