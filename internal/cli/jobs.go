package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/shaperhq/shaper/client"
)

type jobsOptions struct {
	configPath string
	api        apiFlags
	json       bool

	// ls
	list client.ListJobsOptions
	all  bool
}

func newCmdJobs(f *Factory) *cobra.Command {
	opts := &jobsOptions{}
	cmd := &cobra.Command{
		Use:   "jobs",
		Short: "List, read, retry and cancel jobs",
		Long: `List, read, retry and cancel jobs, directly on Redis with --config (or
$SHAPER_CONFIG), as the operator: every tenant's jobs. Or through a running
API (shaper serve or shaper dev) with --api URL and --api-key KEY (or
$SHAPER_API_URL and $SHAPER_API_KEY): a key sees and acts on its own
tenant's jobs only, and retry-dead needs an admin key. --config wins over
--api. Tables by default, --json for scripts.`,
		Example: `  shaper jobs ls --upstream stripe --state dead --config shaper.yaml
  shaper jobs ls --upstream demo --api http://localhost:8080 --api-key "$KEY"
  shaper jobs get stripe.default.3fa9c1d2-k4xq7m...
  shaper jobs wait stripe.default.3fa9c1d2-k4xq7m...
  shaper jobs retry stripe.default.3fa9c1d2-k4xq7m...
  shaper jobs retry-dead stripe --api-key "$ADMIN_KEY"`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("unknown command %q for \"shaper jobs\" (have: ls, get, wait, retry, retry-dead, cancel)", args[0])
			}
			return cmd.Help()
		},
	}
	pf := cmd.PersistentFlags()
	pf.StringVarP(&opts.configPath, "config", "c", "", "config file (YAML), to act through Redis on every tenant's jobs (default $SHAPER_CONFIG)")
	pf.StringVar(&opts.api.api, "api", "", "API base URL (default $SHAPER_API_URL)")
	pf.StringVar(&opts.api.apiKey, "api-key", "", "API key (default $SHAPER_API_KEY)")
	pf.BoolVar(&opts.json, "json", false, "print JSON")
	cmd.AddCommand(newCmdJobsList(f, opts), newCmdJobsGet(f, opts), newCmdJobsRetry(f, opts),
		newCmdJobsRetryDead(f, opts), newCmdJobsCancel(f, opts))
	cmd.AddCommand(newCmdJobsWait(f, opts))
	return cmd
}

