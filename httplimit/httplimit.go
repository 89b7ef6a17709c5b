// Package httplimit is net/http middleware that admits requests through a
// shaper.Limiter (usually a tokenbucket.Limiter) and tells clients where
// they stand: the RateLimit and RateLimit-Policy headers of
// draft-ietf-httpapi-ratelimit-headers, the older X-RateLimit-* trio, and on
// refusal 429 with Retry-After and an RFC 9457 problem+json body. Requests
// are keyed by API key (hashed, so secrets never reach Redis), else by
// client IP, honouring X-Forwarded-For only from proxies you name. What
// happens when Redis is down is an explicit shaper.Fallible policy.
package httplimit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/wire"
)

// Policy is the limit as the RateLimit-Policy header announces it: Quota
// units per Window. For a token bucket, Quota is the capacity and Window
// the time an empty bucket takes to refill (tokenbucket.Limit.Window), so
// Quota/Window is the refill rate.
type Policy struct {
	// Name identifies the policy in both headers; empty means "default".
	Name string
	// Quota is the q parameter and X-RateLimit-Limit. Zero means the
	// limit each decision reports.
	Quota int64
	// Window is the w parameter, sent in whole seconds rounded up (at
	// least 1).
	Window time.Duration
}

func (p Policy) name() string {
	if p.Name == "" {
		return "default"
	}
	return p.Name
}

// String is the RateLimit-Policy header value, e.g. `"enqueue";q=10;w=10`.
func (p Policy) String() string {
	return fmt.Sprintf("%s;q=%d;w=%d", sfString(p.name()), p.Quota, max(1, ceilSeconds(p.Window)))
}

// Validate explains the first thing wrong with the policy, if anything.
func (p Policy) Validate() error {
	for _, r := range p.Name {
		if r < 0x20 || r > 0x7e {
			return fmt.Errorf("policy name %q: must be printable ASCII", p.Name)
		}
	}
	switch {
	case p.Quota < 0:
		return fmt.Errorf("policy quota %d: must not be negative", p.Quota)
	case p.Window < 0:
		return fmt.Errorf("policy window %v: must not be negative", p.Window)
	}
	return nil
}

// Config adjusts the middleware. The zero value keys by API key, else by
// the connection's peer address, charges one unit per request and fails
// open when Redis is unreachable.
type Config struct {
	// Policy is what the headers announce.
	Policy Policy
	// Key, when set, picks the bucket key for a request; returning ""
	// falls back to the default keying. Keys must not contain '{' or '}'.
	Key func(r *http.Request) string
	// TrustedProxies are the proxies whose X-Forwarded-For and X-Real-IP
	// headers are believed. Empty: those headers are ignored and the
	// client is the connection's peer, since anyone can send them.
	TrustedProxies []netip.Prefix
	// Cost, when set, is how many units a request charges; nil means 1.
	Cost func(r *http.Request) int64
	// OnRedisError is the failure policy; FailLocal needs Local.
	OnRedisError shaper.OnRedisError
	// Local decides under FailLocal, e.g. a tokenbucket.Local.
	Local shaper.Limiter
	// Logger receives the failure policy's ERROR records; nil means
	// slog.Default().
	Logger *slog.Logger
	// Observe, when set, is called for every decision made by the failure
	// policy, to count them.
	Observe func(policy shaper.OnRedisError, err error)
}

// Middleware admits requests through a limiter. Build it with New.
type Middleware struct {
	limiter shaper.Limiter
	policy  Policy
	key     func(*http.Request) string
	trusted []netip.Prefix
	cost    func(*http.Request) int64
}

// New returns middleware that asks l about every request, through a
// shaper.Fallible that applies cfg's failure policy.
func New(l shaper.Limiter, cfg Config) (*Middleware, error) {
	if l == nil {
		return nil, errors.New("httplimit: nil limiter")
	}
	if err := cfg.Policy.Validate(); err != nil {
		return nil, fmt.Errorf("httplimit: %w", err)
	}
	if cfg.OnRedisError == shaper.FailLocal && cfg.Local == nil {
		return nil, errors.New("httplimit: on_redis_error local needs a local limiter")
	}
	for _, p := range cfg.TrustedProxies {
		if !p.IsValid() {
			return nil, fmt.Errorf("httplimit: trusted proxy %v: not a valid prefix", p)
		}
	}
	return &Middleware{
		limiter: &shaper.Fallible{
			Limiter: l,
			Policy:  cfg.OnRedisError,
			Local:   cfg.Local,
			Name:    "http " + cfg.Policy.name(),
			Logger:  cfg.Logger,
			Observe: cfg.Observe,
		},
		policy:  cfg.Policy,
		key:     cfg.Key,
		trusted: cfg.TrustedProxies,
		cost:    cfg.Cost,
	}, nil
}

// Wrap returns next behind the limit. Every decision carries the rate-limit
// headers; a refused request gets 429 and never reaches next.
func (m *Middleware) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cost := int64(1)
		if m.cost != nil {
			cost = m.cost(r)
		}
		res, err := m.limiter.Allow(r.Context(), m.Key(r), cost)
		switch {
		case err == nil:
		case errors.Is(err, shaper.ErrInvalid):
			writeProblem(w, problem{Type: ProblemInvalid, Title: "Request cannot be admitted", Status: http.StatusBadRequest, Detail: err.Error()})
			return
		case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
			return // the client left; nobody reads an answer
		default:
			writeProblem(w, problem{Type: ProblemUnavailable, Title: "Admission limiter unavailable", Status: http.StatusServiceUnavailable, Detail: err.Error()})
			return
		}
		WriteHeaders(w.Header(), m.policy, res)
		if !res.Allowed {
			WriteTooManyRequests(w, m.policy, res)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Key is the bucket key for r: the Key function's answer if it gives one,
// else "key:" and a hash of the API key (Authorization: Bearer, or
// X-API-Key), else "ip:" and the client address (for IPv6 its /64, which
// one client usually holds whole).
func (m *Middleware) Key(r *http.Request) string {
	if m.key != nil {
		if k := m.key(r); k != "" {
			return k
		}
	}
	if secret := APIKey(r); secret != "" {
		return "key:" + hashSecret(secret)
	}
	ip := ClientIP(r, m.trusted)
	if !ip.IsValid() {
		return "ip:unknown"
	}
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return "ip:" + p.String()
	}
	return "ip:" + ip.String()
}

