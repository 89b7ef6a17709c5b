package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/client"
)

// apiFlags are how a command reaches a running API.
type apiFlags struct {
	api    string
	apiKey string
}

func (a *apiFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&a.api, "api", "", "API base URL (default $SHAPER_API_URL)")
	cmd.Flags().StringVar(&a.apiKey, "api-key", "", "API key (default $SHAPER_API_KEY)")
}

func (a *apiFlags) url(f *Factory) string {
	if a.api != "" {
		return a.api
	}
	v, _ := f.LookupEnv("SHAPER_API_URL")
	return v
}

// client reaches the API with the CLI's user agent and any further options.
func (a *apiFlags) client(f *Factory, opts ...client.Option) (*client.Client, error) {
	url := a.url(f)
	if url == "" {
		return nil, errors.New("--api URL (or $SHAPER_API_URL) is required, e.g. http://localhost:8080")
	}
	key := a.apiKey
	if key == "" {
		key, _ = f.LookupEnv("SHAPER_API_KEY")
	}
	if key == "" {
		return nil, errors.New("--api-key (or $SHAPER_API_KEY) is required")
	}
	return client.New(url, key, append([]client.Option{client.WithUserAgent("shaper-cli/" + Version)}, opts...)...)
}

type enqueueOptions struct {
	api            apiFlags
	upstream       string
	method         string
	path           string
	headers        []string
	data           string
	dataFile       string
	costs          []string
	lane           string
	idempotencyKey string
	maxAttempts    int
	notBefore      string
	ttl            time.Duration
	task           string
	partition      string
	wait           bool
	waitTimeout    time.Duration
	json           bool
	retry          int
}

