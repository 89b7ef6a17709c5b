package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/shaperhq/shaper/client"
	"github.com/shaperhq/shaper/queue"
	"github.com/shaperhq/shaper/status"
)

type statusOptions struct {
	configPath string
	api        apiFlags
	json       bool
	watch      bool
	interval   time.Duration
	upstreams  []string
}

func newCmdStatus(f *Factory) *cobra.Command {
	opts := &statusOptions{}
	cmd := &cobra.Command{
		Use:   "status (--config FILE | --api URL) [--json] [--watch]",
		Short: "Show each upstream's limits, drain rate, backlog and time to drain",
		Long: `Show, per upstream and across all replicas: the configured limits, the rate
jobs were sent at over the last 10 and 60 seconds, the backlog by lane, jobs
in flight, retrying and dead, whether the upstream is paused (and until
when), and how long the backlog takes to drain: at the limits while the
pacer is what holds it back (right from the first look, where the 10 s
rate still counts the idle seconds before the drain), else at the rate
observed lately, marked "(observed rate)": a full concurrency cap, a slow
upstream or too few workers set the pace then. Below
the table, an upstream whose jobs carry partitions gets a line with how many
partitions have backlog and the busiest of them.

With --config (or $SHAPER_CONFIG) everything comes from Redis: workers
record what they send there, so status needs no running worker or API. With
--api URL and --api-key (or $SHAPER_API_URL and $SHAPER_API_KEY) it reads a
running "shaper serve" or "shaper dev" through GET /v1/upstreams instead, and
needs no config. A --config flag wins over --api, and flags over the
environment. --json prints the same fields as
GET /v1/upstreams, stable for scripts. --watch redraws in place until
interrupted; when stdout is not a terminal it prints plain snapshots, a
blank line apart, with no escape codes.`,
		Example: `  shaper status --config shaper.yaml
  shaper status --config shaper.yaml --watch --interval 1s
  shaper status --config shaper.yaml --json --upstream stripe | jq .upstreams[0].drain_rate
  shaper status --api http://localhost:8080 --api-key "$KEY" --watch
  SHAPER_CONFIG=/etc/shaper.yaml shaper status`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return statusRun(cmd.Context(), f, opts)
		},
	}
	cmd.Flags().StringVarP(&opts.configPath, "config", "c", "", "config file (YAML) (default $SHAPER_CONFIG)")
	cmd.Flags().BoolVar(&opts.json, "json", false, "print JSON")
	cmd.Flags().BoolVarP(&opts.watch, "watch", "w", false, "refresh in place until interrupted")
	cmd.Flags().DurationVar(&opts.interval, "interval", 2*time.Second, "refresh interval for --watch")
	cmd.Flags().StringArrayVar(&opts.upstreams, "upstream", nil, "show only this upstream (repeatable)")
	opts.api.register(cmd)
	cmd.RegisterFlagCompletionFunc("upstream", f.upstreamCompleter(&opts.configPath, &opts.api))
	return cmd
}

