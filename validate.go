package shaper

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shaperhq/shaper/leaky"
)

// Bounds on an upstream's fields beyond their types'.
const (
	// MaxResponseBytesLimit bounds MaxResponseBytes.
	MaxResponseBytesLimit = 1 << 30
	// MaxKept bounds ResultMaxCount and DeadMaxCount: more finished jobs
	// than this per upstream is tens of GB of Redis.
	MaxKept = 10_000_000
	// MaxIdempotencyWindow bounds IdempotencyWindow: its records cost the
	// drain rate times the window.
	MaxIdempotencyWindow = 30 * 24 * time.Hour
)

// Compiled patterns are the package's only variables.
var (
	// nameRE: an upstream's or a lane's name becomes part of Redis keys,
	// hash tags and asynq queue names, and label values in metrics.
	nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	// tenantRE: a tenant appears in logs, metrics and job records.
	tenantRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)
	// headerRE is an RFC 9110 token.
	headerRE = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
)

// ValidName reports whether s can name an upstream or a lane: lowercase
// letters, digits, _ and -, starting with a letter or digit, at most 63.
func ValidName(s string) bool { return nameRE.MatchString(s) }

// ValidTenant reports whether s can name a tenant: letters, digits and
// _ . -, starting with a letter or digit, at most 64.
func ValidTenant(s string) bool { return tenantRE.MatchString(s) }

// ValidHeaderName reports whether s is a header name (an RFC 9110 token).
func ValidHeaderName(s string) bool { return headerRE.MatchString(s) }

// ManagedHeader reports headers the HTTP client sets itself; a configured
// value would conflict with it or frame the request differently.
func ManagedHeader(name string) bool {
	switch strings.ToLower(name) {
	case "host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer", "keep-alive", "proxy-connection":
		return true
	}
	return false
}

// Problem is one thing wrong with an upstream as described.
type Problem struct {
	// Path is the field, as a config file spells it, from the upstream
	// down: keys (string: "retry", "max_backoff", a lane's or partition's
	// name) and list indexes (int). Empty is the upstream itself (its
	// name).
	Path []any
	Msg  string
}

// Field writes Path as a config file's path reads: "retry.max_backoff",
// "limits[0]", "lanes.bulk".
func (p Problem) Field() string {
	var b strings.Builder
	for _, e := range p.Path {
		switch e := e.(type) {
		case int:
			b.WriteString("[" + strconv.Itoa(e) + "]")
		default:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			fmt.Fprint(&b, e)
		}
	}
	return b.String()
}

func (p Problem) String() string {
	if f := p.Field(); f != "" {
		return f + ": " + p.Msg
	}
	return p.Msg
}

// Problems is everything wrong with an upstream at once; Validate returns
// it as its error.
type Problems struct {
	Upstream string
	List     []Problem
}

func (ps *Problems) Error() string {
	parts := make([]string, len(ps.List))
	for i, p := range ps.List {
		parts[i] = p.String()
	}
	return "upstream " + ps.Upstream + ": " + strings.Join(parts, "; ")
}

func (ps *Problems) add(path []any, format string, args ...any) {
	ps.List = append(ps.List, Problem{Path: slices.Clone(path), Msg: fmt.Sprintf(format, args...)})
}

// Validate checks the upstream as described, its zero fields standing for
// their defaults (WithDefaults), and returns every problem at once as a
// *Problems, or nil. It is the one check of an upstream: the config file,
// the queue and the dispatcher all rely on it.
func (u Upstream) Validate() error {
	ps := u.Problems()
	if len(ps.List) == 0 {
		return nil
	}
	return ps
}

