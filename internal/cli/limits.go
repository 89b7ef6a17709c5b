package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/client"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/status"
)

type limitsOptions struct {
	configPath string
	partition  string
	limits     []string
	api        apiFlags
}

func newCmdLimits(f *Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "limits",
		Short: "Change an upstream's limits live, for every replica",
		Long: `Replace an upstream's limits, or one partition's, for every serve and work
replica within a second and without a restart, until reset. The limits are
checked as the config's are; a limit the upstream states still caps them.
See docs/limits.md, "Changing limits live".`,
	}
	cmd.AddCommand(newCmdLimitsSet(f), newCmdLimitsReset(f))
	return cmd
}

func (o *limitsOptions) register(cmd *cobra.Command, what string) {
	cmd.Flags().StringVarP(&o.configPath, "config", "c", "", "config file (YAML), to "+what+" through Redis (default $SHAPER_CONFIG)")
	cmd.Flags().StringVar(&o.partition, "partition", "", "one partition's limits instead of the upstream's")
	o.api.register(cmd)
}

func newCmdLimitsSet(f *Factory) *cobra.Command {
	opts := &limitsOptions{}
	cmd := &cobra.Command{
		Use:   "set UPSTREAM --limit RATE/PER[,cost=NAME][,burst=N][,adaptive] ...",
		Short: "Replace an upstream's (or a partition's) limits for every replica",
		Long: `Replace the configured limits of an upstream, or with --partition those of one
partition, for every replica within a second, until "shaper limits reset".
Give each limit with --limit: RATE/PER as in the config (100/1s, 6000/1m),
then optionally ,cost=NAME (a cost the upstream's limits count), ,burst=N
and ,adaptive (upstream limits on requests only). The new limits replace
all of the old ones: give every limit the upstream should keep.

Works directly on Redis with --config, or through the API with --api and an
admin key (--api-key or $SHAPER_API_KEY).`,
		Example: `  shaper limits set openai --limit 100/1s --limit 400000/1m,cost=tokens --config shaper.yaml
  shaper limits set mail --partition gmail.com --limit 1000/1m --api http://localhost:8080`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return limitsRun(cmd.Context(), f, opts, args[0], true)
		},
	}
	opts.register(cmd, "set them")
	cmd.Flags().StringArrayVar(&opts.limits, "limit", nil, "a limit, RATE/PER[,cost=NAME][,burst=N][,adaptive]; repeat for each")
	cmd.ValidArgsFunction = argsCompleter(f.upstreamCompleter(&opts.configPath, &opts.api))
	return cmd
}

func newCmdLimitsReset(f *Factory) *cobra.Command {
	opts := &limitsOptions{}
	cmd := &cobra.Command{
		Use:   "reset UPSTREAM",
		Short: "Put the configured limits back in force",
		Long: `Put the config's limits of an upstream (or with --partition, of one
partition) back in force for every replica, within a second.`,
		Example: `  shaper limits reset openai --config shaper.yaml
  shaper limits reset mail --partition gmail.com --api http://localhost:8080`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return limitsRun(cmd.Context(), f, opts, args[0], false)
		},
	}
	opts.register(cmd, "reset them")
	cmd.ValidArgsFunction = argsCompleter(f.upstreamCompleter(&opts.configPath, &opts.api))
	return cmd
}

// parseLimitFlag reads one --limit: RATE/PER[,cost=NAME][,burst=N][,adaptive].
func parseLimitFlag(s string) (leaky.Limit, error) {
	parts := strings.Split(s, ",")
	rate, per, ok := strings.Cut(parts[0], "/")
	if !ok {
		return leaky.Limit{}, fmt.Errorf("--limit %q: want RATE/PER, such as 100/1s", s)
	}
	var l leaky.Limit
	var err error
	if l.Rate, err = strconv.ParseInt(rate, 10, 64); err != nil {
		return leaky.Limit{}, fmt.Errorf("--limit %q: rate %q is not a whole number", s, rate)
	}
	if l.Per, err = time.ParseDuration(per); err != nil {
		return leaky.Limit{}, fmt.Errorf("--limit %q: per %q is not a duration such as 1s or 1m", s, per)
	}
	for _, p := range parts[1:] {
		k, v, _ := strings.Cut(p, "=")
		switch k {
		case "cost":
			l.Cost = v
		case "burst":
			if l.Burst, err = strconv.ParseInt(v, 10, 64); err != nil {
				return leaky.Limit{}, fmt.Errorf("--limit %q: burst %q is not a whole number", s, v)
			}
		case "adaptive":
			l.Adaptive = true
		default:
			return leaky.Limit{}, fmt.Errorf("--limit %q: unknown %q (want cost=NAME, burst=N or adaptive)", s, p)
		}
	}
	return l, nil
}

