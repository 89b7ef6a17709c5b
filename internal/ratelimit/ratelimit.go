// Package ratelimit reads what an HTTP answer says about the rate limits
// behind it, in every common spelling, into one Reading: when to retry, how
// much of each quota is left and when it resets, and which limits the server
// states. It never fails: a header it cannot read is skipped, and the others
// still count, since an upstream's hints only inform shaper's own pacing.
//
// The headers it understands:
//
//   - Retry-After (RFC 9110 §10.2.3): delay seconds ("120", also "1.5"), or an
//     HTTP date in IMF-fixdate, RFC 850 or asctime form; a past date is 0.
//   - RateLimit-Policy and RateLimit as structured fields (RFC 9651), as
//     draft-ietf-httpapi-ratelimit-headers-10 defines them:
//     `RateLimit-Policy: "burst";q=100;w=60, "daily";q=1000;w=86400;qu="requests"`
//     states policies (q quota, w window in seconds, qu quota unit, pk partition
//     key, which is ignored), and `RateLimit: "burst";r=40;t=30` reports each
//     policy's remaining quota (r) and seconds until it resets (t). Names may be
//     strings or tokens; several items may share one field line or be split over
//     repeated lines; a RateLimit item takes its limit and unit from the policy
//     of the same name.
//   - The same two fields as draft -07 spelled them: `RateLimit: limit=100,
//     remaining=50, reset=30` (a dictionary) and `RateLimit-Policy: 100;w=60`
//     (unnamed policies).
//   - RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset of drafts -00 to
//     -06 (reset in delta seconds). RateLimit-Limit may list policies after the
//     quota: `10, 10;w=1, 1000;w=3600`.
//   - X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset,
//     X-RateLimit-Used and X-RateLimit-Resource as GitHub's REST API sends them
//     (reset a Unix time; the resource names the quota; limit minus used stands
//     in for a missing remaining), also X-RateLimit-Reset-After (Discord's delta
//     seconds, preferred to the reset when both are given) and the
//     X-Rate-Limit-* spelling.
//   - OpenAI's x-ratelimit-limit-NAME, x-ratelimit-remaining-NAME and
//     x-ratelimit-reset-NAME for NAME "requests", "tokens" or any other, the
//     reset in Go's duration syntax ("6m0s", "12ms", "1m30.5s") or seconds.
//   - Anthropic's anthropic-ratelimit-NAME-limit, -remaining and -reset (an RFC
//     3339 time), NAME being "requests", "tokens", "input-tokens" or
//     "output-tokens".
//
// A reset header outside the structured fields may be any of these: a
// number of seconds, read as a Unix time when larger than 1e9 (in
// milliseconds when larger than 1e12) and as a delay otherwise; a Go
// duration; an RFC 3339 time; an HTTP date. A reset in the past is 0.
//
// A quota is reported only when its remaining amount is given. A negative
// remaining means unknown (Azure OpenAI sends -1) unless a positive limit
// comes with it, when it means overdrawn and reads as 0. A structured field
// that does not parse is ignored as a whole, as RFC 9651 says; within one
// that does, an item of the wrong shape is skipped.
package ratelimit

import (
	"cmp"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dunglas/httpsfv"

	"github.com/shaperhq/shaper/internal/wire"
)

// Reading is everything one answer said about rate limits. The zero value
// means it said nothing.
type Reading struct {
	// RetryAfter is the Retry-After header's wait; 0 when there is none (or
	// when it says now).
	RetryAfter time.Duration
	// Quotas lists every remaining/reset pair the answer gave, in this order:
	// RateLimit, RateLimit-Remaining, X-RateLimit-*, X-Rate-Limit-*, then the
	// per-unit OpenAI and Anthropic headers sorted by name. One limit described
	// in several spellings appears once per spelling.
	Quotas []Quota
	// Policies lists the limits the server states: RateLimit-Policy's items in
	// order, then the w-items of RateLimit-Limit.
	Policies []Policy
}

// Quota is how much of one limit is left and when it resets.
type Quota struct {
	// Name is the policy name ("default"), the unit for the per-unit headers
	// ("requests", "tokens"), GitHub's resource ("core"), or "" when the
	// answer names none.
	Name string
	// Unit is what the quota counts: "requests" unless the answer says
	// otherwise (the draft's qu, or the per-unit headers' NAME).
	Unit string
	// Limit is the quota when full; 0 when unknown.
	Limit int64
	// Remaining is how much is left now; never negative.
	Remaining int64
	// Reset is how long until the quota resets, epoch forms converted with
	// the time Read was given; 0 when unknown or past.
	Reset time.Duration
	// HasReset tells a reset of 0 ("now") from none given.
	HasReset bool
	// Partitioned is set when the draft's pk says the quota belongs to one
	// partition of the server's traffic (an endpoint, a user), not to all
	// of it.
	Partitioned bool
}

