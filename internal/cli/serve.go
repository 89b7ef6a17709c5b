package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/shaperhq/shaper/config"
	"github.com/shaperhq/shaper/metrics"
	"github.com/shaperhq/shaper/queue"
	"github.com/shaperhq/shaper/server"
	"github.com/shaperhq/shaper/status"
	"github.com/shaperhq/shaper/tokenbucket"
)

type serveOptions struct {
	configPath string
	listen     string
}

func newCmdServe(f *Factory) *cobra.Command {
	opts := &serveOptions{}
	cmd := &cobra.Command{
		Use:   "serve --config FILE",
		Short: "Run the enqueue API (admission, jobs, upstream status, metrics)",
		Long: `Run the v1 HTTP API that producers enqueue jobs through. Every API key
passes a token-bucket admission check shared by all replicas through Redis;
jobs are checked against their upstream's config before they are queued.

API keys come from the environment variables the config names (key_env),
never from the file. Run as many replicas as you like behind a load balancer.
SIGINT or SIGTERM stops accepting connections and lets requests in progress
finish (up to api.shutdown_timeout).

Endpoints: POST /v1/jobs, POST /v1/jobs/batch, GET|DELETE /v1/jobs/{id},
GET /v1/upstreams[/{name}], POST /v1/upstreams/{name}/pause|resume (admin),
GET /metrics, /healthz, /readyz; and the proxy, ANY /proxy/{upstream}/{rest}
(each call paced with the upstream's jobs and answered with the upstream's
answer), also at the root of upstreams.NAME.proxy.listen.`,
		Example: `  SHAPER_KEY_BILLING=s3cret shaper serve --config shaper.yaml
  shaper serve --config shaper.yaml --listen 127.0.0.1:9000`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return serveRun(cmd.Context(), f, opts)
		},
	}
	cmd.Flags().StringVarP(&opts.configPath, "config", "c", "", "config file (YAML) (default $SHAPER_CONFIG)")
	cmd.Flags().StringVar(&opts.listen, "listen", "", "override api.listen")
	return cmd
}

// admissionLimit turns the config's capacity and per-second refill (which
// may be fractional) into a token bucket limit.
func admissionLimit(a config.Admission) tokenbucket.Limit {
	r := a.RefillPerSecond
	if r == math.Trunc(r) {
		return tokenbucket.Limit{Capacity: a.Capacity, Refill: int64(r), Per: time.Second}
	}
	// A fractional rate is kept exact to a thousandth per second.
	return tokenbucket.Limit{Capacity: a.Capacity, Refill: int64(math.Round(r * 1000)), Per: 1000 * time.Second}
}

// apiParts are what an API process is made of, built from a config.
type apiParts struct {
	q      *queue.Queue
	st     *status.Reader
	server *server.Server
}

func (p *apiParts) Close() { p.q.Close() }

func buildAPI(rdb redis.UniversalClient, cfg *config.Config, keys []config.APIKey, reg *prometheus.Registry, m *metrics.Metrics, log *slog.Logger) (*apiParts, error) {
	q, err := queue.New(rdb, queueConfig(cfg))
	if err != nil {
		return nil, err
	}
	st, err := status.NewReader(rdb, q, cfg.Redis.Prefix)
	if err != nil {
		q.Close()
		return nil, err
	}
	sc := server.Config{
		Admission:     admissionLimit(cfg.API.Admission),
		OnRedisError:  cfg.API.Admission.OnRedisError,
		MaxBodyBytes:  cfg.API.MaxBodyBytes,
		Prefix:        cfg.Redis.Prefix,
		Logger:        log,
		Metrics:       m,
		Registry:      reg,
		CallbackHosts: cfg.Callbacks.AllowedHosts,
		Horizon:       time.Duration(cfg.Work.Horizon),
	}
	for _, k := range keys {
		sc.Keys = append(sc.Keys, server.Key{Name: k.Name, Tenant: k.Tenant, Admin: k.Admin, Secret: k.Secret})
	}
	srv, err := server.New(rdb, q, st, sc)
	if err != nil {
		q.Close()
		return nil, err
	}
	err = metrics.RegisterBacklog(reg, m, func(ctx context.Context) (map[string]map[string]int64, error) {
		out := map[string]map[string]int64{}
		for _, name := range cfg.UpstreamNames() {
			counts, err := q.Counts(ctx, name)
			if err != nil {
				return nil, err
			}
			out[name] = map[string]int64{}
			for lane, c := range counts {
				out[name][lane] = c.Backlog()
			}
		}
		return out, nil
	})
	if err != nil {
		q.Close()
		return nil, err
	}
	return &apiParts{q: q, st: st, server: srv}, nil
}

