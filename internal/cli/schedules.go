package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/shaperhq/shaper/client"
)

type schedulesOptions struct {
	api  apiFlags
	json bool

	// add
	add   client.ScheduleRequest
	job   string
	upJob client.JobRequest
	body  string
}

func newCmdSchedules(f *Factory) *cobra.Command {
	opts := &schedulesOptions{}
	cmd := &cobra.Command{
		Use:   "schedules",
		Short: "List, add, remove, pause and resume schedules (jobs on a cron)",
		Long: `Schedules enqueue a job at each tick of a cron, exactly once however many
shaper replicas run; each run is a job with the idempotency key
schedule:NAME:UNIXTIME of its tick. These commands go through a running API
(shaper serve or shaper dev) with --api URL and --api-key KEY (or
$SHAPER_API_URL and $SHAPER_API_KEY): a key sees and changes its own
tenant's schedules. Schedules declared in the config (schedules:) are
listed too, marked config, and are changed in the config only. Tables by
default, --json for scripts. See docs/schedules.md.`,
		Example: `  shaper schedules add weekly-report --cron "0 8 * * 1" --timezone Europe/Berlin \
    --upstream reports --method POST --path /v1/run --body '{"customer":"c_42"}'
  shaper schedules ls
  shaper schedules get weekly-report --json
  shaper schedules pause weekly-report
  shaper schedules rm weekly-report`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("unknown command %q for \"shaper schedules\" (have: ls, get, add, rm, pause, resume)", args[0])
			}
			return cmd.Help()
		},
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&opts.api.api, "api", "", "API base URL (default $SHAPER_API_URL)")
	pf.StringVar(&opts.api.apiKey, "api-key", "", "API key (default $SHAPER_API_KEY)")
	pf.BoolVar(&opts.json, "json", false, "print JSON")
	cmd.AddCommand(newCmdSchedulesList(f, opts), newCmdSchedulesGet(f, opts), newCmdSchedulesAdd(f, opts),
		newCmdSchedulesRemove(f, opts), newCmdSchedulesPause(f, opts, true), newCmdSchedulesPause(f, opts, false))
	return cmd
}

func newCmdSchedulesList(f *Factory, opts *schedulesOptions) *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the key's tenant's schedules with their next and last runs",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := opts.api.client(f)
			if err != nil {
				return err
			}
			list, err := c.Schedules(cmd.Context())
			if err != nil {
				return err
			}
			if opts.json {
				if list == nil {
					list = []client.Schedule{}
				}
				return writeJSONTo(f.Out, map[string]any{"schedules": list})
			}
			printSchedules(f.Out, list)
			return nil
		},
	}
}

func newCmdSchedulesGet(f *Factory, opts *schedulesOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "get NAME",
		Short: "Show one schedule: its cron, job, next run and last run",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := opts.api.client(f)
			if err != nil {
				return err
			}
			s, err := c.Schedule(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return opts.printOne(f, s)
		},
	}
}

