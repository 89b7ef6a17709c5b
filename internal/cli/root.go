// Package cli is the shaper command line: one cobra command per verb, each
// built by a newCmdX function from a Factory (streams, environment), with
// its flags in an options struct and its work in an xRun function, so that
// commands can be tested by feeding arguments and reading output.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/shaperhq/shaper/config"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/metrics"
)

// Version is set at build time with -ldflags "-X ...cli.Version=v1.2.3".
var Version = "dev"

// Factory is what every command gets from its surroundings.
type Factory struct {
	In     io.Reader
	Out    io.Writer
	ErrOut io.Writer
	// LookupEnv reads the environment; tests pass their own.
	LookupEnv func(string) (string, bool)
	// BuildDeps lists the modules the binary was built with; nil reads
	// the running binary's build info (runtime/debug.ReadBuildInfo).
	BuildDeps func() []*debug.Module

	// Set by the root command's persistent flags.
	redisURL  string
	logLevel  string
	logFormat string
}

// Main runs the shaper command line and returns the process's exit code.
func Main(ctx context.Context, args []string, in io.Reader, out, errOut io.Writer) int {
	f := &Factory{In: in, Out: out, ErrOut: errOut, LookupEnv: os.LookupEnv}
	return f.execute(ctx, args)
}

// execute runs one command line and turns its error into an exit code.
// Cobra prints nothing itself (the root silences errors and usage), so
// each error reaches stderr once, from here, unless the command already
// explained it and returned a bare exitCode.
func (f *Factory) execute(ctx context.Context, args []string) int {
	root := NewRootCmd(f)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ec exitCode
	if errors.As(err, &ec) {
		return int(ec)
	}
	fmt.Fprintf(f.ErrOut, "shaper: %v\n", err)
	var ce codedError
	if errors.As(err, &ce) {
		return ce.code
	}
	return 1
}

// exitCode ends the process with a code after the command printed its own
// explanation.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// codedError is an error printed as any other, that ends the process with
// its own code rather than 1.
type codedError struct {
	code int
	err  error
}

func (e codedError) Error() string { return e.err.Error() }
func (e codedError) Unwrap() error { return e.err }

// NewRootCmd builds the command tree.
func NewRootCmd(f *Factory) *cobra.Command {
	root := &cobra.Command{
		Use:   "shaper",
		Short: "Call rate-limited third-party APIs at their limit, from any number of workers",
		Long: `shaper queues calls bound for rate-limited third-party APIs in Redis and
drains each upstream's queue at a strict leaky-bucket rate, however many
worker replicas run. An enqueue API with per-key token-bucket admission takes
jobs in; the status command shows drain rates, backlog and time to drain.

Start with "shaper dev": everything in one process, no setup.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	buildVersion, _, _ := metrics.Build()
	root.Version = shownVersion(Version, buildVersion)
	root.SetIn(f.In)
	root.SetOut(f.Out)
	root.SetErr(f.ErrOut)
	pf := root.PersistentFlags()
	pf.StringVar(&f.redisURL, "redis", "", "Redis URL, overriding the config's redis section (also $SHAPER_REDIS_URL)")
	pf.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	pf.StringVar(&f.logFormat, "log-format", "text", "log format: text or json")

	root.AddCommand(
		newCmdDev(f),
		newCmdServe(f),
		newCmdWork(f),
		newCmdStatus(f),
		newCmdEnqueue(f),
		newCmdJobs(f),
		newCmdSchedules(f),
		newCmdPause(f),
		newCmdResume(f),
		newCmdLimits(f),
		newCmdConfig(f),
		newCmdVersion(f),
	)
	addCompletionCmd(root)
	return root
}

// checkAsynq refuses to start a command that runs the store (serve, work,
// dev) when the binary links an asynq whose Redis layout the store does
// not know; queue.New and dispatcher.New would refuse too, but only after
// the config is read and Redis dialled.
func (f *Factory) checkAsynq() error {
	var deps []*debug.Module
	if f.BuildDeps != nil {
		deps = f.BuildDeps()
	} else if bi, ok := debug.ReadBuildInfo(); ok {
		deps = bi.Deps
	}
	if err := jobstore.CheckAsynq(deps); err != nil {
		return fmt.Errorf("refusing to start: %w", err)
	}
	return nil
}

// redisOverride is --redis, else $SHAPER_REDIS_URL.
func (f *Factory) redisOverride() string {
	if f.redisURL != "" {
		return f.redisURL
	}
	if v, ok := f.LookupEnv("SHAPER_REDIS_URL"); ok {
		return v
	}
	return ""
}

// logger builds the process's logger from the global flags.
func (f *Factory) logger() (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", f.logLevel)
	}
	opts := &slog.HandlerOptions{Level: level}
	var log *slog.Logger
	switch strings.ToLower(f.logFormat) {
	case "text":
		log = slog.New(slog.NewTextHandler(f.ErrOut, opts))
	case "json":
		log = slog.New(slog.NewJSONHandler(f.ErrOut, opts))
	default:
		return nil, fmt.Errorf("--log-format %q: want text or json", f.logFormat)
	}
	routeRedisLogs(log)
	routeStdLogs(log)
	return log, nil
}

// configPath is --config when given, else $SHAPER_CONFIG, else "".
func (f *Factory) configPath(flag string) string {
	if flag != "" {
		return flag
	}
	v, _ := f.LookupEnv("SHAPER_CONFIG")
	return v
}

// errNoConfig names both ways to give a config.
var errNoConfig = errors.New("--config FILE (or $SHAPER_CONFIG) is required")

// loadConfig reads and validates the config file named by --config (the
// flag's value, passed as path) or else $SHAPER_CONFIG.
func (f *Factory) loadConfig(path string) (*config.Config, error) {
	path = f.configPath(path)
	if path == "" {
		return nil, errNoConfig
	}
	return config.Load(path, f.LookupEnv)
}

// redisClient connects to the config's Redis (or the override) and checks
// that it answers.
func (f *Factory) redisClient(ctx context.Context, cfg *config.Config) (redis.UniversalClient, error) {
	rdb, err := cfg.Redis.NewClient(f.redisOverride())
	if err != nil {
		return nil, err
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("redis does not answer: %w", err)
	}
	return rdb, nil
}