func newCmdJobsList(f *Factory, opts *jobsOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "ls [--upstream NAME] [--state STATE] [--lane LANE] [--partition P] [--limit N] [--cursor C | --all]",
		Aliases: []string{"list"},
		Short:   "List an upstream's jobs, newest first",
		Long: `List one upstream's jobs, or without --upstream every upstream's one after
another in name order (of the key's tenant through the API, of every
tenant with --config), newest first within each state:
being sent, queued (newest enqueued first), scheduled and retrying (latest
due first), dead and cancelled (latest died first), succeeded (latest
finished first). --state keeps one state: queued, scheduled, active,
retrying, succeeded, dead or cancelled.

One page at a time (--limit, default 50, at most 200): when there is more,
the command prints the cursor of the next page on stderr; pass it back with
--cursor. --all follows every page instead. A page can hold fewer jobs than
--limit and still have a next one: the server bounds each page's work.`,
		Example: `  shaper jobs ls --upstream stripe
  shaper jobs ls --upstream stripe --state dead --all --json | jq -r '.jobs[].id'
  shaper jobs ls --upstream mail --partition example.org --limit 10 --cursor eyJp...`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return jobsListRun(cmd.Context(), f, opts)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&opts.list.Upstream, "upstream", "u", "", "upstream name (default: every upstream, in name order)")
	fl.StringVar((*string)(&opts.list.State), "state", "", "only jobs in this state")
	fl.StringVar(&opts.list.Lane, "lane", "", "only jobs of this lane")
	fl.StringVar(&opts.list.Partition, "partition", "", "only jobs of this partition")
	fl.IntVar(&opts.list.Limit, "limit", 0, "jobs per page, 1 to 200 (default 50)")
	fl.StringVar(&opts.list.Cursor, "cursor", "", "start at this cursor, printed by the page before")
	fl.BoolVar(&opts.all, "all", false, "follow every page")
	cmd.RegisterFlagCompletionFunc("upstream", f.upstreamCompleter(&opts.configPath, &opts.api))
	cmd.RegisterFlagCompletionFunc("state", cobra.FixedCompletions([]cobra.Completion{"queued", "scheduled", "active", "retrying", "succeeded", "dead", "cancelled"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func jobsListRun(ctx context.Context, f *Factory, opts *jobsOptions) error {
	if opts.all && opts.list.Cursor != "" {
		return fmt.Errorf("give --all or --cursor, not both")
	}
	if opts.list.Limit < 0 || opts.list.Limit > 200 {
		return fmt.Errorf("--limit %d: want 1 to 200", opts.list.Limit)
	}
	b, err := opts.openJobs(ctx, f)
	if err != nil {
		return err
	}
	defer b.close()
	var jobs []client.Job
	lo := opts.list
	next := ""
	for {
		page, err := b.list(ctx, lo)
		if err != nil {
			return err
		}
		jobs = append(jobs, page.Jobs...)
		next = page.NextCursor
		if !opts.all || next == "" {
			break
		}
		lo.Cursor = next
	}
	if jobs == nil {
		jobs = []client.Job{}
	}
	if opts.json {
		return writeJSONTo(f.Out, client.JobPage{Jobs: jobs, NextCursor: next})
	}
	printJobTable(f.Out, jobs, time.Now())
	if next != "" {
		fmt.Fprintf(f.ErrOut, "more jobs: add --cursor %s (or list them all with --all)\n", next)
	}
	return nil
}

// printJobTable renders jobs one a row; a long last error is cut.
func printJobTable(w io.Writer, jobs []client.Job, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tLANE\tPARTITION\tATTEMPTS\tCREATED\tLAST ERROR")
	for _, j := range jobs {
		partition := j.Partition
		if partition == "" {
			partition = "-"
		}
		lastErr := j.LastError
		if lastErr == "" {
			lastErr = "-"
		}
		lastErr = strings.Join(strings.Fields(lastErr), " ")
		if r := []rune(lastErr); len(r) > 60 {
			lastErr = string(r[:59]) + "…"
		}
		state := string(j.State)
		if j.WaitingFor != "" {
			state += " (" + j.WaitingFor + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%s ago\t%s\n", j.ID, state, j.Lane, partition, j.Attempts, j.MaxAttempts,
			humanDuration(now.Sub(j.CreatedAt)), lastErr)
	}
	tw.Flush()
}

func newCmdJobsGet(f *Factory, opts *jobsOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "get ID",
		Short: "Show one job: its state, attempts, errors, times and the upstream's answer",
		Example: `  shaper jobs get stripe.default.3fa9c1d2-k4xq7m...
  shaper jobs get stripe.default.3fa9c1d2-k4xq7m... --json | jq .response`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := opts.openJobs(cmd.Context(), f)
			if err != nil {
				return err
			}
			defer b.close()
			job, err := b.get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if opts.json {
				return writeJSONTo(f.Out, job)
			}
			printJobDetail(f.Out, job)
			return nil
		},
	}
}

func newCmdJobsRetry(f *Factory, opts *jobsOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "retry ID...",
		Short: "Queue dead or cancelled jobs again, with fresh attempts",
		Long: `Send dead or cancelled jobs back to their queue under the same ID and
idempotency key: attempts start again from 0, the last error moves to
previous_error, and retried_at records when. A job in any other state is
refused (409), as is one whose sensitive headers were deleted when it
died. For every dead job of an upstream at once, see "shaper jobs retry-dead".`,
		Example: `  shaper jobs retry stripe.default.3fa9c1d2-k4xq7m...
  shaper jobs ls --upstream stripe --state dead --all --json | jq -r '.jobs[].id' | xargs shaper jobs retry`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return eachJob(cmd.Context(), f, opts, args, "retried", jobsBackend.retry)
		},
	}
}

func newCmdJobsCancel(f *Factory, opts *jobsOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "cancel ID...",
		Short: "Cancel jobs that have not been sent",
		Long: `Cancel queued, scheduled or retrying jobs: they are kept among the dead,
marked cancelled, and can be retried. A job being sent or finished is
refused (409).`,
		Example: `  shaper jobs cancel stripe.default.3fa9c1d2-k4xq7m...`,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return eachJob(cmd.Context(), f, opts, args, "cancelled", jobsBackend.cancel)
		},
	}
}

