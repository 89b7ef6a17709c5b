package fakeupstream

import (
	"fmt"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Algorithm is how a limit counts. The names are the ones shaper's config
// uses for its own limiters.
type Algorithm string

const (
	// SlidingLog is exact: at most Rate units in any window (t−Per, t].
	// Memory grows with Rate: one entry per admitted request in the last
	// two windows, per API key.
	SlidingLog Algorithm = "sliding_log"
	// FixedWindow counts per wall-clock-aligned slot of length Per, so a
	// client can get up to 2×Rate through across a slot boundary.
	FixedWindow Algorithm = "fixed_window"
	// TokenBucket holds Burst tokens (Rate when Burst is zero) and refills
	// Rate of them per Per, so an idle client may send a burst at once.
	TokenBucket Algorithm = "token_bucket"
	// Meter is nginx's limit_req: a leaky bucket with millisecond
	// accounting that refuses any request arriving less than Per/Rate
	// (in whole milliseconds) after the last one it accepted, unless Burst
	// allows that many extra (nginx's `burst=N nodelay`). It punishes
	// uneven spacing, not only excess.
	Meter Algorithm = "meter"
)

// Style is whose 429 the server imitates.
type Style string

const (
	// StylePlain answers 429 with a text body and Retry-After only.
	StylePlain Style = "plain"
	// StyleStripe answers like Stripe: an invalid_request_error with code
	// rate_limit and a Stripe-Rate-Limited-Reason header, no Retry-After
	// (Stripe documents none, so clients must back off on their own).
	StyleStripe Style = "stripe"
	// StyleOpenAI answers like OpenAI: x-ratelimit-{limit,remaining,reset}-*
	// headers on every answer, retry-after on 429, and a rate_limit_exceeded
	// error whose type names the exhausted quota.
	StyleOpenAI Style = "openai"
	// StyleIETF states its limits in the structured RateLimit-Policy and
	// RateLimit fields of draft-ietf-httpapi-ratelimit-headers-10 on every
	// answer (`"default";q=40;w=1` and `"default";r=12;t=1`), adds
	// Retry-After to a 429, and otherwise answers like StylePlain.
	StyleIETF Style = "ietf"
	// StyleBare keeps its limit to itself: no rate-limit header on any
	// answer, and a 429 with no Retry-After and a body of "Too Many
	// Requests". A client must find the limit by being refused.
	StyleBare Style = "bare"
)

// Styles lists every style, in the order the command's help names them.
func Styles() []Style {
	return []Style{StylePlain, StyleStripe, StyleOpenAI, StyleIETF, StyleBare}
}

// UsageHeader is the request header in which a client tells the fake what
// the request really used of the cost limit's unit, the way a completion
// uses fewer tokens than its max_tokens. The cost limit then charges that
// amount instead of the declared cost, and at once, when the request
// arrives: a real upstream learns the use only as it answers, but the
// limit comes out the same for the next request. A success reports the
// amount in the OpenAI style's usage.total_tokens and, when a cost limit
// is set, in this same header, in every style. A job sent through shaper
// says `headers: {X-Fake-Usage: "40"}`.
const UsageHeader = "X-Fake-Usage"

// Defaults for the zero values of Config.
const (
	DefaultPer               = time.Second
	DefaultIdempotencyHeader = "Idempotency-Key"
	// DefaultMaxRecords keeps a 60 s run at 5,000 requests/s, about 60 MB
	// at most with short paths and keys.
	DefaultMaxRecords = 300_000
	DefaultCostName   = "tokens"
	// MaxBodyBytes is how much of a body is read to find max_tokens; larger
	// bodies are answered 413.
	MaxBodyBytes = 1 << 20
)

// Limit is one rate: at most Rate units per Per, counted by the server's
// Algorithm. Burst is the token bucket's capacity (zero means Rate) or the
// meter's extra requests beyond the one in service (zero means none), and
// must be zero for the other algorithms.
type Limit struct {
	Rate  int64
	Per   time.Duration
	Burst int64
}

// String renders a limit as "100 per 1s" or "100 per 1s (burst 20)".
func (l Limit) String() string {
	s := fmt.Sprintf("%d per %v", l.Rate, l.Per)
	if l.Burst > 0 {
		s += fmt.Sprintf(" (burst %d)", l.Burst)
	}
	return s
}

// capacity is the most units the limit admits at one instant, which is
// also the largest single cost it can ever admit.
func (l Limit) capacity(alg Algorithm) int64 {
	switch {
	case alg == TokenBucket && l.Burst > 0:
		return l.Burst
	case alg == Meter:
		return l.Burst + 1
	}
	return l.Rate
}

func (l Limit) validate(alg Algorithm) error {
	switch {
	case l.Rate < 1:
		return fmt.Errorf("rate %d: must be at least 1", l.Rate)
	case l.Per < time.Millisecond:
		return fmt.Errorf("per %v: must be at least 1ms", l.Per)
	case l.Per > 366*24*time.Hour:
		return fmt.Errorf("per %v: must be at most a year", l.Per)
	case l.Burst < 0:
		return fmt.Errorf("burst %d: must not be negative", l.Burst)
	case l.Burst > 0 && alg != TokenBucket && alg != Meter:
		return fmt.Errorf("burst %d: only the %s and %s algorithms have a burst", l.Burst, TokenBucket, Meter)
	}
	if alg == Meter {
		// nginx keeps the rate in milli-requests per second and counts
		// whole milliseconds.
		switch {
		case l.Per%time.Millisecond != 0:
			return fmt.Errorf("per %v: the %s counts whole milliseconds", l.Per, Meter)
		case l.Rate > math.MaxInt64/1_000_000_000 || l.Burst > math.MaxInt64/1_000_000_000:
			return fmt.Errorf("%v: too large for the %s", l, Meter)
		case l.meterRate() < 1:
			return fmt.Errorf("%d per %v: under one request per 1000s, too slow for the %s", l.Rate, l.Per, Meter)
		}
	}
	// The token bucket keeps its level in token·microseconds; keep the
	// products exact in an int64 with room for one refill step on top.
	if l.capacity(alg) > (math.MaxInt64/4)/l.Per.Microseconds() {
		return fmt.Errorf("%d per %v: capacity × per is too large for the token bucket", l.capacity(alg), l.Per)
	}
	return nil
}

// CostLimit limits a named cost per API key, like OpenAI's tokens per
// minute, beside the request limit.
//
// A request's cost is the integer in the Header, if present; otherwise, when
// the body is a JSON object, its "max_tokens" field (the output budget
// OpenAI's completion requests carry); otherwise zero. A request of cost
// zero is never held back by the cost limit.
type CostLimit struct {
	// Name is the unit, used in headers (x-ratelimit-limit-tokens) and in
	// OpenAI's error type. Zero means "tokens".
	Name string
	// Header carries the cost. Zero means "X-Cost-" + Name ("X-Cost-Tokens").
	Header string
	Rate   int64
	Per    time.Duration // zero means one minute, as OpenAI counts tokens
	Burst  int64         // token_bucket capacity; zero means Rate
}

// String renders the limit as "800000 tokens per 1m0s".
func (c CostLimit) String() string {
	s := fmt.Sprintf("%d %s per %v", c.Rate, c.Name, c.Per)
	if c.Burst > 0 {
		s += fmt.Sprintf(" (burst %d)", c.Burst)
	}
	return s
}

func (c CostLimit) limit() Limit { return Limit{Rate: c.Rate, Per: c.Per, Burst: c.Burst} }

// costName is a header- and JSON-safe unit name.
var costName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)