// Problems lists what Validate finds, in the order of the fields.
func (u Upstream) Problems() *Problems {
	ps := &Problems{Upstream: u.Name}
	if !ValidName(u.Name) {
		hint := ""
		if lower := strings.ToLower(u.Name); ValidName(lower) {
			hint = fmt.Sprintf("; did you mean %q?", lower)
		}
		ps.add(nil, "not a valid upstream name (lowercase letters, digits, _ and -, starting with a letter or digit, at most 63: it becomes part of queue names and Redis keys)%s", hint)
	}
	if u.BaseURL != "" {
		if err := CheckBaseURL(u.BaseURL); err != nil {
			ps.add([]any{"base_url"}, "%v", err)
		}
	}
	if len(u.Limits) == 0 {
		ps.add([]any{"limits"}, "at least one limit is required (e.g. [{rate: 100, per: 1s}])")
	}
	shortest, ok := ps.limits([]any{"limits"}, u.Limits, nil)
	pShortest, pOK := ps.partitions(u)
	if pShortest > 0 && (shortest == 0 || pShortest < shortest) {
		shortest = pShortest
	}
	ok = ok && pOK
	switch g := u.Guard; {
	case g < 0:
		ps.add([]any{"guard"}, "%v: must not be negative", g)
	case g > 0 && ok && shortest > 0 && g > shortest/10:
		ps.add([]any{"guard"}, "%v: must be at most a tenth of the shortest limit's per (%v)", g, shortest/10)
	}
	switch {
	case u.Concurrency < 0:
		ps.add([]any{"concurrency"}, "%d: must be 0 (unlimited) or more", u.Concurrency)
	case u.Concurrency > 1_000_000:
		ps.add([]any{"concurrency"}, "%d: must be at most 1000000 (0 is unlimited)", u.Concurrency)
	}
	ps.positive([]any{"timeout"}, u.Timeout)
	ps.count([]any{"max_pending"}, u.MaxPending, 1, 1e12)

	ps.count([]any{"retry", "max_attempts"}, int64(u.Retry.MaxAttempts), 1, 10_000)
	ps.positive([]any{"retry", "min_backoff"}, u.Retry.MinBackoff)
	ps.positive([]any{"retry", "max_backoff"}, u.Retry.MaxBackoff)
	lo, hi := orDuration(u.Retry.MinBackoff, DefaultMinBackoff), orDuration(u.Retry.MaxBackoff, DefaultMaxBackoff)
	if u.Retry.MinBackoff >= 0 && u.Retry.MaxBackoff >= 0 && lo > hi {
		note := ""
		if u.Retry.MaxBackoff == 0 {
			note = " (the default)"
		}
		ps.add([]any{"retry"}, "min_backoff %v is above max_backoff %v%s", lo, hi, note)
	}

	ps.fairness(u.Fairness)
	ps.headers(u)
	ps.settle(u)
	ps.proxy(u)

	if len(u.Lanes) > 0 {
		if _, ok := u.Lanes[DefaultLane]; !ok {
			ps.add([]any{"lanes"}, "must include %q, the lane of jobs that name none", DefaultLane)
		}
		for _, lane := range sortedKeys(u.Lanes) {
			if !ValidName(lane) {
				ps.add([]any{"lanes", lane}, "not a valid lane name (lowercase letters, digits, _ and -, at most 63)")
			}
			if w := u.Lanes[lane]; w < 1 || w > 1000 {
				ps.add([]any{"lanes", lane}, "weight %d: must be 1 to 1000", w)
			}
		}
	}

	switch {
	case u.Workers < 0:
		ps.add([]any{"workers"}, "%d: must be 0 (automatic) or more", u.Workers)
	case u.Workers > 10_000:
		ps.add([]any{"workers"}, "%d: must be at most 10000", u.Workers)
	}
	ps.count([]any{"max_response_bytes"}, u.MaxResponseBytes, 1, MaxResponseBytesLimit)
	ps.positive([]any{"result_retention"}, u.ResultRetention)
	ps.positive([]any{"dead_retention"}, u.DeadRetention)
	ps.count([]any{"result_max_count"}, int64(u.ResultMaxCount), 1, MaxKept)
	ps.count([]any{"dead_max_count"}, int64(u.DeadMaxCount), 1, MaxKept)
	ps.positive([]any{"idempotency_window"}, u.IdempotencyWindow)
	if u.IdempotencyWindow > MaxIdempotencyWindow {
		ps.add([]any{"idempotency_window"}, "%v: must be at most %v", u.IdempotencyWindow, MaxIdempotencyWindow)
	}
	ps.positive([]any{"pushback_default"}, u.PushbackDefault)

	for i, pat := range u.SensitiveHeaders {
		if err := ValidHeaderPattern(pat); err != nil {
			ps.add([]any{"sensitive_headers", i}, "%v", err)
		}
	}
	for i, pat := range u.StoreResponseHeaders {
		if err := ValidHeaderPattern(pat); err != nil {
			ps.add([]any{"store_response_headers", i}, "%v", err)
		}
	}
	switch u.StoreResponse {
	case "", StoreFull, StoreHeaders, StoreStatus:
	default:
		ps.add([]any{"store_response"}, "%q: want full (status, headers and body), headers (no body) or status", u.StoreResponse)
	}
	return ps
}

