package cli

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/spf13/cobra"

	"github.com/shaperhq/shaper"
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

It prints the API key (random unless --api-key is given), the link to the
status page (/ui/, with the key in the link's #fragment) and curl lines that
work as printed. Callbacks (a job's callback_url) to localhost, 127.0.0.1 and [::1], on any
port, are delivered, signed with a random secret it also prints. Data lives in memory and is gone when the process ends;
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
callbacks:
  allowed_hosts: ["localhost:*", "127.0.0.1:*", "[::1]:*"]
  secret_env: SHAPER_DEV_CALLBACK_SECRET
`

func devRun(ctx context.Context, f *Factory, opts *devOptions) error {
	if err := f.checkAsynq(); err != nil {
		return err
	}
	if opts.demoRate < 1 || opts.demoRate > 10000 {
		return fmt.Errorf("--demo-rate %d: must be between 1 and 10000", opts.demoRate)
	}
	log, err := f.logger()
	if err != nil {
		return err
	}
	key, err := devAPIKey(opts.apiKey)
	if err != nil {
		return err
	}
	cbSecret := devCallbackSecret()
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	redisURL, storeName, stopStore, err := startDevStore(f.redisOverride())
	if err != nil {
		return err
	}
	defer stopStore()
	fake, demoURL, stopDemo, err := startDemoUpstream(opts.demoRate)
	if err != nil {
		return err
	}
	defer stopDemo()
	cfg, keys, err := devConfigFor(f, key, cbSecret, redisURL, opts.listen, demoURL, opts.demoRate)
	if err != nil {
		return err
	}
	secrets, err := cfg.ResolveCallbackSecrets(devEnv(f, key, cbSecret))
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
	defer followLimits(ctx, parts.st, log)()
	d, err := dispatcher.New(rdb, dispatcher.Config{
		Upstreams:       []shaper.Upstream{cfg.Upstreams["demo"].Shaper()},
		ShutdownTimeout: time.Duration(cfg.Work.ShutdownTimeout),
		Prefix:          cfg.Redis.Prefix,
		Logger:          log,
		Metrics:         m,
	})
	if err != nil {
		return err
	}
	// Callbacks to this machine are delivered, signed with a secret the
	// banner prints, so a newcomer can watch one arrive.
	cd, closeDeliverer, err := newDeliverer(rdb, cfg, secrets, m, log)
	if err != nil {
		return err
	}
	defer closeDeliverer()
	ln, err := net.Listen("tcp", opts.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", opts.listen, err)
	}
	runCtx, stopRunner := context.WithCancel(ctx)
	var schedWG sync.WaitGroup
	defer schedWG.Wait()
	defer stopRunner()
	if err := startSchedules(runCtx, &schedWG, rdb, cfg, parts.server, m, log); err != nil {
		ln.Close()
		return err
	}
	printDevBanner(f, ln.Addr(), key, cbSecret, storeName, demoURL, opts.demoRate)

	work := func(ctx context.Context) error { return runDeliverer(ctx, cd, d.Run) }
	err = runAPIAndWorkers(ctx, work, func(ctx context.Context) error {
		return runAPI(ctx, parts, cfg, ln, time.Duration(cfg.API.ShutdownTimeout), log)
	})
	fmt.Fprintf(f.ErrOut, "\ndemo upstream: %s\n", fake.Report())
	return err
}

// devAPIKey is the key dev's API accepts: --api-key, else a random one.
func devAPIKey(given string) (string, error) {
	if given == "" {
		var b [16]byte
		rand.Read(b[:])
		return "dev_" + hex.EncodeToString(b[:]), nil
	}
	if strings.ContainsAny(given, " \t\r\n") {
		return "", errors.New("--api-key must not contain whitespace")
	}
	return given, nil
}

// startDevStore gives the Redis to use and how to describe it: the --redis
// override when there is one, else an in-memory miniredis in this process
// that stop shuts down.
func startDevStore(override string) (url, name string, stop func(), err error) {
	if override != "" {
		return override, "a real Redis at " + override, func() {}, nil
	}
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		return "", "", nil, fmt.Errorf("embedded store: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		// miniredis only expires keys when told time has passed.
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				mr.FastForward(time.Second)
			}
		}
	}()
	stop = func() {
		cancel()
		<-done
		mr.Close()
	}
	return "redis://" + mr.Addr() + "/0", "an embedded in-memory store (miniredis)", stop, nil
}

// startDemoUpstream serves the fake third-party API of package fakeupstream
// (the one examples/thirdparty runs on its own) on a loopback port, allowing
// rate requests per second, until stop.
func startDemoUpstream(rate int64) (fake *fakeupstream.Server, url string, stop func(), err error) {
	fake, err = fakeupstream.New(fakeupstream.Config{Algorithm: fakeupstream.SlidingLog, Rate: rate, Per: time.Second,
		Style: fakeupstream.StylePlain, Latency: 20 * time.Millisecond, Jitter: 30 * time.Millisecond})
	if err != nil {
		return nil, "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", nil, err
	}
	hs := &http.Server{Handler: fake, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		hs.Serve(ln)
	}()
	stop = func() {
		hs.Close()
		<-done
	}
	return fake, "http://" + ln.Addr().String(), stop, nil
}

// devCallbackSecret is a random Standard Webhooks secret for dev's
// callbacks.
func devCallbackSecret() string {
	var b [24]byte
	rand.Read(b[:])
	return "whsec_" + base64.StdEncoding.EncodeToString(b[:])
}

// devEnv is the environment dev's built-in config reads: its API key and
// callback secret, then the process's.
func devEnv(f *Factory, key, cbSecret string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		switch name {
		case "SHAPER_DEV_KEY":
			return key, true
		case "SHAPER_DEV_CALLBACK_SECRET":
			return cbSecret, true
		}
		return f.LookupEnv(name)
	}
}

// devConfigFor parses dev's built-in config. The API key and the callback
// secret reach it through key_env and secret_env, as a real config's do,
// without touching the environment.
func devConfigFor(f *Factory, key, cbSecret, redisURL, listen, demoURL string, rate int64) (*config.Config, []config.APIKey, error) {
	env := devEnv(f, key, cbSecret)
	cfg, err := config.Parse([]byte(fmt.Sprintf(devConfig, redisURL, listen, demoURL, rate)), env)
	if err != nil {
		return nil, nil, fmt.Errorf("dev config: %w", err)
	}
	keys, err := cfg.ResolveKeys(env)
	if err != nil {
		return nil, nil, err
	}
	return cfg, keys, nil
}

// runAPIAndWorkers runs the workers and serves the API on ln until ctx ends
// or either stops, then stops the other and waits for it.
func runAPIAndWorkers(ctx context.Context, work, serve func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 2)
	go func() { errs <- work(ctx) }()
	go func() { errs <- serve(ctx) }()
	first := <-errs
	cancel()
	second := <-errs
	return errors.Join(first, second)
}

func printDevBanner(f *Factory, addr net.Addr, key, cbSecret, store, demoURL string, rate int64) {
	host := addr.String()
	if tcp, ok := addr.(*net.TCPAddr); ok && tcp.IP.IsUnspecified() {
		host = fmt.Sprintf("localhost:%d", tcp.Port)
	}
	base := "http://" + host
	fmt.Fprintf(f.Out, `shaper dev is running (Ctrl-C to stop)

  API       %s
  API key   %s
  status    %s/ui/#key=%s (open in a browser; the key after # never leaves it)
  store     %s
  upstream  demo -> %s (a fake API allowing %d requests/s; shaper paces at that rate)
  callbacks to this machine (localhost, 127.0.0.1, [::1]; any port), signed with %s

Enqueue a job:

  curl -s -X POST %s/v1/jobs -H 'Authorization: Bearer %s' -H 'Content-Type: application/json' -d '{"upstream": "demo", "method": "POST", "path": "/v1/hello", "body": "{\"hello\": \"world\"}"}'

Read it back (use the id it printed):

  curl -s %s/v1/jobs/ID -H 'Authorization: Bearer %s'

Watch the upstream drain:

  curl -s %s/v1/upstreams/demo -H 'Authorization: Bearer %s'

Or call it through the proxy, paced with the jobs, and get its answer:

  curl -s -X POST %s/proxy/demo/v1/hello -H 'Authorization: Bearer %s' -H 'Content-Type: application/json' -d '{"hello": "world"}'

`, base, key, base, url.PathEscape(key), store, demoURL, rate, cbSecret, base, key, base, key, base, key, base, key)
}