// Config shapes a Server. The zero value is valid: a server that admits
// everything and records it, answering in the plain style.
type Config struct {
	// Algorithm counts every limit below. Zero means SlidingLog.
	Algorithm Algorithm
	// Rate is the most requests one API key may make per Per. Zero means no
	// request limit.
	Rate int64
	// Per is the window (sliding_log, fixed_window) or the refill period
	// (token_bucket: Rate tokens per Per). Zero means DefaultPer.
	Per time.Duration
	// Burst is the token bucket's capacity (zero means Rate), or the
	// meter's extra requests beyond the one in service (zero means none,
	// strict spacing).
	Burst int64
	// Concurrency is the most requests one API key may have in flight.
	// Zero means no cap.
	Concurrency int
	// EndpointLimit, when set, also limits each API key's requests to one
	// endpoint (method and exact path), as Stripe's per-endpoint limits do.
	// Its zero Per means DefaultPer.
	EndpointLimit *Limit
	// CostLimit, when set, also limits a named cost per API key.
	CostLimit *CostLimit
	// Style is whose 429 to imitate. Zero means StylePlain.
	Style Style
	// Latency delays every admitted answer; Jitter adds a uniformly random
	// extra delay in [0, Jitter]. Rejections are answered at once.
	Latency, Jitter time.Duration
	// FailRate is the fraction of admitted requests answered 500 or 503
	// (half each) after their latency; they still count against the limits,
	// as at a real upstream that accepted them and then failed.
	FailRate float64
	// Seed makes failures and jitter repeatable: the same seed and the same
	// order of admitted requests give the same answers.
	Seed uint64
	// IdempotencyHeader carries the idempotency key. Zero means
	// DefaultIdempotencyHeader.
	IdempotencyHeader string
	// MaxRecords bounds the arrival record; older records are dropped.
	// Zero means DefaultMaxRecords.
	MaxRecords int
	// Now is the clock. Nil means time.Now. Tests pass a fake clock so
	// limits can be exercised without sleeping; latency still sleeps in
	// real time.
	Now func() time.Time
}