func newRegistry() (*prometheus.Registry, *metrics.Metrics) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg, metrics.New(reg)
}

func serveRun(ctx context.Context, f *Factory, opts *serveOptions) error {
	if err := f.checkAsynq(); err != nil {
		return err
	}
	log, err := f.logger()
	if err != nil {
		return err
	}
	cfg, err := f.loadConfig(opts.configPath)
	if err != nil {
		return err
	}
	keys, err := cfg.ResolveKeys(f.LookupEnv)
	if err != nil {
		return err
	}
	// Only workers sign, but a secret missing is told at every start.
	if _, err := cfg.ResolveCallbackSecrets(f.LookupEnv); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ro, err := cfg.Redis.Options(f.redisOverride())
	if err != nil {
		return err
	}
	config.FailFast(ro)
	rdb := redis.NewUniversalClient(ro)
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis does not answer: %w", err)
	}
	warnIfEvicting(ctx, rdb, log)
	reg, m := newRegistry()
	parts, err := buildAPI(rdb, cfg, keys, reg, m, log)
	if err != nil {
		return err
	}
	defer parts.Close()
	defer followLimits(ctx, parts.st, log)()

	listen := cfg.API.Listen
	if opts.listen != "" {
		listen = opts.listen
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", listen, err)
	}
	runCtx, stopRunner := context.WithCancel(ctx)
	var schedWG sync.WaitGroup
	defer schedWG.Wait()
	defer stopRunner()
	if err := startSchedules(runCtx, &schedWG, rdb, cfg, parts.server, m, log); err != nil {
		ln.Close()
		return err
	}
	log.Info("API listening", "addr", ln.Addr().String(), "keys", len(keys), "upstreams", len(cfg.Upstreams), "version", Version)
	return runAPI(ctx, parts, cfg, ln, time.Duration(cfg.API.ShutdownTimeout), log)
}

// apiHTTPServer is the HTTP server of the API. It has no WriteTimeout: a
// long poll (GET /v1/jobs/{id}?wait=, Prefer: wait) answers after up to
// queue.MaxWait, and a write deadline would cut it. ReadTimeout does not:
// net/http clears the read deadline once a request's body has been read.
func apiHTTPServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		IdleTimeout:       120 * time.Second,
	}
}

// serveUntilDone serves h on ln until ctx ends, then shuts down
// gracefully; onShutdown (nil: nothing) runs when the shutdown starts, so
// that long polls answer at once.
func serveUntilDone(ctx context.Context, ln net.Listener, h http.Handler, onShutdown func(), grace time.Duration, log *slog.Logger) error {
	hs := apiHTTPServer(h)
	if onShutdown != nil {
		hs.RegisterOnShutdown(onShutdown)
	}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	log.Info("API shutting down", "grace", grace)
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	err := hs.Shutdown(sctx)
	if serr := <-served; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		return serr
	}
	return err
}

// warnIfEvicting warns when Redis may evict keys to stay under its
// maxmemory: an evicted job is a lost job (or a half-deleted one), so
// shaper wants maxmemory-policy noeviction, under which a full Redis
// refuses writes instead and enqueues fail loudly. A Redis that does not
// allow CONFIG (some managed ones) is not checked, and says so at debug.
func warnIfEvicting(ctx context.Context, rdb redis.UniversalClient, log *slog.Logger) {
	v, err := rdb.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		log.Debug("could not read Redis's maxmemory-policy", "err", err)
		return
	}
	if p, ok := v["maxmemory-policy"]; ok && p != "noeviction" {
		log.Warn("Redis may evict keys, losing jobs: set maxmemory-policy noeviction (see docs/operations.md, Sizing Redis)", "maxmemory-policy", p)
	}
}
