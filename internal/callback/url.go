// Package callback delivers the signed callbacks of jobs that reach a final
// state (succeeded, dead, cancelled) to their callback_url: at least once,
// through crashes (the delivery is recorded by the same script that makes
// the job final, and claimed under a lease), signed per Standard Webhooks,
// paced per destination host, and only to allowed hosts, never through a
// redirect nor to an internal address the allowlist does not name as such.
//
// The API checks a job's URL with CheckURL at enqueue; `shaper work` runs a
// Deliverer.
package callback

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
)

// ErrHostNotAllowed is CheckURL's error for a URL whose host is not in the
// allowlist.
var ErrHostNotAllowed = errors.New("host is not in callbacks.allowed_hosts")

// maxURL bounds a callback_url's length.
const maxURL = 2048

// CheckURL reports whether raw may be a job's callback_url: an absolute
// http or https URL without credentials or fragment, whose host as written
// (host, or host:port) is one of allowed, matched exactly without regard
// to case (an entry host:* names its host with any port). Nothing is resolved: http://2130706433/ or http://0177.0.0.1/
// name hosts "2130706433" and "0177.0.0.1", allowed only if listed so.
func CheckURL(raw string, allowed []string) error {
	if len(raw) > maxURL {
		return fmt.Errorf("longer than %d bytes", maxURL)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("is not a URL: %v", err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("%q: want an absolute http:// or https:// URL", raw)
	case u.User != nil:
		return errors.New("holds credentials (user:password@); a callback is authenticated by its signature")
	case u.Host == "" || u.Opaque != "":
		return fmt.Errorf("%q: no host", raw)
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return errors.New("holds a fragment (#...), which is never sent")
	}
	if !allowedHost(u.Host, allowed) {
		return fmt.Errorf("%q: %w", u.Host, ErrHostNotAllowed)
	}
	return nil
}

// allowedHost reports whether host (host or host:port, as written) is
// named by allowed: an entry equal to it without regard to case, or an
// entry host:* naming its host with any port (a host written without a
// port is not matched by host:*).
func allowedHost(host string, allowed []string) bool {
	for _, h := range allowed {
		if strings.EqualFold(h, host) {
			return true
		}
		if name, ok := strings.CutSuffix(h, ":*"); ok {
			if i := strings.LastIndexByte(host, ':'); i > 0 && !strings.HasSuffix(host, "]") && strings.EqualFold(name, host[:i]) && host[i+1:] != "" {
				return true
			}
		}
	}
	return false
}

// internal reports whether ip is an address no callback goes to unless
// the allowlist names it: loopback, link-local, private, unspecified,
// multicast, shared (CGNAT) and "this network", in IPv4 and IPv6, an
// IPv4-mapped IPv6 address judged as its IPv4 one.
func internal(ip netip.Addr) bool {
	ip = ip.Unmap()
	if !ip.IsValid() {
		return true
	}
	if ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsInterfaceLocalMulticast() ||
		ip.IsPrivate() || ip.IsUnspecified() || ip.IsMulticast() {
		return true
	}
	if ip.Is4() {
		b := ip.As4()
		return b[0] == 0 || b[0] == 100 && b[1]&0xc0 == 64 || b[0] == 255
	}
	// NAT64 and the documentation or discard prefixes reach nowhere a
	// callback belongs either.
	for _, p := range []netip.Prefix{netip.MustParsePrefix("64:ff9b::/96"), netip.MustParsePrefix("100::/64")} {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// addressAllowed reports whether the resolved address (ip:port) is named
// by allowed as written: ip, ip:port, ip:*, or for IPv6 [ip], [ip]:port
// or [ip]:*.
func addressAllowed(address string, allowed []string) bool {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	s := ip.Unmap().String()
	forms := []string{s, net.JoinHostPort(s, port)}
	if ip.Unmap().Is6() {
		forms = append(forms, "["+s+"]")
	}
	for _, f := range forms {
		if allowedHost(f, allowed) {
			return true
		}
	}
	return false
}