func limitsRun(ctx context.Context, f *Factory, opts *limitsOptions, name string, set bool) error {
	var limits []leaky.Limit
	if set {
		if len(opts.limits) == 0 {
			return errors.New("give at least one --limit RATE/PER (e.g. --limit 100/1s)")
		}
		for _, s := range opts.limits {
			l, err := parseLimitFlag(s)
			if err != nil {
				return err
			}
			limits = append(limits, l)
		}
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
		if err := limitsThroughAPI(ctx, f, opts, name, limits, set); err != nil {
			return err
		}
		return reportLimits(f, name, opts.partition, limits, set)
	}
	st, done, err := f.upstreamStore(ctx, path, name)
	if err != nil {
		return err
	}
	defer done()
	var ps []shaper.Problem
	switch {
	case set && opts.partition != "":
		ps, err = st.PutPartitionLimits(ctx, name, opts.partition, limits)
	case set:
		ps, err = st.PutLimits(ctx, name, limits)
	case opts.partition != "":
		if perr := shaper.CheckPartition(opts.partition); perr != nil {
			return fmt.Errorf("--partition %q: %v", opts.partition, perr)
		}
		err = st.ResetPartitionLimits(ctx, name, opts.partition)
	default:
		err = st.ResetLimits(ctx, name)
	}
	if err != nil {
		return err
	}
	if len(ps) > 0 {
		msgs := make([]string, len(ps))
		for i, p := range ps {
			msgs[i] = p.String()
		}
		return fmt.Errorf("limits of %s not changed: %s", name, strings.Join(msgs, "; "))
	}
	return reportLimits(f, name, opts.partition, limits, set)
}

func limitsThroughAPI(ctx context.Context, f *Factory, opts *limitsOptions, name string, limits []leaky.Limit, set bool) error {
	c, err := opts.api.client(f)
	if err != nil {
		return err
	}
	specs := make([]client.LimitSpec, len(limits))
	for i, l := range limits {
		specs[i] = client.LimitSpec{Rate: l.Rate, Per: l.Per, Cost: l.Cost, Burst: l.Burst, Adaptive: l.Adaptive}
	}
	switch {
	case set && opts.partition != "":
		_, err = c.SetPartitionLimits(ctx, name, opts.partition, specs)
	case set:
		_, err = c.SetLimits(ctx, name, specs)
	case opts.partition != "":
		_, err = c.ResetPartitionLimits(ctx, name, opts.partition)
	default:
		_, err = c.ResetLimits(ctx, name)
	}
	return err
}

func reportLimits(f *Factory, name, partition string, limits []leaky.Limit, set bool) error {
	what := name
	if partition != "" {
		what = fmt.Sprintf("%s partition %q", name, partition)
	}
	if !set {
		fmt.Fprintf(f.Out, "%s is back at its configured limits\n", what)
		return nil
	}
	parts := make([]string, len(limits))
	for i, l := range limits {
		parts[i] = l.String()
	}
	fmt.Fprintf(f.Out, "%s now paces at %s, on every replica within %v\n", what, strings.Join(parts, ", "), leaky.ApplyWithin)
	return nil
}

// followLimits keeps the API's buckets (which enqueues check costs
// against) at the limits operators set, until the returned stop is called.
func followLimits(ctx context.Context, st *status.Reader, log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			if err := st.Follow(ctx); err != nil {
				log.Warn("cannot follow changes of limits", "err", err)
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	return func() { cancel(); wg.Wait() }
}