// hashSecret keeps API keys out of Redis (and out of its logs, dumps and
// replicas): 128 bits of SHA-256 still tell any two keys apart.
func hashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:16])
}

// APIKey is the request's API key: the token of `Authorization: Bearer`,
// else the X-API-Key header; "" when there is neither, or when
// Authorization names another scheme. The rules are shaper's API's own, so
// the middleware keys a request by the key the server authenticates.
func APIKey(r *http.Request) string {
	key, err := wire.APIKey(r)
	if err != nil {
		return "" // another scheme: no API key, so the client's address keys it
	}
	return key
}

// ClientIP is the address of the client that sent r. The connection's peer
// is the client unless it is one of the trusted proxies; then the client is
// the right-most X-Forwarded-For address that is not a trusted proxy, since
// everything left of that was written by the client and may be forged.
// Without X-Forwarded-For, a trusted proxy's X-Real-IP is used. An invalid
// Addr means the peer address could not be read.
func ClientIP(r *http.Request, trusted []netip.Prefix) netip.Addr {
	peer := parseAddr(r.RemoteAddr)
	if !peer.IsValid() || !isTrusted(peer, trusted) {
		return peer
	}
	var hops []string
	for _, v := range r.Header.Values("X-Forwarded-For") {
		hops = append(hops, strings.Split(v, ",")...)
	}
	if len(hops) == 0 {
		if real := parseAddr(r.Header.Get("X-Real-IP")); real.IsValid() {
			return real
		}
		return peer
	}
	client := peer
	for i := len(hops) - 1; i >= 0; i-- {
		hop := parseAddr(hops[i])
		if !hop.IsValid() {
			// A trusted proxy passed on something unreadable: the last
			// address we could vouch for is all we know.
			return client
		}
		client = hop
		if !isTrusted(hop, trusted) {
			return hop
		}
	}
	return client
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// parseAddr reads "1.2.3.4", "1.2.3.4:80", "2001:db8::1" or
// "[2001:db8::1]:443", dropping any zone and 4-in-6 mapping.
func parseAddr(s string) netip.Addr {
	s = strings.TrimSpace(s)
	a, err := netip.ParseAddr(s)
	if err != nil {
		ap, err := netip.ParseAddrPort(s)
		if err != nil {
			return netip.Addr{}
		}
		a = ap.Addr()
	}
	return a.WithZone("").Unmap()
}

// WriteHeaders sets the rate-limit headers for one decision:
// RateLimit-Policy, RateLimit (r remaining, t seconds until the allowance
// is full again), X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset
// (delta seconds), and Retry-After when res is a refusal. Seconds are
// rounded up, so a client that waits as told is never early.
func WriteHeaders(h http.Header, p Policy, res shaper.Result) {
	if p.Quota == 0 {
		p.Quota = res.Limit
	}
	reset := strconv.FormatInt(ceilSeconds(res.ResetAfter), 10)
	remaining := strconv.FormatInt(max(0, res.Remaining), 10)
	h.Set("RateLimit-Policy", p.String())
	h.Set("RateLimit", sfString(p.name())+";r="+remaining+";t="+reset)
	h.Set("X-RateLimit-Limit", strconv.FormatInt(p.Quota, 10))
	h.Set("X-RateLimit-Remaining", remaining)
	h.Set("X-RateLimit-Reset", reset)
	if !res.Allowed {
		h.Set("Retry-After", strconv.FormatInt(retryAfterSeconds(res), 10))
	}
}

// Problem types this package answers with.
const (
	ProblemRateLimited = wire.TypeRateLimited
	ProblemInvalid     = wire.TypeInvalid
	ProblemUnavailable = wire.TypeLimiterUnavailable
)

// WriteTooManyRequests answers 429 with the rate-limit headers and an RFC
// 9457 problem+json body whose retry_after repeats Retry-After.
func WriteTooManyRequests(w http.ResponseWriter, p Policy, res shaper.Result) {
	WriteHeaders(w.Header(), p, res)
	retry := retryAfterSeconds(res)
	unit := "seconds"
	if retry == 1 {
		unit = "second"
	}
	writeProblem(w, problem{
		Type:       ProblemRateLimited,
		Title:      "Rate limit exceeded",
		Status:     http.StatusTooManyRequests,
		Detail:     fmt.Sprintf("Rate limit %q exceeded; retry in %d %s.", p.name(), retry, unit),
		RetryAfter: retry,
	})
}

type problem = wire.Problem

func writeProblem(w http.ResponseWriter, p problem) { wire.WriteProblem(w, p) }

func retryAfterSeconds(res shaper.Result) int64 {
	return max(1, ceilSeconds(res.RetryAfter))
}

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// sfString renders s as a structured-field string (RFC 8941 §3.3.3).
func sfString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('"')
	return b.String()
}