// eachJob acts on each job in turn, printing each outcome; it goes on
// past a refused job and fails at the end if any was refused.
func eachJob(ctx context.Context, f *Factory, opts *jobsOptions, ids []string, verb string, act func(jobsBackend, context.Context, string) (*client.Job, error)) error {
	b, err := opts.openJobs(ctx, f)
	if err != nil {
		return err
	}
	defer b.close()
	failed := 0
	var done []*client.Job
	for _, id := range ids {
		job, err := act(b, ctx, id)
		if err != nil {
			if len(ids) == 1 {
				return err
			}
			fmt.Fprintf(f.ErrOut, "shaper: %v\n", err)
			failed++
			continue
		}
		done = append(done, job)
		if !opts.json {
			fmt.Fprintf(f.Out, "%s %s: %s\n", verb, job.ID, job.State)
		}
	}
	if opts.json {
		if err := writeJSONTo(f.Out, map[string]any{"jobs": done}); err != nil {
			return err
		}
	}
	if failed > 0 {
		// Each failure was printed as it happened.
		return exitCode(1)
	}
	return nil
}

func newCmdJobsRetryDead(f *Factory, opts *jobsOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "retry-dead UPSTREAM",
		Short: "Queue every dead job of an upstream again (admin key)",
		Long: `Send every dead job of one upstream, of every tenant, back to its queue with
fresh attempts, as "shaper jobs retry" does for one; cancelled jobs stay
cancelled. Through the API it needs an admin key. Prints how many jobs
went back, and how many stay dead because the sensitive headers they
need are gone (their side key expired with the job's retention).`,
		Example: `  shaper jobs retry-dead stripe --config shaper.yaml
  shaper jobs retry-dead stripe --api http://localhost:8080 --api-key "$ADMIN_KEY"`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := opts.openJobs(cmd.Context(), f)
			if err != nil {
				return err
			}
			defer b.close()
			res, err := b.retryDead(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if opts.json {
				return writeJSONTo(f.Out, res)
			}
			fmt.Fprintf(f.Out, "retried %d dead jobs of %s\n", res.Retried, args[0])
			if res.Skipped > 0 {
				fmt.Fprintf(f.Out, "left %d dead: the sensitive headers they need are gone, so they cannot be sent again\n", res.Skipped)
			}
			return nil
		},
	}
	cmd.ValidArgsFunction = argsCompleter(f.upstreamCompleter(&opts.configPath, &opts.api))
	return cmd
}

// printJobDetail shows one job, a field a line, leaving out what it lacks.
func printJobDetail(w io.Writer, j *client.Job) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	line := func(name, value string) {
		if value != "" {
			fmt.Fprintf(tw, "%s:\t%s\n", name, value)
		}
	}
	when := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.RFC3339)
	}
	line("id", j.ID)
	line("state", string(j.State))
	line("waiting for", j.WaitingFor)
	line("tenant", j.Tenant)
	line("upstream", j.Upstream)
	line("lane", j.Lane)
	line("partition", j.Partition)
	line("attempts", fmt.Sprintf("%d of %d", j.Attempts, j.MaxAttempts))
	line("idempotency key", j.IdempotencyKey)
	if j.Task != "" {
		line("task", j.Task)
	} else {
		line("request", strings.TrimSpace(j.Method+" "+j.Path))
	}
	line("last error", j.LastError)
	line("created", when(j.CreatedAt))
	line("not before", when(j.NotBefore))
	line("expires", when(j.ExpiresAt))
	line("next attempt", when(j.NextAttemptAt))
	line("last failed", when(j.LastFailedAt))
	line("completed", when(j.CompletedAt))
	if j.Retries > 0 {
		line("retried", fmt.Sprintf("%s (%d times)", when(j.RetriedAt), j.Retries))
	}
	line("previous error", j.PreviousError)
	if j.Response != nil {
		line("response", fmt.Sprintf("%d", j.Response.Status))
	}
	tw.Flush()
	if j.Response != nil && len(j.Response.Body) > 0 {
		body := j.Response.Body
		if len(body) > 2000 {
			body = append(body[:2000:2000], "…"...)
		}
		fmt.Fprintf(w, "%s\n", body)
	}
}

func writeJSONTo(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
