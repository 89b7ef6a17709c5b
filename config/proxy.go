package config

import (
	"time"

	"github.com/shaperhq/shaper"
)

// Proxy is how calls reach an upstream through shaper's proxy, `ANY
// /proxy/NAME/{rest}` on shaper serve and shaper dev: each call waits for
// its slot among the upstream's jobs and other calls, under the same
// limits, is sent with the upstream's headers and answers the upstream's
// answer as it comes. On by default for every HTTP upstream.
type Proxy struct {
	// Enabled serves the upstream at /proxy/NAME/. Default true; false
	// answers its calls 404.
	Enabled *bool `yaml:"enabled"`
	// MaxWait is the longest a call waits for its send slot before it is
	// answered 429 (with Retry-After) and not sent; a caller may ask for less
	// with the Shaper-Max-Wait header (seconds), never more. At most 1h.
	// Default 30s.
	MaxWait Duration `yaml:"max_wait"`
	// Listen also serves the upstream at the root of a listener of its own
	// (host:port or :port), for SDKs that change only host and port
	// (Stripe's Node library). Default none.
	Listen string `yaml:"listen"`
	// Cost estimates a call's costs from its request when the caller sends
	// no Shaper-Cost header: per cost a limit counts, a JSON pointer into
	// the request body ({tokens: {json: /max_tokens}}) or a request header
	// ({tokens: {header: X-Tokens}}). The answer then settles it by the
	// upstream's settle, as for jobs. Default none: a call costs one
	// request.
	Cost map[string]Settle `yaml:"cost"`
}

// shaperProxy is the proxy as the rest of shaper takes it.
func (u *Upstream) shaperProxy() shaper.Proxy {
	if u.Proxy == nil {
		return shaper.Proxy{}
	}
	p := shaper.Proxy{
		Disabled: u.Proxy.Enabled != nil && !*u.Proxy.Enabled,
		MaxWait:  time.Duration(u.Proxy.MaxWait),
		Listen:   u.Proxy.Listen,
	}
	if u.Proxy.Cost != nil {
		p.Cost = make(map[string]shaper.Settle, len(u.Proxy.Cost))
		for cost, s := range u.Proxy.Cost {
			p.Cost[cost] = s.Shaper()
		}
	}
	return p
}

// proxy checks what only the file can get wrong about an upstream's proxy;
// the rest is shaper.Upstream.Validate's.
func (k checker) proxy(p, name string, u *Upstream) {
	if u.Proxy == nil {
		return
	}
	pp := p + ".proxy"
	k.writtenZero(pp+".max_wait", u.Proxy.MaxWait == 0, "0s: must be positive (leave it out for the default %v)", Duration(shaper.DefaultProxyMaxWait))
	if u.Proxy.Listen != "" {
		k.listen(pp+".listen", u.Proxy.Listen)
	} else if k.set(pp + ".listen") {
		k.add(pp+".listen", "empty (leave it out to serve the upstream at /proxy/%s/ only)", name)
	}
	if u.Proxy.Cost != nil && len(u.Proxy.Cost) == 0 && k.set(pp+".cost") {
		k.add(pp+".cost", "an empty mapping (leave cost out, or name a cost: {tokens: {json: /max_tokens}})")
	}
}