func statusRun(ctx context.Context, f *Factory, opts *statusOptions) error {
	if opts.interval < 100*time.Millisecond {
		return fmt.Errorf("--interval %v: must be at least 100ms", opts.interval)
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	read, done, err := statusSource(ctx, f, opts)
	if err != nil {
		return err
	}
	defer done()
	// Redraw in place only on a terminal; a pipe or file gets plain
	// snapshots, a blank line apart, with no escape codes to strip.
	redraw := isTerminal(f.Out)
	for first := true; ; first = false {
		all, err := read(ctx)
		if err != nil {
			if ctx.Err() != nil && opts.watch {
				return nil
			}
			return err
		}
		if opts.watch && !opts.json {
			switch {
			case redraw:
				// Home the cursor and clear, as top does.
				fmt.Fprint(f.Out, "\x1b[H\x1b[2J")
			case !first:
				fmt.Fprintln(f.Out)
			}
			fmt.Fprintf(f.Out, "shaper status — %s (every %v, Ctrl-C to stop)\n\n", time.Now().Format("15:04:05"), opts.interval)
		}
		if opts.json {
			enc := json.NewEncoder(f.Out)
			if !opts.watch {
				enc.SetIndent("", "  ")
			}
			if err := enc.Encode(map[string]any{"upstreams": all}); err != nil {
				return err
			}
		} else {
			printStatus(f.Out, all, time.Now())
		}
		if !opts.watch {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(opts.interval):
		}
	}
}

// statusSource picks where status reads from: Redis through the config
// (--config, else --api, else $SHAPER_CONFIG, else $SHAPER_API_URL), or a
// running API. done releases what it opened.
func statusSource(ctx context.Context, f *Factory, opts *statusOptions) (read func(context.Context) ([]status.Upstream, error), done func(), err error) {
	path := opts.configPath
	if path == "" && opts.api.api == "" {
		path = f.configPath("")
	}
	if path == "" && opts.api.url(f) != "" {
		c, err := opts.api.client(f)
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context) ([]status.Upstream, error) { return remoteStatus(ctx, c, opts.upstreams) }, func() {}, nil
	}
	if path == "" {
		return nil, nil, errors.New("--config FILE (or $SHAPER_CONFIG) is required, or --api URL (or $SHAPER_API_URL) to read a running API")
	}
	cfg, err := f.loadConfig(path)
	if err != nil {
		return nil, nil, err
	}
	if _, err := selectUpstreams(cfg, opts.upstreams); err != nil {
		return nil, nil, err
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
	names := opts.upstreams
	if len(names) == 0 {
		names = st.Names()
	}
	read = func(ctx context.Context) ([]status.Upstream, error) {
		var all []status.Upstream
		for _, n := range names {
			u, err := st.Upstream(ctx, n)
			if err != nil {
				return nil, err
			}
			all = append(all, u)
		}
		return all, nil
	}
	return read, func() { q.Close(); rdb.Close() }, nil
}

// remoteStatus reads the named upstreams (all when none are named) from a
// running API. The API's JSON is the one status --json prints, so it is
// decoded into the same type the table is drawn from.
func remoteStatus(ctx context.Context, c *client.Client, names []string) ([]status.Upstream, error) {
	var got []client.UpstreamStatus
	if len(names) == 0 {
		all, err := c.Upstreams(ctx)
		if err != nil {
			return nil, err
		}
		got = all
	}
	for _, n := range names {
		u, err := c.Upstream(ctx, n)
		if err != nil {
			return nil, err
		}
		got = append(got, *u)
	}
	b, err := json.Marshal(got)
	if err != nil {
		return nil, err
	}
	var all []status.Upstream
	if err := json.Unmarshal(b, &all); err != nil {
		return nil, fmt.Errorf("read the API's upstreams: %w", err)
	}
	return all, nil
}

// printStatus renders statuses as a table, one upstream per row, then a
// line per upstream whose partitions have backlog.
func printStatus(w io.Writer, all []status.Upstream, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "UPSTREAM\tLIMITS\tRATE 10s\tRATE 60s\tBACKLOG\tIN FLIGHT\tRETRYING\tDEAD\tPAUSED\tTIME TO DRAIN")
	for _, u := range all {
		var limits []string
		for _, l := range u.Limits {
			limits = append(limits, l.Description)
		}
		backlog := fmt.Sprint(u.Backlog.Total)
		if len(u.Backlog.Lanes) > 1 {
			var lanes []string
			for lane, c := range u.Backlog.Lanes {
				lanes = append(lanes, fmt.Sprintf("%s=%d", lane, c.Backlog()))
			}
			sort.Strings(lanes)
			backlog += " (" + strings.Join(lanes, " ") + ")"
		}
		paused := "-"
		if u.PausedUntil != nil {
			if u.UntilResumed(now) {
				paused = "until resumed"
			} else {
				paused = "for " + humanDuration(u.PausedUntil.Sub(now))
			}
			if u.PauseReason != "" {
				paused += " (" + u.PauseReason + ")"
			}
		}
		drainTime := "-"
		switch {
		case u.PausedUntil != nil:
			drainTime = "paused"
		case u.TimeToDrainSeconds != nil:
			drainTime = humanDuration(time.Duration(*u.TimeToDrainSeconds * float64(time.Second)))
			if u.TimeToDrainBasis == status.BasisObserved {
				drainTime += " (observed rate)"
			}
		case u.Backlog.Total > 0:
			drainTime = "stalled"
			if u.AtLimitSeconds > 0 {
				drainTime += fmt.Sprintf(" (%s at the limit)", humanDuration(time.Duration(u.AtLimitSeconds*float64(time.Second))))
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", u.Name, strings.Join(limits, " + "),
			perSecond(u.DrainRate.Last10s), perSecond(u.DrainRate.Last60s), backlog, u.InFlight, u.Retrying, u.Dead, paused, drainTime)
	}
	tw.Flush()
	for _, u := range all {
		for _, line := range limitLines(u) {
			fmt.Fprintf(w, "%s: %s\n", u.Name, line)
		}
		if line := heldLine(u); line != "" {
			fmt.Fprintf(w, "%s: %s\n", u.Name, line)
		}
		if line := partitionsLine(u.Partitions); line != "" {
			fmt.Fprintf(w, "%s: %s\n", u.Name, line)
		}
		if u.ProxyWaiting > 0 {
			fmt.Fprintf(w, "%s: proxied calls waiting for their slot: %d\n", u.Name, u.ProxyWaiting)
		}
	}
}

// heldLine reads "scheduled 43, waiting for: pause 40, limit 3" for an
// upstream with jobs held back, or "" for none: the jobs GET /v1/jobs/{id}
// shows as scheduled with a waiting_for.
func heldLine(u status.Upstream) string {
	var parts []string
	for _, what := range []string{queue.WaitingPause, queue.WaitingPushback, queue.WaitingLimit} {
		if n := u.WaitingFor[what]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", what, n))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return fmt.Sprintf("scheduled %d, waiting for: %s", u.Scheduled, strings.Join(parts, ", "))
}

// limitLines say where the fleet's pace differs from the configured
// limits the table shows: "adaptive: pacing 37.5 per 1s (ceiling 100)"
// for each adaptive limit, and "stated 40 per 1s, configured 100 per 1s"
// for each limit the upstream states. Requests go without a unit, as
// people quote rates; other units are named.
func limitLines(u status.Upstream) []string {
	var lines []string
	unit := func(cost string) string {
		if cost == "" {
			return ""
		}
		return " " + cost
	}
	for _, l := range u.Limits {
		if l.Source == status.SourceAdaptive {
			lines = append(lines, fmt.Sprintf("adaptive: pacing %s%s per %s (ceiling %d)", rateNum(l.EffectiveRate), unit(l.Cost), l.Per, l.Rate))
		}
	}
	if o := u.Override; o != nil {
		// An operator's limits are what the table shows.
		conf := make([]string, len(o.Configured))
		for i, l := range o.Configured {
			conf[i] = fmt.Sprintf("%d%s per %s", l.Rate, unit(l.Cost), l.Per)
		}
		lines = append(lines, fmt.Sprintf("source: operator, since %s (configured %s; shaper limits reset %s)",
			o.Since.Format(time.RFC3339), strings.Join(conf, ", "), u.Name))
	}
	for _, s := range u.StatedLimits {
		line := fmt.Sprintf("stated %d%s per %s", s.Rate, unit(s.Cost), s.Per)
		// Compare with the configured limit it caps: same units, and the
		// same window when there is one.
		var match *status.Limit
		for i, l := range u.Limits {
			if l.Cost == s.Cost && (match == nil || l.Per == s.Per && match.Per != s.Per) {
				match = &u.Limits[i]
			}
		}
		if match != nil {
			line += fmt.Sprintf(", configured %d%s per %s", match.Rate, unit(match.Cost), match.Per)
		}
		lines = append(lines, line)
	}
	return lines
}

// rateNum writes a rate with at most one decimal: 40, 37.5, 33.3.
func rateNum(r float64) string {
	return strconv.FormatFloat(math.Round(r*10)/10, 'f', -1, 64)
}

// partitionsLine reads "partitions with backlog: N (top: a 150, b 3, …)",
// or "" when no partition has backlog. The table has no column for it: a
// partition list does not fit one, and most upstreams have none. A
// partition that could be misread in the list (a space, a comma, a quote)
// is quoted.
func partitionsLine(p status.Partitions) string {
	if p.WithBacklog <= 0 {
		return ""
	}
	line := fmt.Sprintf("partitions with backlog: %d", p.WithBacklog)
	if len(p.Top) == 0 {
		return line
	}
	top := make([]string, 0, len(p.Top)+1)
	for _, t := range p.Top {
		name := t.Partition
		if strings.ContainsAny(name, " ,\"") {
			name = strconv.Quote(name)
		}
		top = append(top, fmt.Sprintf("%s %d", name, t.Backlog))
	}
	if p.WithBacklog > int64(len(p.Top)) {
		top = append(top, "…")
	}
	return line + " (top: " + strings.Join(top, ", ") + ")"
}

func perSecond(r float64) string {
	switch {
	case r == 0:
		return "0/s"
	case r < 10:
		return fmt.Sprintf("%.2f/s", r)
	}
	return fmt.Sprintf("%.1f/s", r)
}

// humanDuration rounds a duration for people: 0s, 850ms, 12s, 3m20s, 2h5m,
// 42d. Each unit is chosen after rounding, so 59m59.6s reads 1h0m.
func humanDuration(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	if r := d.Round(time.Second); r < time.Hour {
		return r.String()
	}
	if r := d.Round(time.Minute); r < 1000*time.Hour {
		return strings.TrimSuffix(r.String(), "0s")
	}
	return fmt.Sprintf("%.0fd", math.Round(d.Hours()/24))
}

// isTerminal reports whether w is a terminal (a character device), where
// escape codes may redraw the screen.
func isTerminal(w io.Writer) bool {
	file, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := file.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