// Policy is a limit the server states: Quota units per Window.
type Policy struct {
	// Name is the policy's name; "" for the older drafts' unnamed policies.
	Name string
	// Unit is what the quota counts: "requests" unless the draft's qu says
	// otherwise ("content-bytes", "concurrent-requests", ...).
	Unit string
	// Quota is how many units the window allows; always positive.
	Quota int64
	// Window is the policy's time window; 0 when the server did not say.
	Window time.Duration
	// Partitioned is set when the draft's pk says the policy applies to one
	// partition of the server's traffic, not to all of it.
	Partitioned bool
}

// unitRequests is the unit of every form that does not name one.
const unitRequests = "requests"

// Read reads the rate-limit headers of h; now converts dates and Unix times
// into durations.
func Read(h http.Header, now time.Time) Reading {
	if !namesLimits(h) {
		return Reading{}
	}
	return readAll(h, now)
}

// readAll is Read without the scan that skips answers with no
// rate-limit header.
func readAll(h http.Header, now time.Time) Reading {
	var r Reading
	r.RetryAfter, _ = wire.ParseRetryAfter(h.Get("Retry-After"), now)
	named := r.readPolicyField(h)
	r.readRateLimitField(h, named)
	r.readOldDraft(h, now)
	r.readXRateLimit(h, "X-Ratelimit-", now)
	r.readXRateLimit(h, "X-Rate-Limit-", now)
	r.readPerUnit(h, now)
	return r
}

// Exhausted is the quota over all of the server's traffic with nothing
// remaining that resets last: the one that holds the caller back longest.
// ok is false when no such quota is spent. Partitioned quotas are left to
// ExhaustedPartition.
func (r Reading) Exhausted() (q Quota, ok bool) { return r.exhausted(false) }

// NextUnit is how long until every spent quota over all of the server's
// traffic frees its next unit (see Quota.NextUnit): the longest of them,
// 0 when none is spent.
func (r Reading) NextUnit() time.Duration {
	var out time.Duration
	for _, c := range r.Quotas {
		if c.Remaining <= 0 && !c.Partitioned {
			out = max(out, c.NextUnit())
		}
	}
	return out
}

// ExhaustedPartition is Exhausted for quotas of one partition (the
// draft's pk): they concern this request's endpoint or user, not the rest.
func (r Reading) ExhaustedPartition() (q Quota, ok bool) { return r.exhausted(true) }

func (r Reading) exhausted(partitioned bool) (q Quota, ok bool) {
	for _, c := range r.Quotas {
		if c.Remaining > 0 || c.Partitioned != partitioned {
			continue
		}
		if !ok || c.Reset > q.Reset || (c.Reset == q.Reset && c.HasReset && !q.HasReset) {
			q, ok = c, true
		}
	}
	return q, ok
}

// RequestPolicies is the stated policies over all of the server's traffic
// (no pk) that count requests and say both a quota and a window, the ones
// a request rate can be paced at.
func (r Reading) RequestPolicies() []Policy {
	var ps []Policy
	for _, p := range r.Policies {
		if (p.Unit == "" || p.Unit == unitRequests) && p.Quota > 0 && p.Window > 0 && !p.Partitioned {
			ps = append(ps, p)
		}
	}
	return ps
}

// NextUnit is how soon the next unit of q frees, as its reset implies. The
// reset is the time until the quota is full again, so a limit that refills
// steadily (a token bucket, a sliding window) frees one unit every
// Reset/Limit; that is at least 1µs when the reset is in the future. Without
// a limit only the reset itself is known.
func (q Quota) NextUnit() time.Duration {
	if q.Limit <= 0 {
		return q.Reset
	}
	d := q.Reset / time.Duration(q.Limit)
	if q.Reset > 0 && d < time.Microsecond {
		d = time.Microsecond
	}
	return d
}

