package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/config"
	"github.com/shaperhq/shaper/dispatcher"
	"github.com/shaperhq/shaper/metrics"
)

type workOptions struct {
	configPath    string
	upstreams     []string
	metricsListen string
}

func newCmdWork(f *Factory) *cobra.Command {
	opts := &workOptions{}
	cmd := &cobra.Command{
		Use:   "work --config FILE [--upstream NAME]...",
		Short: "Run one worker replica that drains the upstreams' queues at their limits",
		Long: `Run one worker replica. It drains every configured upstream (or only those
named with --upstream), reserving each job's send slot in the upstream's
shared leaky bucket so that all replicas together stay within its limits.

Run as many replicas as you like; they coordinate through Redis alone. On
SIGINT or SIGTERM a replica stops taking jobs, hands jobs that are waiting for
their slot back to the queue at once, and lets requests in flight finish
(up to work.shutdown_timeout) before handing the rest back too.

Upstreams served by Go handlers (handler: true) need your own program; see
the dispatcher package. This command skips them unless named, and refuses
them when named.`,
		Example: `  shaper work --config shaper.yaml
  shaper work --config shaper.yaml --upstream stripe --upstream openai
  SHAPER_REDIS_URL=redis://10.0.0.5:6379/0 shaper work --config shaper.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return workRun(cmd.Context(), f, opts)
		},
	}
	cmd.Flags().StringVarP(&opts.configPath, "config", "c", "", "config file (YAML) (default $SHAPER_CONFIG)")
	cmd.Flags().StringArrayVar(&opts.upstreams, "upstream", nil, "drain only this upstream (repeatable)")
	cmd.Flags().StringVar(&opts.metricsListen, "metrics-listen", "", "override work.metrics_listen (\"off\" disables)")
	cmd.RegisterFlagCompletionFunc("upstream", f.upstreamCompleter(&opts.configPath, nil))
	return cmd
}

func workRun(ctx context.Context, f *Factory, opts *workOptions) error {
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
	chosen, err := httpUpstreams(cfg, opts.upstreams, log)
	if err != nil {
		return err
	}
	secrets, err := cfg.ResolveCallbackSecrets(f.LookupEnv)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rdb, err := f.redisClient(ctx, cfg)
	if err != nil {
		return err
	}
	defer rdb.Close()

	reg, m := newRegistry()
	d, err := dispatcher.New(rdb, workerConfig(cfg, chosen, log, m))
	if err != nil {
		return err
	}
	cd, closeDeliverer, err := newDeliverer(rdb, cfg, secrets, m, log)
	if err != nil {
		return err
	}
	defer closeDeliverer()

	// The metrics listener outlives d.Run's shutdown a little, and is
	// stopped and waited for on the way out.
	var wg sync.WaitGroup
	bgCtx, cancelBackground := context.WithCancel(context.Background())
	defer func() {
		cancelBackground()
		wg.Wait()
	}()
	if addr := metricsAddr(cfg, opts.metricsListen); addr != "" {
		if err := serveMetrics(bgCtx, &wg, addr, workerMux(reg, rdb), log); err != nil {
			return err
		}
	}
	jobs, closeJobs, err := workerScheduleJobs(rdb, cfg, m)
	if err != nil {
		return err
	}
	defer closeJobs()
	// The runner stops with ctx, before the deferred waits above.
	runCtx, stopRunner := context.WithCancel(ctx)
	var schedWG sync.WaitGroup
	defer schedWG.Wait()
	defer stopRunner()
	if err := startSchedules(runCtx, &schedWG, rdb, cfg, jobs, m, log); err != nil {
		return err
	}
	log.Info("worker starting", "upstreams", len(chosen), "version", Version)
	err = runDeliverer(ctx, cd, d.Run)
	log.Info("worker stopped")
	return err
}

// httpUpstreams is what this replica drains: the named upstreams (all when
// none are named) that shaper sends over HTTP. An upstream served by a Go
// handler is skipped with a warning, or refused when named outright.
func httpUpstreams(cfg *config.Config, names []string, log *slog.Logger) ([]shaper.Upstream, error) {
	ups, err := selectUpstreams(cfg, names)
	if err != nil {
		return nil, err
	}
	var chosen []shaper.Upstream
	for _, u := range ups {
		if u.Handler {
			if len(names) > 0 {
				return nil, fmt.Errorf("upstream %s is served by a Go handler (handler: true); run it from your own program with dispatcher.Handle", u.Name)
			}
			log.Warn("skipping an upstream served by a Go handler; run it from your own program", "upstream", u.Name)
			continue
		}
		chosen = append(chosen, u.Shaper())
	}
	if len(chosen) == 0 {
		return nil, errors.New("no HTTP upstreams to drain")
	}
	return chosen, nil
}

// workerConfig is the dispatcher's config for a worker replica.
func workerConfig(cfg *config.Config, ups []shaper.Upstream, log *slog.Logger, m *metrics.Metrics) dispatcher.Config {
	return dispatcher.Config{
		Upstreams:       ups,
		Horizon:         time.Duration(cfg.Work.Horizon),
		PollInterval:    time.Duration(cfg.Work.PollInterval),
		ShutdownTimeout: time.Duration(cfg.Work.ShutdownTimeout),
		Prefix:          cfg.Redis.Prefix,
		Logger:          log,
		Metrics:         m,
	}
}

// metricsAddr is where the worker serves /metrics: --metrics-listen over
// work.metrics_listen, "" (and "off") for nowhere.
func metricsAddr(cfg *config.Config, flag string) string {
	addr := cfg.Work.MetricsListen
	if flag != "" {
		addr = flag
	}
	if addr == "off" {
		return ""
	}
	return addr
}

// serveMetrics serves h on addr until ctx ends, in goroutines counted in wg.
// Only a failure to listen is returned; a later serve error is logged.
func serveMetrics(ctx context.Context, wg *sync.WaitGroup, addr string, h http.Handler, log *slog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics listener: %w", err)
	}
	log.Info("metrics listening", "addr", ln.Addr().String())
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics listener failed", "err", err)
		}
	}()
	go func() {
		defer wg.Done()
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		hs.Shutdown(sctx)
		cancel()
	}()
	return nil
}

// workerMux serves /metrics and /healthz (the process is alive and Redis answers).
func workerMux(reg *prometheus.Registry, rdb redis.UniversalClient) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		if err := rdb.Ping(ctx).Err(); err != nil {
			http.Error(w, "redis: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	return mux
}
