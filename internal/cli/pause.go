package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/shaperhq/shaper/queue"
	"github.com/shaperhq/shaper/status"
)

type pauseOptions struct {
	configPath string
	duration   time.Duration
	api        apiFlags
}

func newCmdPause(f *Factory) *cobra.Command {
	opts := &pauseOptions{}
	cmd := &cobra.Command{
		Use:   "pause NAME [--for D]",
		Short: "Pause one upstream for every worker replica",
		Long: `Pause one upstream fleet-wide: no replica sends to it until the pause ends
or "shaper resume" lifts it. Jobs keep queueing; workers hold or hand back
the jobs they have, spending no attempts. Without --for the pause lasts
until resumed.

Works directly on Redis with --config, or through the API with --api and an
admin key (--api-key or $SHAPER_API_KEY).`,
		Example: `  shaper pause stripe --for 10m --config shaper.yaml
  shaper pause openai --api http://localhost:8080 --api-key "$ADMIN_KEY"`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return pauseRun(cmd.Context(), f, opts, args[0], true)
		},
	}
	cmd.Flags().StringVarP(&opts.configPath, "config", "c", "", "config file (YAML), to pause through Redis (default $SHAPER_CONFIG)")
	cmd.Flags().DurationVar(&opts.duration, "for", 0, "how long to pause (default: until resumed)")
	opts.api.register(cmd)
	cmd.ValidArgsFunction = argsCompleter(f.upstreamCompleter(&opts.configPath, &opts.api))
	return cmd
}

func newCmdResume(f *Factory) *cobra.Command {
	opts := &pauseOptions{}
	cmd := &cobra.Command{
		Use:   "resume NAME",
		Short: "Lift a pause (or an upstream's pushback block) at once",
		Long: `Lift any pause or pushback block on one upstream: every replica may send to
it again at its configured rate.`,
		Example: `  shaper resume stripe --config shaper.yaml
  shaper resume openai --api http://localhost:8080`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return pauseRun(cmd.Context(), f, opts, args[0], false)
		},
	}
	cmd.Flags().StringVarP(&opts.configPath, "config", "c", "", "config file (YAML), to resume through Redis (default $SHAPER_CONFIG)")
	opts.api.register(cmd)
	cmd.ValidArgsFunction = argsCompleter(f.upstreamCompleter(&opts.configPath, &opts.api))
	return cmd
}

func pauseRun(ctx context.Context, f *Factory, opts *pauseOptions, name string, pause bool) error {
	if opts.duration < 0 {
		return fmt.Errorf("--for %v: must be positive", opts.duration)
	}
	if opts.duration > status.Indefinitely {
		return fmt.Errorf("--for %v: at most a year; leave --for out to pause until resumed", opts.duration)
	}
	// Flags win over the environment, and --config over --api.
	path := opts.configPath
	if path == "" && opts.api.api == "" {
		path = f.configPath("")
	}
	if path == "" && opts.api.url(f) == "" {
		return errors.New("give --config FILE or $SHAPER_CONFIG (through Redis), or --api URL or $SHAPER_API_URL (through the API)")
	}
	if path == "" {
		c, err := opts.api.client(f)
		if err != nil {
			return err
		}
		if pause {
			_, err = c.Pause(ctx, name, opts.duration)
		} else {
			_, err = c.Resume(ctx, name)
		}
		if err != nil {
			return err
		}
		return reportPause(f, name, pause, opts.duration)
	}
	st, done, err := f.upstreamStore(ctx, path, name)
	if err != nil {
		return err
	}
	defer done()
	if pause {
		_, err = st.Pause(ctx, name, opts.duration, "paused from the command line")
	} else {
		_, err = st.Resume(ctx, name)
	}
	if err != nil {
		return err
	}
	return reportPause(f, name, pause, opts.duration)
}

func reportPause(f *Factory, name string, pause bool, d time.Duration) error {
	switch {
	case !pause:
		fmt.Fprintf(f.Out, "resumed %s\n", name)
	case d == 0:
		fmt.Fprintf(f.Out, "paused %s until resumed\n", name)
	default:
		fmt.Fprintf(f.Out, "paused %s for %v\n", name, d)
	}
	return nil
}

// upstreamStore reaches upstream name's state in Redis as the config at
// path names it, for the commands that change it without the API (pause,
// resume, limits); done closes what it opened.
func (f *Factory) upstreamStore(ctx context.Context, path, name string) (_ *status.Reader, done func(), _ error) {
	cfg, err := f.loadConfig(path)
	if err != nil {
		return nil, nil, err
	}
	if _, ok := cfg.Upstreams[name]; !ok {
		return nil, nil, fmt.Errorf("no upstream %q in %s (have: %v)", name, path, cfg.UpstreamNames())
	}
	rdb, err := f.redisClient(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	q, err := queue.New(rdb, queueConfig(cfg))
	if err != nil {
		rdb.Close()
		return nil, nil, err
	}
	st, err := status.NewReader(rdb, q, cfg.Redis.Prefix)
	if err != nil {
		q.Close()
		rdb.Close()
		return nil, nil, err
	}
	return st, func() { q.Close(); rdb.Close() }, nil
}