// withDefaults fills zero values and checks everything, naming the field at
// fault. It does not modify c.
func (c Config) withDefaults() (Config, error) {
	if c.Algorithm == "" {
		c.Algorithm = SlidingLog
	}
	switch c.Algorithm {
	case SlidingLog, FixedWindow, TokenBucket, Meter:
	default:
		return c, fmt.Errorf("algorithm %q: want %s, %s, %s or %s", c.Algorithm, SlidingLog, FixedWindow, TokenBucket, Meter)
	}
	if c.Per == 0 {
		c.Per = DefaultPer
	}
	if c.Rate < 0 {
		return c, fmt.Errorf("rate %d: must not be negative (0 means no limit)", c.Rate)
	}
	if c.Rate > 0 {
		if err := c.requestLimit().validate(c.Algorithm); err != nil {
			return c, err
		}
	} else if c.Burst != 0 {
		return c, fmt.Errorf("burst %d: set rate too, or leave burst 0", c.Burst)
	}
	if c.Concurrency < 0 {
		return c, fmt.Errorf("concurrency %d: must not be negative (0 means no cap)", c.Concurrency)
	}
	if c.EndpointLimit != nil {
		l := *c.EndpointLimit
		if l.Per == 0 {
			l.Per = DefaultPer
		}
		if err := l.validate(c.Algorithm); err != nil {
			return c, fmt.Errorf("endpoint limit: %w", err)
		}
		c.EndpointLimit = &l
	}
	if c.CostLimit != nil {
		cl := *c.CostLimit
		if cl.Name == "" {
			cl.Name = DefaultCostName
		}
		if !costName.MatchString(cl.Name) || cl.Name == "requests" {
			return c, fmt.Errorf("cost limit: name %q: want a lowercase name of letters, digits and _, other than \"requests\"", cl.Name)
		}
		if cl.Header == "" {
			cl.Header = "X-Cost-" + strings.ToUpper(cl.Name[:1]) + cl.Name[1:]
		}
		cl.Header = http.CanonicalHeaderKey(cl.Header)
		if cl.Per == 0 {
			cl.Per = time.Minute
		}
		if err := cl.limit().validate(c.Algorithm); err != nil {
			return c, fmt.Errorf("cost limit: %w", err)
		}
		c.CostLimit = &cl
	}
	if c.Style == "" {
		c.Style = StylePlain
	}
	if !slices.Contains(Styles(), c.Style) {
		return c, fmt.Errorf("style %q: want %s, %s, %s, %s or %s", c.Style, StylePlain, StyleStripe, StyleOpenAI, StyleIETF, StyleBare)
	}
	if cl := c.CostLimit; cl != nil && c.Style == StyleIETF && (cl.Name == ietfRequestPolicy || cl.Name == ietfEndpointPolicy) {
		return c, fmt.Errorf("cost limit: name %q: the %s style names a request limit so; pick another", cl.Name, StyleIETF)
	}
	switch {
	case c.Latency < 0:
		return c, fmt.Errorf("latency %v: must not be negative", c.Latency)
	case c.Jitter < 0:
		return c, fmt.Errorf("jitter %v: must not be negative", c.Jitter)
	case math.IsNaN(c.FailRate) || c.FailRate < 0 || c.FailRate > 1:
		return c, fmt.Errorf("fail rate %v: must be between 0 and 1", c.FailRate)
	case c.MaxRecords < 0:
		return c, fmt.Errorf("max records %d: must not be negative (0 means %d)", c.MaxRecords, DefaultMaxRecords)
	}
	if c.IdempotencyHeader == "" {
		c.IdempotencyHeader = DefaultIdempotencyHeader
	}
	c.IdempotencyHeader = http.CanonicalHeaderKey(c.IdempotencyHeader)
	if c.MaxRecords == 0 {
		c.MaxRecords = DefaultMaxRecords
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c, nil
}

func (c Config) requestLimit() Limit { return Limit{Rate: c.Rate, Per: c.Per, Burst: c.Burst} }

// describe summarises the limits for the report, e.g.
// "sliding_log: 100 requests per 1s per key; 800000 tokens per 1m0s per key;
// 20 in flight per key".
func (c Config) describe() string {
	var parts []string
	if c.Rate > 0 {
		parts = append(parts, withUnit(c.requestLimit())+" per key")
	}
	if c.EndpointLimit != nil {
		parts = append(parts, withUnit(*c.EndpointLimit)+" per key and endpoint")
	}
	if c.CostLimit != nil {
		parts = append(parts, c.CostLimit.String()+" per key")
	}
	if c.Concurrency > 0 {
		parts = append(parts, fmt.Sprintf("%d in flight per key", c.Concurrency))
	}
	if len(parts) == 0 {
		return "no limit"
	}
	return string(c.Algorithm) + ": " + strings.Join(parts, "; ")
}
