// Package client is the Go client for producers and operators of a shaper
// server: it enqueues calls bound for rate-limited upstreams (one at a time
// or in batches), reads and cancels jobs, waits for them to finish, and reads,
// pauses and resumes upstreams, all over shaper's v1 HTTP API. Refusals come
// back as *Error, which errors.Is matches against sentinels such as
// ErrRateLimited, ErrBacklogFull and ErrUnavailable; WithRetry makes the
// client wait out those by itself, as long as the server asks it to.
package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Defaults for a Client built without the matching option.
const (
	// DefaultTimeout bounds each HTTP request of the default *http.Client,
	// so a hung connection cannot stall a caller whose ctx has no deadline.
	DefaultTimeout = 30 * time.Second
	// DefaultMaxRetryWait is the longest wait WithRetry accepts before it
	// gives up and hands the refusal to the caller.
	DefaultMaxRetryWait = time.Minute
	// DefaultUserAgent is sent unless WithUserAgent says otherwise.
	DefaultUserAgent = "shaper-go-client"
)

// maxErrorBody bounds how much of an error response is read: a problem
// document is small, and a proxy's error page is not worth more.
const maxErrorBody = 64 << 10

// Client talks to one shaper server with one API key. It is safe for
// concurrent use; make one and share it.
//
// Every method takes a ctx that bounds it whole, including any waits for
// retries or polls. Refusals are *Error values; match them with errors.Is
// against ErrRateLimited, ErrBacklogFull, ErrUnavailable, ErrNotFound,
// ErrInvalid, ErrUnauthorized and ErrConflict, or errors.As to read the details.
type Client struct {
	base         string // scheme://host[/prefix], no trailing slash
	apiKey       string
	hc           *http.Client
	userAgent    string
	maxRetries   int
	maxRetryWait time.Duration

	// now and sleep are the client's only view of time, so tests can
	// drive retries and polls without waiting for real.
	now   func() time.Time
	sleep func(ctx context.Context, d time.Duration) error
}

// Option configures a Client in New.
type Option func(*Client) error

// WithHTTPClient sends requests through hc instead of a default client with
// DefaultTimeout, e.g. to set a proxy, TLS roots or a different timeout.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) error {
		if hc == nil {
			return errors.New("http client is nil")
		}
		c.hc = hc
		return nil
	}
}

// WithRetry makes the client retry a request refused with 429 (admission
// limit) or 503 (backlog full, or the server unavailable) up to maxRetries more times, each after the
// wait the server names in Retry-After. Nothing else is retried: not
// invalid requests, not other statuses, not network errors, whose outcome
// the client cannot know.
//
// The client gives up at once, returning the refusal, when the server asks
// for a longer wait than WithMaxRetryWait allows or one that would outlast
// ctx's deadline: retrying early would only be refused again.
//
// A retried POST is only safe if the server can recognise the repeat, so
// with retries on, Enqueue and EnqueueBatch give every job without an
// IdempotencyKey a random one before the first attempt. A repeat then
// returns the job the first attempt made instead of a second job. The key
// is also what the upstream receives as the job's idempotency key.
func WithRetry(maxRetries int) Option {
	return func(c *Client) error {
		if maxRetries < 0 {
			return fmt.Errorf("max retries %d: must not be negative", maxRetries)
		}
		c.maxRetries = maxRetries
		return nil
	}
}

// WithMaxRetryWait sets the longest Retry-After that WithRetry waits out
// (default DefaultMaxRetryWait). It also caps the client's own backoff when
// a refusal names no wait.
func WithMaxRetryWait(d time.Duration) Option {
	return func(c *Client) error {
		if d <= 0 {
			return fmt.Errorf("max retry wait %v: must be positive", d)
		}
		c.maxRetryWait = d
		return nil
	}
}

// WithUserAgent sets the User-Agent header, so the server's logs can tell
// producers apart.
func WithUserAgent(ua string) Option {
	return func(c *Client) error {
		if ua == "" {
			return errors.New("user agent is empty")
		}
		c.userAgent = ua
		return nil
	}
}

