package shaper

import "time"

// DefaultProxyMaxWait is how long a proxied call waits for its send slot
// when neither the caller (Shaper-Max-Wait) nor the upstream says.
const DefaultProxyMaxWait = 30 * time.Second

// Proxy is how an upstream is reached through shaper's proxy
// (`ANY /proxy/{upstream}/{rest}` on `shaper serve`): a call waits for its
// slot among the upstream's jobs and other calls, is sent with the
// upstream's Headers, and answers the upstream's answer. Every HTTP
// upstream is reachable so unless Disabled; a Go-handler upstream never is.
type Proxy struct {
	// Disabled turns the proxy off for this upstream: its calls answer 404.
	Disabled bool
	// MaxWait is the longest a call waits for its slot (a caller may ask
	// for less with Shaper-Max-Wait, never more). Default DefaultProxyMaxWait.
	MaxWait time.Duration
	// Listen, when set, also serves the upstream at the root of a
	// listener of its own (host:port), for SDKs that change only host and
	// port.
	Listen string
	// Cost estimates a call's costs from its request body when the caller
	// sends no Shaper-Cost: per cost name, a JSON pointer into the body
	// ({tokens: /max_tokens}); Header sources read a request header.
	Cost map[string]Settle
}

// Proxied reports whether the upstream is reachable through the proxy.
func (u Upstream) Proxied() bool { return u.BaseURL != "" && !u.Proxy.Disabled }

// proxy checks how the upstream is proxied.
func (ps *Problems) proxy(u Upstream) {
	p := u.Proxy
	if u.BaseURL == "" && (p.Listen != "" || len(p.Cost) > 0 || p.MaxWait != 0) {
		ps.add([]any{"proxy"}, "an upstream served by a Go handler makes no HTTP calls to proxy (remove proxy)")
		return
	}
	switch {
	case p.MaxWait < 0:
		ps.add([]any{"proxy", "max_wait"}, "%v: must be positive", p.MaxWait)
	case p.MaxWait > time.Hour:
		ps.add([]any{"proxy", "max_wait"}, "%v: must be at most 1h (a caller holds its connection open that long)", p.MaxWait)
	}
	counted := map[string]bool{}
	for _, l := range u.Limits {
		counted[l.Cost] = true
	}
	for _, cost := range sortedKeys(p.Cost) {
		cp := []any{"proxy", "cost", cost}
		if cost == "" || !counted[cost] {
			ps.add(cp, "no limit of the upstream counts %q, so a call's estimate of it would count nowhere", cost)
			continue
		}
		if err := p.Cost[cost].Validate(); err != nil {
			ps.add(cp, "%v", err)
		}
	}
}