// String renders the quota, e.g. `"default" 0/40 requests left, resets in 1s`.
func (q Quota) String() string {
	limit := "?"
	if q.Limit > 0 {
		limit = strconv.FormatInt(q.Limit, 10)
	}
	reset := "reset unknown"
	if q.HasReset {
		reset = "resets in " + q.Reset.String()
	}
	out := fmt.Sprintf("%q %d/%s %s left, %s", q.Name, q.Remaining, limit, q.Unit, reset)
	if q.Partitioned {
		out += ", one partition's"
	}
	return out
}

// String renders the policy, e.g. `"burst" 100 requests per 1m0s`.
func (p Policy) String() string {
	window := "per unknown window"
	if p.Window > 0 {
		window = "per " + p.Window.String()
	}
	out := fmt.Sprintf("%q %d %s %s", p.Name, p.Quota, p.Unit, window)
	if p.Partitioned {
		out += ", one partition's"
	}
	return out
}

// readPolicyField reads RateLimit-Policy: draft -08 to -10 items are named
// policies, draft -05 to -07 items are a bare quota. It returns the named
// ones by name (the first of a repeated name wins) for RateLimit to refer to.
func (r *Reading) readPolicyField(h http.Header) map[string]Policy {
	list, ok := sfList(h, "RateLimit-Policy")
	if !ok {
		return nil
	}
	named := map[string]Policy{}
	for _, m := range list {
		it, ok := m.(httpsfv.Item)
		if !ok {
			continue
		}
		p := Policy{Unit: unitRequests}
		if name, ok := sfName(it.Value); ok {
			q, ok := intParam(it.Params, "q")
			if !ok || q <= 0 {
				continue
			}
			p.Name, p.Quota = name, q
			if qu, ok := stringParam(it.Params, "qu"); ok && qu != "" {
				p.Unit = qu
			}
		} else if q, ok := it.Value.(int64); ok && q > 0 {
			p.Quota = q
		} else {
			continue
		}
		if w, ok := secondsParam(it.Params, "w"); ok {
			p.Window = w
		}
		_, p.Partitioned = it.Params.Get("pk")
		r.Policies = append(r.Policies, p)
		if _, dup := named[p.Name]; p.Name != "" && !dup {
			named[p.Name] = p
		}
	}
	return named
}

// readRateLimitField reads RateLimit: a list of named items (draft -08 to
// -10) or, failing that, a dictionary of limit, remaining and reset (-07).
func (r *Reading) readRateLimitField(h http.Header, named map[string]Policy) {
	if list, ok := sfList(h, "RateLimit"); ok {
		for _, m := range list {
			it, ok := m.(httpsfv.Item)
			if !ok {
				continue
			}
			name, ok := sfName(it.Value)
			if !ok {
				continue
			}
			p := named[name]
			q := Quota{Name: name, Unit: cmp.Or(p.Unit, unitRequests), Limit: p.Quota}
			rem, ok := intParam(it.Params, "r")
			if !ok {
				continue
			}
			q.Reset, q.HasReset = secondsParam(it.Params, "t")
			_, pk := it.Params.Get("pk")
			q.Partitioned = pk || p.Partitioned
			r.addQuota(q, rem)
		}
		return
	}
	vals := h.Values("RateLimit")
	if len(vals) == 0 {
		return
	}
	d, err := httpsfv.UnmarshalDictionary(vals)
	if err != nil {
		return
	}
	q := Quota{Unit: unitRequests}
	rem, ok := dictInt(d, "remaining")
	if !ok {
		return
	}
	if l, ok := dictInt(d, "limit"); ok {
		q.Limit = l
	}
	if m, ok := d.Get("reset"); ok {
		if it, ok := m.(httpsfv.Item); ok {
			q.Reset, q.HasReset = seconds(it.Value)
		}
	}
	r.addQuota(q, rem)
}

// readOldDraft reads the RateLimit-Limit, -Remaining and -Reset trio.
func (r *Reading) readOldDraft(h http.Header, now time.Time) {
	q := Quota{Unit: unitRequests}
	if list, ok := sfList(h, "RateLimit-Limit"); ok {
		for i, m := range list {
			it, ok := m.(httpsfv.Item)
			if !ok {
				continue
			}
			n, ok := it.Value.(int64)
			if !ok || n <= 0 {
				continue
			}
			if i == 0 {
				q.Limit = n
			}
			if w, ok := secondsParam(it.Params, "w"); ok && w > 0 {
				r.Policies = append(r.Policies, Policy{Unit: unitRequests, Quota: n, Window: w})
			}
		}
	}
	rem, ok := parseCount(h.Get("RateLimit-Remaining"))
	if !ok {
		return
	}
	q.Reset, q.HasReset = parseReset(h.Get("RateLimit-Reset"), now)
	r.addQuota(q, rem)
}

