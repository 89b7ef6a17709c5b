package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/spf13/cobra"

	"github.com/shaperhq/shaper/config"
	"github.com/shaperhq/shaper/dispatcher"
	"github.com/shaperhq/shaper/fakeupstream"
)

type devOptions struct {
	listen   string
	apiKey   string
	demoRate int64
}

func newCmdDev(f *Factory) *cobra.Command {
	opts := &devOptions{}
	cmd := &cobra.Command{
		Use:   "dev [--listen ADDR] [--api-key KEY]",
		Short: "Run everything in one process with no setup: store, API, workers and a demo upstream",
		Long: `Run shaper in one process with nothing to install or configure: an embedded
Redis-compatible store (or a real Redis with --redis), the enqueue API,
workers, and a built-in upstream named "demo": a fake third-party API that
allows only --demo-rate requests per second and answers 429 beyond that.

It prints the API key (random unless --api-key is given) and curl lines that
work as printed. Data lives in memory and is gone when the process ends;
for anything else run "shaper serve" and "shaper work" against Redis.`,
		Example: `  shaper dev
  shaper dev --listen 127.0.0.1:9090 --api-key devkey
  shaper dev --redis redis://localhost:6379/15`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return devRun(cmd.Context(), f, opts)
		},
	}
	cmd.Flags().StringVar(&opts.listen, "listen", ":8080", "API address")
	cmd.Flags().StringVar(&opts.apiKey, "api-key", "", "API key to accept (default: random)")
	cmd.Flags().Int64Var(&opts.demoRate, "demo-rate", 5, "requests per second the demo upstream allows (shaper paces at this rate)")
	return cmd
}

const devConfig = `
redis: {url: "%s"}
api:
  listen: "%s"
  keys:
    - {name: dev, tenant: dev, key_env: SHAPER_DEV_KEY, admin: true}
  admission: {capacity: 100, refill_per_second: 20}
  shutdown_timeout: 5s
work:
  shutdown_timeout: 5s
upstreams:
  demo:
    base_url: "%s"
    limits: [{rate: %d, per: 1s}]
    concurrency: 10
    timeout: 10s
    max_pending: 10000
    retry: {max_attempts: 5, min_backoff: 500ms, max_backoff: 10s}
    headers: {Authorization: "Bearer demo-upstream-secret"}
    result_retention: 1h
    dead_retention: 1h
`

func devRun(ctx context.Context, f *Factory, opts *devOptions) error {
	if opts.demoRate < 1 || opts.demoRate > 10000 {
		return fmt.Errorf("--demo-rate %d: must be between 1 and 10000", opts.demoRate)
	}
	log, err := f.logger()
	if err != nil {
		return err
	}
	key := opts.apiKey
	if key == "" {
		var b [16]byte
		rand.Read(b[:])
		key = "dev_" + hex.EncodeToString(b[:])
	} else if strings.ContainsAny(key, " \t\r\n") {
		return errors.New("--api-key must not contain whitespace")
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	// The store: a real Redis if asked for, else one in this process.
	redisURL := f.redisOverride()
	storeName := "a real Redis at " + redisURL
	var wg sync.WaitGroup
	bgCtx, cancelBackground := context.WithCancel(context.Background())
	defer func() {
		cancelBackground()
		wg.Wait()
	}()
	if redisURL == "" {
		mr := miniredis.NewMiniRedis()
		if err := mr.Start(); err != nil {
			return fmt.Errorf("embedded store: %w", err)
		}
		defer mr.Close()
		redisURL = "redis://" + mr.Addr() + "/0"
		storeName = "an embedded in-memory store (miniredis)"
		wg.Add(1)
		go func() {
			defer wg.Done()
			// miniredis only expires keys when told time has passed.
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-bgCtx.Done():
					return
				case <-t.C:
					mr.FastForward(time.Second)
				}
			}
		}()
	}

	// The demo upstream: the fake third-party API of package fakeupstream, as in examples/thirdparty.
	fake, err := fakeupstream.New(fakeupstream.Config{Algorithm: fakeupstream.SlidingLog, Rate: opts.demoRate, Per: time.Second,
		Style: fakeupstream.StylePlain, Latency: 20 * time.Millisecond, Jitter: 30 * time.Millisecond})
	if err != nil {
		return err
	}
	demoLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	demoURL := "http://" + demoLn.Addr().String()
	demo := &http.Server{Handler: fake, ReadHeaderTimeout: 5 * time.Second}
	wg.Add(1)
	go func() {
		defer wg.Done()
		demo.Serve(demoLn)
	}()
	defer demo.Close()

	env := func(name string) (string, bool) {
		if name == "SHAPER_DEV_KEY" {
			return key, true
		}
		return f.LookupEnv(name)
	}
	cfg, err := config.Parse([]byte(fmt.Sprintf(devConfig, redisURL, opts.listen, demoURL, opts.demoRate)), env)
	if err != nil {
		return fmt.Errorf("dev config: %w", err)
	}
	keys, err := cfg.ResolveKeys(env)
	if err != nil {
		return err
	}
	rdb, err := cfg.Redis.NewClient("")
	if err != nil {
		return err
	}
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("store does not answer: %w", err)
	}

	reg, m := newRegistry()
	parts, err := buildAPI(rdb, cfg, keys, reg, m, log)
	if err != nil {
		return err
	}
	defer parts.Close()
	d, err := dispatcher.New(rdb, dispatcher.Config{
		Upstreams:       []dispatcher.Upstream{dispatcherUpstream(cfg.Upstreams["demo"])},
		ShutdownTimeout: time.Duration(cfg.Work.ShutdownTimeout),
		Prefix:          cfg.Redis.Prefix,
		Logger:          log,
		Metrics:         m,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", opts.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", opts.listen, err)
	}
	printDevBanner(f, ln.Addr(), key, storeName, demoURL, opts.demoRate)

	errs := make(chan error, 2)
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	go func() { errs <- d.Run(runCtx) }()
	go func() {
		errs <- serveUntilDone(runCtx, ln, parts.server.Handler(), time.Duration(cfg.API.ShutdownTimeout), log)
	}()
	first := <-errs
	cancelRun()
	second := <-errs
	fmt.Fprintf(f.ErrOut, "\ndemo upstream: %s\n", fake.Report())
	return errors.Join(first, second)
}

func printDevBanner(f *Factory, addr net.Addr, key, store, demoURL string, rate int64) {
	host := addr.String()
	if tcp, ok := addr.(*net.TCPAddr); ok && tcp.IP.IsUnspecified() {
		host = fmt.Sprintf("localhost:%d", tcp.Port)
	}
	base := "http://" + host
	fmt.Fprintf(f.Out, `shaper dev is running (Ctrl-C to stop)

  API       %s
  API key   %s
  store     %s
  upstream  demo -> %s (a fake API allowing %d requests/s; shaper paces at that rate)

Enqueue a job:

  curl -s -X POST %s/v1/jobs -H 'Authorization: Bearer %s' -H 'Content-Type: application/json' -d '{"upstream": "demo", "method": "POST", "path": "/v1/hello", "body": "{\"hello\": \"world\"}"}'

Read it back (use the id it printed):

  curl -s %s/v1/jobs/ID -H 'Authorization: Bearer %s'

Watch the upstream drain:

  curl -s %s/v1/upstreams/demo -H 'Authorization: Bearer %s'

`, base, key, store, demoURL, rate, base, key, base, key, base, key)
}