// positive checks a duration whose zero means its default.
func (ps *Problems) positive(path []any, d time.Duration) {
	if d < 0 {
		ps.add(path, "%v: must be positive", d)
	}
}

// count checks a count whose zero means its default.
func (ps *Problems) count(path []any, n, lowest, highest int64) {
	switch {
	case n != 0 && n < lowest:
		ps.add(path, "%d: must be at least %d", n, lowest)
	case n > highest:
		ps.add(path, "%d: must be at most %d", n, highest)
	}
}

// limits checks a list of limits, and returns the shortest per among them
// and whether every one is valid. A cost a limit counts must be in costs,
// unless costs is nil (the upstream's own limits).
func (ps *Problems) limits(path []any, ls []leaky.Limit, costs []string) (shortest time.Duration, ok bool) {
	ok = true
	for i, l := range ls {
		ip := append(slices.Clone(path), i)
		switch {
		case l.Validate() != nil:
			ps.add(ip, "%v", l.Validate())
		case l.Adaptive && costs != nil:
			ps.add(append(ip, "adaptive"), "only the upstream's own limits may be adaptive, not partition limits (remove adaptive here; put an adaptive limit in limits)")
		case l.Adaptive && l.Cost != "":
			ps.add(append(ip, "adaptive"), "only request limits may be adaptive, and this one counts %s (remove adaptive, or cost)", l.Cost)
		case costs != nil && l.Cost != "" && !slices.Contains(costs, l.Cost):
			counted := "requests only"
			if len(costs) > 0 {
				counted = strings.Join(costs, ", ")
			}
			ps.add(append(ip, "cost"), "%q is counted by none of the upstream's limits, and a job may only carry costs they count (they count: %s; add a limit with cost: %s to limits)", l.Cost, counted, l.Cost)
		default:
			if shortest == 0 || l.Per < shortest {
				shortest = l.Per
			}
			continue
		}
		ok = false
	}
	return shortest, ok
}

// partitions checks PartitionLimits and PartitionOverrides, and returns
// the shortest per among them and whether every limit is valid.
func (ps *Problems) partitions(u Upstream) (shortest time.Duration, ok bool) {
	costs := u.CostNames()
	if costs == nil {
		costs = []string{}
	}
	shorter := func(d time.Duration) {
		if d > 0 && (shortest == 0 || d < shortest) {
			shortest = d
		}
	}
	d, ok := ps.limits([]any{"partition_limits"}, u.PartitionLimits, costs)
	shorter(d)
	for _, name := range sortedKeys(u.PartitionOverrides) {
		op := []any{"partition_overrides", name}
		if err := CheckPartition(name); err != nil {
			ps.add(op, "not a valid partition: %v", err)
		}
		ls := u.PartitionOverrides[name]
		if len(ls) == 0 {
			ps.add(op, "no limits (an override replaces partition_limits for this partition; list at least one, e.g. [{rate: 1000, per: 1m}])")
			continue
		}
		d, lok := ps.limits(op, ls, costs)
		shorter(d)
		ok = ok && lok
	}
	return shortest, ok
}

// settle checks where the upstream's answers give the costs jobs used:
// each key a cost some limit counts, each source valid.
func (ps *Problems) settle(u Upstream) {
	if len(u.Settle) == 0 {
		return
	}
	counted := []string{}
	for _, l := range u.EveryLimit() {
		if l.Cost != "" && !slices.Contains(counted, l.Cost) {
			counted = append(counted, l.Cost)
		}
	}
	slices.Sort(counted)
	for _, cost := range sortedKeys(u.Settle) {
		cp := []any{"settle", cost}
		if !slices.Contains(counted, cost) {
			they := "requests only, one per job, which needs no settling"
			if len(counted) > 0 {
				they = strings.Join(counted, ", ")
			}
			ps.add(cp, "no limit counts %q, so there is nothing to settle (the limits count: %s)", cost, they)
			continue
		}
		if err := u.Settle[cost].Validate(); err != nil {
			ps.add(cp, "%v", err)
		}
	}
}

