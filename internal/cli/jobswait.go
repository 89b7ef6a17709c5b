package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/shaperhq/shaper/client"
	"github.com/shaperhq/shaper/queue"
)

type jobsWaitOptions struct {
	timeout time.Duration
	window  time.Duration
}

func newCmdJobsWait(f *Factory, opts *jobsOptions) *cobra.Command {
	wo := &jobsWaitOptions{}
	cmd := &cobra.Command{
		Use:   "wait ID [--timeout D]",
		Short: "Wait for a job to finish, then show it",
		Long: `Wait until a job succeeds, dies or is cancelled, then show it as "shaper jobs
get" does. It does not poll: each request is a long poll (GET
/v1/jobs/{id}?wait=) that the server answers as soon as the job is final,
or after --window; with --config, the wait is on Redis's announcement of
the job finishing. While it waits, the job's state is printed on stderr
after each window.

Exit status:
  0  the job succeeded
  1  an error (the job is not there, the API failed)
  2  the job is dead (failed for good) or was cancelled
  3  the job had not finished within --timeout`,
		Example: `  shaper jobs wait stripe.default.3fa9c1d2-k4xq7m...
  shaper jobs wait stripe.default.3fa9c1d2-k4xq7m... --timeout 2m --json | jq .response`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return jobsWaitRun(cmd.Context(), f, opts, wo, args[0])
		},
	}
	cmd.Flags().DurationVar(&wo.timeout, "timeout", 10*time.Minute, "give up waiting after this long")
	cmd.Flags().DurationVar(&wo.window, "window", client.DefaultWaitWindow, "longest one long poll waits (at most 1m)")
	return cmd
}

func jobsWaitRun(ctx context.Context, f *Factory, opts *jobsOptions, wo *jobsWaitOptions, id string) error {
	if wo.timeout <= 0 {
		return fmt.Errorf("--timeout %v: want a positive duration", wo.timeout)
	}
	if wo.window <= 0 || wo.window > queue.MaxWait {
		return fmt.Errorf("--window %v: want a duration up to %v", wo.window, queue.MaxWait)
	}
	b, err := opts.openJobs(ctx, f)
	if err != nil {
		return err
	}
	defer b.close()
	ctx, cancel := context.WithTimeoutCause(ctx, wo.timeout, errWaitTimeout)
	defer cancel()
	start := time.Now()
	job, err := b.wait(ctx, id, wo.window, func(j *client.Job) {
		state := string(j.State)
		if j.WaitingFor != "" {
			state += " (" + j.WaitingFor + ")"
		}
		fmt.Fprintf(f.ErrOut, "%s: %s after %v; waiting\n", id, state, time.Since(start).Round(time.Second))
	})
	if err != nil {
		if errors.Is(context.Cause(ctx), errWaitTimeout) {
			state := "unknown"
			if job != nil {
				state = string(job.State)
			}
			return codedError{code: exitWaitTimeout,
				err: fmt.Errorf("job %s not finished after --timeout %v (last seen %s)", id, wo.timeout, state)}
		}
		return err
	}
	if opts.json {
		err = writeJSONTo(f.Out, job)
	} else {
		printJobDetail(f.Out, job)
	}
	if err != nil {
		return err
	}
	if job.State != client.StateSucceeded {
		return exitCode(exitDead)
	}
	return nil
}

func (a apiJobs) wait(ctx context.Context, id string, window time.Duration, progress func(*client.Job)) (*client.Job, error) {
	return a.c.Wait(ctx, id, client.WithWaitWindow(window), client.WithProgress(progress))
}

// wait is the API's long poll done in this process: queue.Wait, woken by
// this process's own subscription, one window after another.
func (r redisJobs) wait(ctx context.Context, id string, window time.Duration, progress func(*client.Job)) (*client.Job, error) {
	var last *client.Job
	for {
		info, err := r.q.Wait(ctx, id, "", window)
		if err != nil {
			return last, err
		}
		if last, err = asJob(info); err != nil || info.State.Final() {
			return last, err
		}
		progress(last)
	}
}