// New returns a Client for the server at baseURL (e.g.
// "http://localhost:8080", or one with a path prefix when a proxy serves
// shaper under a path) that authenticates with apiKey.
func New(baseURL, apiKey string, opts ...Option) (*Client, error) {
	base, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("base url: %w", err)
	}
	if base.Scheme != "http" && base.Scheme != "https" {
		return nil, fmt.Errorf("base url %q: scheme must be http or https", baseURL)
	}
	if base.Host == "" {
		return nil, fmt.Errorf("base url %q: no host", baseURL)
	}
	if base.RawQuery != "" || base.Fragment != "" || base.User != nil {
		return nil, fmt.Errorf("base url %q: must have no query, fragment or user info", baseURL)
	}
	if apiKey == "" {
		return nil, errors.New("api key is empty")
	}
	c := &Client{
		base:         strings.TrimSuffix(base.String(), "/"),
		apiKey:       apiKey,
		hc:           &http.Client{Timeout: DefaultTimeout},
		userAgent:    DefaultUserAgent,
		maxRetryWait: DefaultMaxRetryWait,
		now:          time.Now,
		sleep:        sleepCtx,
	}
	for _, opt := range opts {
		if err := opt(c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// do sends one API call, retrying refusals as WithRetry allows, and decodes
// a 2xx answer into out (when out is not nil). It returns the final status.
func (c *Client) do(ctx context.Context, method, path string, in, out any) (int, error) {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return 0, fmt.Errorf("encode request: %w", err)
		}
	}
	for attempt := 0; ; attempt++ {
		status, err := c.send(ctx, method, path, body, out)
		var apiErr *Error
		if err == nil || !errors.As(err, &apiErr) || !retryable(apiErr.StatusCode) || attempt >= c.maxRetries {
			return status, err
		}
		wait, ok := c.retryWait(ctx, apiErr, attempt)
		if !ok {
			return status, err
		}
		if serr := c.sleep(ctx, wait); serr != nil {
			// Both stay matchable: the caller gave up, and why we were waiting.
			return status, fmt.Errorf("%w while waiting to retry: %w", serr, err)
		}
	}
}

func retryable(status int) bool {
	return status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable
}

// retryWait is how long to wait before retrying after e, and whether to
// retry at all.
func (c *Client) retryWait(ctx context.Context, e *Error, attempt int) (time.Duration, bool) {
	wait := e.RetryAfter
	if !e.retryAfterKnown {
		// The server named no time (a proxy's 503, say): back off on our own,
		// doubling from a second, but never past the cap.
		wait = min(time.Second<<min(attempt, 20), c.maxRetryWait)
	}
	if wait > c.maxRetryWait {
		return 0, false
	}
	if deadline, ok := ctx.Deadline(); ok && c.now().Add(wait).After(deadline) {
		return 0, false
	}
	return wait, true
}

// send makes one HTTP exchange.
func (c *Client) send(ctx context.Context, method, path string, body []byte, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.url(path), rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+c.apiKey)
	req.Header.Set("Accept", "application/json, application/problem+json")
	req.Header.Set("User-Agent", c.userAgent)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer func() {
		// Drain so the connection goes back to the pool.
		io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
		resp.Body.Close()
	}()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		return resp.StatusCode, newError(resp, raw, c.now())
	}
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return resp.StatusCode, fmt.Errorf("decode %d answer to %s %s: %w", resp.StatusCode, method, path, err)
		}
	}
	return resp.StatusCode, nil
}

// url joins an API path (already escaped) to the base URL, keeping any
// prefix the base has.
func (c *Client) url(path string) string { return c.base + path }

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// newIdempotencyKey makes a key no other producer will choose: 128 random
// bits.
func newIdempotencyKey() string {
	var b [16]byte
	rand.Read(b[:]) // never fails, per crypto/rand
	return "shaper-client-" + hex.EncodeToString(b[:])
}

// pathSegment escapes a caller's ID or name for one path segment, so "a/b"
// cannot reach another endpoint.
func pathSegment(s string) string { return url.PathEscape(s) }