// fairness checks how the upstream shares its slots.
func (ps *Problems) fairness(f Fairness) {
	by := f.By
	switch by {
	case FairByTenant, FairByPartition, FairByNone:
	case "":
		by = FairByTenant
	default:
		ps.add([]any{"fairness", "by"}, "%q is not one of tenant, partition, none", by)
		by = ""
	}
	if by == FairByNone && len(f.Weights) > 0 {
		ps.add([]any{"fairness", "weights"}, "by: none shares nothing by weight (remove weights, or set by: tenant or by: partition)")
		return
	}
	for _, name := range sortedKeys(f.Weights) {
		np := []any{"fairness", "weights", name}
		if w := f.Weights[name]; w < 1 || w > 1000 {
			ps.add(np, "weight %d: must be 1 to 1000", w)
		}
		switch by {
		case FairByTenant:
			if !ValidTenant(name) {
				ps.add(np, "not a tenant name (letters, digits and _ . - only, at most 64; by: tenant weighs tenants)")
			}
		case FairByPartition:
			if err := CheckPartition(name); err != nil {
				ps.add(np, "not a valid partition: %v", err)
			}
		}
	}
}

// headers checks the headers the workers set on every request.
func (ps *Problems) headers(u Upstream) {
	idem := u.IdempotencyHeader
	switch {
	case u.NoIdempotencyHeader:
		idem = ""
	case idem == "":
		idem = DefaultIdempotencyHeader
	case !ValidHeaderName(idem):
		ps.add([]any{"idempotency_header"}, "%q is not a header name (letters, digits and !#$%%&'*+-.^_`|~)", idem)
	case ManagedHeader(idem):
		ps.add([]any{"idempotency_header"}, "%s is managed by the HTTP client", idem)
	}
	seen := map[string]string{}
	for _, name := range sortedKeys(u.Headers) {
		hp := []any{"headers", name}
		lower := strings.ToLower(name)
		switch {
		case !ValidHeaderName(name):
			ps.add(hp, "not a header name (letters, digits and !#$%%&'*+-.^_`|~)")
		case ManagedHeader(name):
			ps.add(hp, "managed by the HTTP client (remove it)")
		case idem != "" && lower == strings.ToLower(idem):
			ps.add(hp, "is the idempotency_header, which each job sets (remove it)")
		case seen[lower] != "":
			ps.add(hp, "the same header as %q (names are case-insensitive)", seen[lower])
		}
		seen[lower] = name
		// The value is not quoted back: it usually holds a credential.
		if strings.ContainsFunc(u.Headers[name], func(r rune) bool { return (r < 0x20 && r != '\t') || r == 0x7f }) {
			ps.add(hp, "value holds a line break or control character (not allowed in a header)")
		}
	}
}

// CheckBaseURL wants an absolute http(s) URL that a job's path can be
// appended to; credentials belong in headers, where logs do not print them.
func CheckBaseURL(s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return errors.New("not a valid URL (want e.g. https://api.stripe.com)")
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("scheme %q: want an absolute http:// or https:// URL", u.Scheme)
	case u.Opaque != "" || u.Host == "":
		return errors.New("no host (want e.g. https://api.stripe.com)")
	case u.User != nil:
		return errors.New("holds credentials (put them in headers, e.g. Authorization: \"Bearer ${TOKEN}\")")
	case u.RawQuery != "" || u.ForceQuery:
		return errors.New("has a query (a job's path carries its own query)")
	case u.Fragment != "" || strings.Contains(s, "#"):
		return errors.New("has a fragment (#…), which is never sent")
	case u.Port() != "" && !validPort(u.Port()):
		return fmt.Errorf("port %s: want 1 to 65535", u.Port())
	}
	return nil
}

func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n >= 1 && n <= 65535
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