// readXRateLimit reads the X-RateLimit-* family under prefix, in GitHub's
// spelling with the additions others make to it.
func (r *Reading) readXRateLimit(h http.Header, prefix string, now time.Time) {
	q := Quota{Unit: unitRequests, Name: strings.TrimSpace(h.Get(prefix + "Resource"))}
	limit, hasLimit := parseCount(h.Get(prefix + "Limit"))
	if hasLimit {
		q.Limit = limit
	}
	rem, ok := parseCount(h.Get(prefix + "Remaining"))
	if !ok {
		// GitHub documents Used alongside; remaining follows from it.
		used, hasUsed := parseCount(h.Get(prefix + "Used"))
		if !hasLimit || !hasUsed || limit <= 0 || used < 0 {
			return
		}
		rem = max(limit-used, 0)
	}
	q.Reset, q.HasReset = parseReset(h.Get(prefix+"Reset-After"), now)
	if !q.HasReset {
		q.Reset, q.HasReset = parseReset(h.Get(prefix+"Reset"), now)
	}
	r.addQuota(q, rem)
}

// readPerUnit reads the headers that carry a unit in their names, OpenAI's
// and Anthropic's, each family sorted by unit (then by key, should a
// hand-built header hold one name in two spellings), so that a Reading does
// not depend on the order of a map.
func (r *Reading) readPerUnit(h http.Header, now time.Time) {
	families := [...]struct {
		prefix, suffix string // around NAME in the remaining header's key
		limit, reset   func(name string) string
	}{
		{
			prefix: "X-Ratelimit-Remaining-",
			limit:  func(n string) string { return "X-Ratelimit-Limit-" + n },
			reset:  func(n string) string { return "X-Ratelimit-Reset-" + n },
		},
		{
			prefix: "Anthropic-Ratelimit-", suffix: "-Remaining",
			limit: func(n string) string { return "Anthropic-Ratelimit-" + n + "-Limit" },
			reset: func(n string) string { return "Anthropic-Ratelimit-" + n + "-Reset" },
		},
	}
	type found struct {
		key string
		q   Quota
	}
	for _, fam := range families {
		var quotas []found
		for key, vals := range h {
			if len(vals) == 0 || len(key) <= len(fam.prefix)+len(fam.suffix) ||
				!hasPrefixFold(key, fam.prefix) || !hasSuffixFold(key, fam.suffix) {
				continue
			}
			name := strings.ToLower(key[len(fam.prefix) : len(key)-len(fam.suffix)])
			rem, ok := parseCount(vals[0])
			if !ok {
				continue
			}
			q := Quota{Name: name, Unit: name}
			if l, ok := parseCount(h.Get(fam.limit(name))); ok {
				q.Limit = l
			}
			q.Reset, q.HasReset = parseReset(h.Get(fam.reset(name)), now)
			if q, ok := checkQuota(q, rem); ok {
				quotas = append(quotas, found{key, q})
			}
		}
		slices.SortFunc(quotas, func(a, b found) int {
			return cmp.Or(strings.Compare(a.q.Name, b.q.Name), strings.Compare(a.key, b.key))
		})
		for _, f := range quotas {
			r.Quotas = append(r.Quotas, f.q)
		}
	}
}

// addQuota appends q with remaining rem, if checkQuota keeps it.
func (r *Reading) addQuota(q Quota, rem int64) {
	if q, ok := checkQuota(q, rem); ok {
		r.Quotas = append(r.Quotas, q)
	}
}

// checkQuota sets q's remaining to rem. A negative remaining is an
// overdrawn quota when a positive limit comes with it, else a server's way
// of saying it does not know (Azure OpenAI's -1): then there is no quota.
func checkQuota(q Quota, rem int64) (Quota, bool) {
	q.Limit = max(q.Limit, 0)
	if rem < 0 && q.Limit == 0 {
		return Quota{}, false
	}
	q.Remaining = max(rem, 0)
	if !q.HasReset {
		q.Reset = 0
	}
	q.Reset = max(q.Reset, 0)
	return q, true
}

// sfList parses the field named key as an RFC 9651 list, its repeated lines
// joined as the RFC says. ok is false when the field is absent or, being
// malformed, is to be ignored as a whole.
func sfList(h http.Header, key string) (httpsfv.List, bool) {
	vals := h.Values(key)
	if len(vals) == 0 {
		return nil, false
	}
	list, err := httpsfv.UnmarshalList(vals)
	if err != nil {
		return nil, false
	}
	return list, true
}