func newCmdEnqueue(f *Factory) *cobra.Command {
	opts := &enqueueOptions{}
	cmd := &cobra.Command{
		Use:   "enqueue --upstream NAME (--path PATH | --task NAME) [flags]",
		Short: "Enqueue one job through the API",
		Long: `Enqueue one job through a running API (shaper serve or shaper dev) and print
its id and state. With --wait, wait until the job succeeds, dies or is
cancelled, and print the outcome.

Exit status:
  0  enqueued (with --wait: the job succeeded)
  1  any other error: a refused job, an unreachable API, a bad flag
  2  with --wait: the job is dead (failed for good) or was cancelled
  3  with --wait: the job had not finished within --wait-timeout

The request body comes from --data, or --data-file (- for stdin).`,
		Example: `  shaper enqueue --api http://localhost:8080 --api-key "$KEY" --upstream demo --path /v1/hello --data '{"hi":1}'
  shaper enqueue --upstream openai --method POST --path /v1/chat/completions \
      --header 'Content-Type: application/json' --data-file prompt.json --cost tokens=1200 --wait
  shaper enqueue --upstream stripe --path /v1/refunds --idempotency-key refund-42 --json
  shaper enqueue --upstream mail --path /v1/send --partition example.org --data-file message.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return enqueueRun(cmd.Context(), f, opts)
		},
	}
	fl := cmd.Flags()
	opts.api.register(cmd)
	fl.StringVarP(&opts.upstream, "upstream", "u", "", "upstream name (required)")
	fl.StringVarP(&opts.method, "method", "X", "", "HTTP method (default: POST with a body, else GET)")
	fl.StringVarP(&opts.path, "path", "p", "", "path relative to the upstream's base URL")
	fl.StringArrayVarP(&opts.headers, "header", "H", nil, "header 'Name: value' (repeatable)")
	fl.StringVarP(&opts.data, "data", "d", "", "request body")
	fl.StringVar(&opts.dataFile, "data-file", "", "read the body from a file (- for stdin)")
	fl.StringArrayVar(&opts.costs, "cost", nil, "cost NAME=N, e.g. tokens=1200 (repeatable)")
	fl.StringVar(&opts.lane, "lane", "", "lane (default: the upstream's default lane)")
	fl.StringVar(&opts.idempotencyKey, "idempotency-key", "", "idempotency key; a repeat returns the first job")
	fl.IntVar(&opts.maxAttempts, "max-attempts", 0, "attempts before the job dies (default: the upstream's)")
	fl.StringVar(&opts.notBefore, "not-before", "", "first attempt no earlier than this RFC 3339 time")
	fl.DurationVar(&opts.ttl, "ttl", 0, "give the job up if not dispatched within this long")
	fl.StringVar(&opts.task, "task", "", "task name, for upstreams served by a Go handler")
	fl.StringVar(&opts.partition, "partition", "", "partition, e.g. the recipient domain or customer id (up to 200 bytes); paced by the upstream's partition_limits")
	fl.BoolVar(&opts.wait, "wait", false, "wait for the job to finish")
	fl.DurationVar(&opts.waitTimeout, "wait-timeout", 10*time.Minute, "give up waiting after this long")
	fl.BoolVar(&opts.json, "json", false, "print the job as JSON")
	fl.IntVar(&opts.retry, "retry", 3, "retries of a 429 or 503, honouring Retry-After")
	cmd.MarkFlagRequired("upstream")
	// enqueue has no --config; $SHAPER_CONFIG or the API names upstreams.
	var noConfig string
	cmd.RegisterFlagCompletionFunc("upstream", f.upstreamCompleter(&noConfig, &opts.api))
	return cmd
}

func enqueueRun(ctx context.Context, f *Factory, opts *enqueueOptions) error {
	req, err := jobRequest(f, opts)
	if err != nil {
		return err
	}
	c, err := opts.api.client(f, client.WithRetry(opts.retry))
	if err != nil {
		return err
	}
	job, err := c.Enqueue(ctx, req)
	if err != nil {
		return refusal(req.Upstream, err)
	}
	if opts.wait {
		if job, err = waitForJob(ctx, f, c, opts, job.ID); err != nil {
			return err
		}
	}
	if err := reportJob(f.Out, job, opts.json); err != nil {
		return err
	}
	if opts.wait && job.State != client.StateSucceeded {
		return exitCode(exitDead)
	}
	return nil
}

// The exit codes of enqueue --wait beyond 0 and 1, documented in its help.
const (
	exitDead        = 2
	exitWaitTimeout = 3
)

// errWaitTimeout ends a wait that outlasted --wait-timeout, so that it is
// told apart from an interrupt or a failing API.
var errWaitTimeout = errors.New("wait timeout")

// refusedError is a refusal said once. The server's detail already states
// every field's problem, and client.Error appends the fields again, so a
// one-sentence reason would otherwise print twice.
type refusedError struct {
	upstream string
	err      *client.Error
}

func (r refusedError) Error() string {
	return fmt.Sprintf("enqueue to %s: %d %s: %s", r.upstream, r.err.StatusCode, r.err.Title, r.err.Detail)
}

func (r refusedError) Unwrap() error { return r.err }

// refusal renders a refused enqueue without repeating the server's
// reasons; any other error is returned as it is.
func refusal(upstream string, err error) error {
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Detail == "" || len(ce.Fields) == 0 {
		return err
	}
	for _, f := range ce.Fields {
		if !strings.Contains(ce.Detail, f.Message) {
			return err
		}
	}
	return refusedError{upstream: upstream, err: ce}
}

// jobRequest builds the request from the flags, refusing a malformed flag
// before anything is sent.
func jobRequest(f *Factory, opts *enqueueOptions) (client.JobRequest, error) {
	req := client.JobRequest{
		Upstream: opts.upstream, Method: opts.method, Path: opts.path, Lane: opts.lane,
		IdempotencyKey: opts.idempotencyKey, MaxAttempts: opts.maxAttempts, TTL: opts.ttl, Task: opts.task,
		Partition: opts.partition,
	}
	if opts.path == "" && opts.task == "" {
		return req, errors.New("give --path (an HTTP upstream) or --task (a Go handler upstream)")
	}
	if opts.partition != "" {
		if err := shaper.CheckPartition(opts.partition); err != nil {
			return req, fmt.Errorf("--partition: %v", err)
		}
	}
	var err error
	if req.Headers, err = parseHeaderFlags(opts.headers); err != nil {
		return req, err
	}
	if req.Body, err = readBody(f, opts.data, opts.dataFile); err != nil {
		return req, err
	}
	if req.Cost, err = parseCostFlags(opts.costs); err != nil {
		return req, err
	}
	if opts.notBefore != "" {
		t, err := time.Parse(time.RFC3339, opts.notBefore)
		if err != nil {
			return req, fmt.Errorf("--not-before %q: want an RFC 3339 time such as 2026-12-01T09:00:00Z", opts.notBefore)
		}
		req.NotBefore = t
	}
	return req, nil
}

// parseHeaderFlags reads --header 'Name: value' flags (nil for none).
func parseHeaderFlags(flags []string) (map[string]string, error) {
	var headers map[string]string
	for _, h := range flags {
		name, value, ok := strings.Cut(h, ":")
		if !ok || strings.TrimSpace(name) == "" {
			return nil, fmt.Errorf("--header %q: want 'Name: value'", h)
		}
		if headers == nil {
			headers = map[string]string{}
		}
		headers[strings.TrimSpace(name)] = strings.TrimSpace(value)
	}
	return headers, nil
}

// readBody takes the body from --data, or from --data-file (- for stdin).
func readBody(f *Factory, data, dataFile string) ([]byte, error) {
	switch {
	case data != "" && dataFile != "":
		return nil, errors.New("give --data or --data-file, not both")
	case data != "":
		return []byte(data), nil
	case dataFile == "-":
		b, err := io.ReadAll(f.In)
		if err != nil {
			return nil, fmt.Errorf("read the body from stdin: %w", err)
		}
		return b, nil
	case dataFile != "":
		return os.ReadFile(dataFile)
	}
	return nil, nil
}

// parseCostFlags reads --cost NAME=N flags (nil for none).
func parseCostFlags(flags []string) (map[string]int64, error) {
	var costs map[string]int64
	for _, c := range flags {
		name, v, ok := strings.Cut(c, "=")
		n, err := strconv.ParseInt(v, 10, 64)
		if !ok || name == "" || err != nil {
			return nil, fmt.Errorf("--cost %q: want NAME=N, e.g. tokens=1200", c)
		}
		if costs == nil {
			costs = map[string]int64{}
		}
		costs[name] = n
	}
	return costs, nil
}

// waitForJob waits up to --wait-timeout for the job to finish.
func waitForJob(ctx context.Context, f *Factory, c *client.Client, opts *enqueueOptions, id string) (*client.Job, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, opts.waitTimeout, errWaitTimeout)
	defer cancel()
	if !opts.json {
		fmt.Fprintf(f.ErrOut, "enqueued %s; waiting for it to finish\n", id)
	}
	job, err := c.Wait(ctx, id)
	if err == nil {
		return job, nil
	}
	if errors.Is(context.Cause(ctx), errWaitTimeout) {
		state := "unknown"
		if job != nil {
			state = string(job.State)
		}
		return nil, codedError{code: exitWaitTimeout,
			err: fmt.Errorf("job %s not finished after --wait-timeout %v (last seen %s)", id, opts.waitTimeout, state)}
	}
	return nil, fmt.Errorf("waiting for %s: %w", id, err)
}

// reportJob prints the job for a person, or as indented JSON.
func reportJob(w io.Writer, job *client.Job, asJSON bool) error {
	if !asJSON {
		printJob(w, job)
		return nil
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(job)
}

func printJob(w io.Writer, j *client.Job) {
	what := "enqueued"
	if j.Existing {
		what = "already enqueued under this idempotency key"
	}
	fmt.Fprintf(w, "%s %s: %s on %s/%s", what, j.ID, j.State, j.Upstream, j.Lane)
	if j.Partition != "" {
		fmt.Fprintf(w, " partition %q", j.Partition)
	}
	if j.Attempts > 0 {
		fmt.Fprintf(w, " after %d attempt(s)", j.Attempts)
	}
	fmt.Fprintln(w)
	if j.LastError != "" {
		fmt.Fprintf(w, "last error: %s\n", j.LastError)
	}
	if j.Response != nil {
		fmt.Fprintf(w, "upstream answered %d\n", j.Response.Status)
		if len(j.Response.Body) > 0 {
			body := j.Response.Body
			if len(body) > 2000 {
				body = append(body[:2000:2000], "…"...)
			}
			fmt.Fprintf(w, "%s\n", body)
		}
	}
}