func newCmdSchedulesAdd(f *Factory, opts *schedulesOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "add NAME --cron EXPR (--job JSON | --upstream U [--method M] [--path P] [--body B])",
		Aliases: []string{"create"},
		Short:   "Make a schedule",
		Long: `Make a schedule of the key's tenant. --cron takes 5 fields ("0 8 * * 1"), 6
with a leading seconds field, @every D (whole seconds) or @hourly, @daily,
@weekly, @monthly, @yearly; --timezone an IANA zone (default UTC). The job
is --job, a POST /v1/jobs body as JSON (or @FILE, or @- for stdin), or
built from --upstream, --method, --path and --body; it is checked as an
enqueue is, and the schedule sets its idempotency key.`,
		Example: `  shaper schedules add nightly --cron "30 2 * * *" --timezone Europe/Berlin --upstream reports --path /v1/run
  shaper schedules add digest --cron "@every 1h" --catch-up none --job '{"upstream":"mail","task":"digest"}'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := opts.add
			req.Name = args[0]
			job, err := opts.jobRequest(f, cmd)
			if err != nil {
				return err
			}
			req.Job = job
			c, err := opts.api.client(f)
			if err != nil {
				return err
			}
			s, err := c.CreateSchedule(cmd.Context(), req)
			if err != nil {
				return err
			}
			return opts.printOne(f, s)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&opts.add.Cron, "cron", "", "when it ticks: 5 fields, 6 with seconds, @every D or @hourly… (required)")
	fl.StringVar(&opts.add.Timezone, "timezone", "", "IANA time zone the cron reads in (default UTC)")
	fl.StringVar(&opts.add.CatchUp, "catch-up", "", "ticks missed while no replica ran: last (the default: run the latest once) or none")
	fl.BoolVar(&opts.add.Paused, "paused", false, "make it paused")
	fl.StringVar(&opts.job, "job", "", "the job as a POST /v1/jobs JSON body, @FILE or @- (stdin)")
	fl.StringVar(&opts.upJob.Upstream, "upstream", "", "the job's upstream (without --job)")
	fl.StringVar(&opts.upJob.Method, "method", "", "the job's HTTP method (default GET)")
	fl.StringVar(&opts.upJob.Path, "path", "", "the job's path relative to the upstream's base_url")
	fl.StringVar(&opts.body, "body", "", "the job's body as text")
	cmd.MarkFlagRequired("cron")
	return cmd
}

// jobRequest is the schedule's job from --job or the job flags.
func (o *schedulesOptions) jobRequest(f *Factory, cmd *cobra.Command) (client.JobRequest, error) {
	if o.job == "" {
		if o.upJob.Upstream == "" {
			return client.JobRequest{}, errors.New("give the job: --job JSON (or @FILE), or --upstream with --path")
		}
		j := o.upJob
		if o.body != "" {
			j.Body = []byte(o.body)
		}
		return j, nil
	}
	if o.upJob.Upstream != "" || o.upJob.Method != "" || o.upJob.Path != "" || o.body != "" {
		return client.JobRequest{}, errors.New("--job and --upstream/--method/--path/--body: give one or the other")
	}
	raw := []byte(o.job)
	switch {
	case o.job == "@-":
		b, err := io.ReadAll(io.LimitReader(f.In, 4<<20))
		if err != nil {
			return client.JobRequest{}, fmt.Errorf("--job @-: %w", err)
		}
		raw = b
	case strings.HasPrefix(o.job, "@"):
		b, err := os.ReadFile(o.job[1:])
		if err != nil {
			return client.JobRequest{}, fmt.Errorf("--job: %w", err)
		}
		raw = b
	}
	var j client.JobRequest
	if err := json.Unmarshal(raw, &j); err != nil {
		return client.JobRequest{}, fmt.Errorf("--job: not a job as JSON: %w", err)
	}
	return j, nil
}

func newCmdSchedulesRemove(f *Factory, opts *schedulesOptions) *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"delete"},
		Short:   "Remove schedules made through the API (the jobs they made stay)",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := opts.api.client(f)
			if err != nil {
				return err
			}
			for _, name := range args {
				if err := c.DeleteSchedule(cmd.Context(), name); err != nil {
					return err
				}
				fmt.Fprintf(f.Out, "removed %s\n", name)
			}
			return nil
		},
	}
}

func newCmdSchedulesPause(f *Factory, opts *schedulesOptions, pause bool) *cobra.Command {
	use, short := "pause NAME", "Stop a schedule's runs until resumed"
	if !pause {
		use, short = "resume NAME", "Run a paused schedule again from its next tick (ticks while paused are not run)"
	}
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := opts.api.client(f)
			if err != nil {
				return err
			}
			call := c.ResumeSchedule
			if pause {
				call = c.PauseSchedule
			}
			s, err := call(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return opts.printOne(f, s)
		},
	}
}

func (o *schedulesOptions) printOne(f *Factory, s *client.Schedule) error {
	if o.json {
		return writeJSONTo(f.Out, s)
	}
	tw := tabwriter.NewWriter(f.Out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "name:\t%s\n", s.Name)
	fmt.Fprintf(tw, "cron:\t%s (%s)\n", s.Cron, s.Timezone)
	fmt.Fprintf(tw, "state:\t%s\n", scheduleState(s))
	fmt.Fprintf(tw, "source:\t%s\n", s.Source)
	fmt.Fprintf(tw, "catch up:\t%s\n", s.CatchUp)
	job, _ := json.Marshal(s.Job)
	fmt.Fprintf(tw, "job:\t%s\n", job)
	fmt.Fprintf(tw, "next run:\t%s\n", timeOrDash(s.NextRunAt))
	fmt.Fprintf(tw, "last run:\t%s\n", timeOrDash(s.LastRunAt))
	if s.LastJobID != "" {
		fmt.Fprintf(tw, "last job:\t%s\n", s.LastJobID)
	}
	if s.LastError != "" {
		fmt.Fprintf(tw, "last error:\t%s\n", s.LastError)
	}
	return tw.Flush()
}

func printSchedules(w io.Writer, list []client.Schedule) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tCRON\tTIMEZONE\tSTATE\tNEXT RUN\tLAST RUN\tLAST JOB")
	for _, s := range list {
		job := s.LastJobID
		if job == "" {
			job = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.Cron, s.Timezone, scheduleState(&s),
			timeOrDash(s.NextRunAt), timeOrDash(s.LastRunAt), job)
	}
	tw.Flush()
}

// scheduleState is one word for a table: paused, refused (its last run's
// job was), or active; config schedules say so.
func scheduleState(s *client.Schedule) string {
	st := "active"
	switch {
	case s.Paused:
		st = "paused"
	case s.LastError != "":
		st = "refused"
	}
	if s.Source == "config" {
		st += " (config)"
	}
	return st
}

func timeOrDash(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