// sfName is a policy name: a String or, as draft -10 also allows, a Token.
func sfName(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case httpsfv.Token:
		return string(v), true
	}
	return "", false
}

func intParam(p *httpsfv.Params, key string) (int64, bool) {
	if p == nil {
		return 0, false
	}
	v, ok := p.Get(key)
	if !ok {
		return 0, false
	}
	n, ok := v.(int64)
	return n, ok
}

func stringParam(p *httpsfv.Params, key string) (string, bool) {
	if p == nil {
		return "", false
	}
	v, ok := p.Get(key)
	if !ok {
		return "", false
	}
	return sfName(v)
}

// secondsParam reads a parameter in seconds, an integer as the drafts say
// or a decimal, as a duration. ok is false when absent or negative.
func secondsParam(p *httpsfv.Params, key string) (time.Duration, bool) {
	if p == nil {
		return 0, false
	}
	v, ok := p.Get(key)
	if !ok {
		return 0, false
	}
	return seconds(v)
}

// seconds turns a structured-field Integer or Decimal number of seconds
// into a duration.
func seconds(v any) (time.Duration, bool) {
	switch v := v.(type) {
	case int64:
		return secondsDuration(float64(v))
	case float64:
		return secondsDuration(v)
	}
	return 0, false
}

func dictInt(d *httpsfv.Dictionary, key string) (int64, bool) {
	m, ok := d.Get(key)
	if !ok {
		return 0, false
	}
	it, ok := m.(httpsfv.Item)
	if !ok {
		return 0, false
	}
	n, ok := it.Value.(int64)
	return n, ok
}

// maxSeconds is the longest wait a Duration holds, in seconds.
const maxSeconds = float64(math.MaxInt64 / time.Second)

// secondsDuration turns seconds into a duration, saturating rather than
// overflowing. ok is false for a negative or NaN value.
func secondsDuration(s float64) (time.Duration, bool) {
	if s < 0 || math.IsNaN(s) {
		return 0, false
	}
	if s >= maxSeconds {
		return time.Duration(math.MaxInt64), true
	}
	return time.Duration(s * float64(time.Second)), true
}

// parseCount reads a plain header count. A decimal is rounded down, so a
// fraction of a unit is never counted as available.
func parseCount(v string) (int64, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		return n, true
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	f = math.Floor(f)
	if f >= math.MaxInt64 || f <= math.MinInt64 {
		return 0, false
	}
	return int64(f), true
}

// Unix times in seconds and milliseconds are told from delta seconds by
// size: no quota resets more than 30 years ahead.
const (
	epochSeconds      = 1e9
	epochMilliseconds = 1e12
)

// parseReset reads a reset header: seconds (delta, or a Unix time in
// seconds or milliseconds if that large), a Go duration ("6m0s", "12ms"),
// an RFC 3339 time or an HTTP date. A reset in the past is 0.
func parseReset(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		switch {
		case f < 0 || math.IsNaN(f) || math.IsInf(f, 0):
			return 0, false
		case f > epochMilliseconds:
			return until(time.UnixMilli(int64(min(f, math.MaxInt64/2))), now), true
		case f > epochSeconds:
			sec, frac := math.Modf(f)
			return until(time.Unix(int64(sec), int64(frac*1e9)), now), true
		}
		return secondsDuration(f)
	}
	if d, err := time.ParseDuration(v); err == nil {
		if d < 0 {
			return 0, false
		}
		return d, true
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return until(t, now), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return until(t, now), true
	}
	return 0, false
}

// until is how long from now to t, 0 if t is past.
func until(t, now time.Time) time.Duration {
	return max(t.Sub(now), 0)
}

// namesLimits reports whether h has a header Read looks at: Retry-After,
// or one whose name holds "ratelimit" or "rate-limit" in any case (every
// form above does). Most answers have none, and cost only this scan of
// their names.
func namesLimits(h http.Header) bool {
	for k := range h {
		if strings.EqualFold(k, "Retry-After") || containsFold(k, "ratelimit") || containsFold(k, "rate-limit") {
			return true
		}
	}
	return false
}

func containsFold(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if strings.EqualFold(s[i:i+len(sub)], sub) {
			return true
		}
	}
	return false
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

func hasSuffixFold(s, suffix string) bool {
	return len(s) >= len(suffix) && strings.EqualFold(s[len(s)-len(suffix):], suffix)
}
