package queue

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// The rules for an HTTP job's request live here, with the job model, so the
// API refuses at the door exactly what a worker could not send as given:
// a job accepted with 202 must never go dead for its own path or headers
// after spending its attempts and pacing slots.

// Target resolves a job's path (with its query) against the upstream's base
// URL. The path is sent byte for byte as given, percent-encoding included:
// "/projects/a%2Fb" reaches the upstream as /projects/a%2Fb, which APIs such
// as GitLab's use for IDs that hold a slash. So that the request cannot leave
// the base URL, the path must start with a single "/", and Target refuses
// absolute URLs, "//host" forms, backslashes (raw or %5C), empty segments
// ("//" anywhere), fragments, and "." or ".." segments, also when
// percent-encoded ("%2e%2E") or hidden behind an encoded slash
// ("a%2F..%2Fb"), since some servers decode before they resolve. Characters
// that HTTP cannot carry as they are (spaces, controls, non-ASCII) must be
// percent-encoded by the producer; Target does not encode them silently.
func Target(base *url.URL, p string) (*url.URL, error) {
	if !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") {
		return nil, fmt.Errorf("path %q: must start with a single / and stay on the upstream", p)
	}
	rawPath, rawQuery, hasQuery := strings.Cut(p, "?")
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '\\':
			return nil, fmt.Errorf("path %q: must not contain a backslash", p)
		case c <= ' ' || c >= 0x7f:
			return nil, fmt.Errorf("path %q: byte %d is %q: percent-encode spaces, control and non-ASCII characters", p, i, c)
		case c == '#':
			return nil, fmt.Errorf("path %q: must not contain a fragment (#); percent-encode it as %%23 if it is data", p)
		}
	}
	if err := checkEscapes(rawPath); err != nil {
		return nil, fmt.Errorf("path %q: %v", p, err)
	}
	if err := checkEscapes(rawQuery); err != nil {
		return nil, fmt.Errorf("path %q: query: %v", p, err)
	}
	segments := strings.Split(rawPath[1:], "/")
	for i, seg := range segments {
		if seg == "" && i < len(segments)-1 {
			return nil, fmt.Errorf("path %q: must not contain empty segments (//)", p)
		}
		for c := 0; c < len(seg); c++ {
			if !pathByte(seg[c]) {
				return nil, fmt.Errorf("path %q: %q must be percent-encoded in a path", p, seg[c])
			}
		}
		decoded, _ := url.PathUnescape(seg) // checkEscapes vouched for it
		if strings.Contains(decoded, "\\") {
			return nil, fmt.Errorf("path %q: must not contain a backslash, even encoded", p)
		}
		for _, part := range strings.Split(decoded, "/") {
			if part == "." || part == ".." {
				return nil, fmt.Errorf("path %q: must not contain . or .. segments, even encoded", p)
			}
		}
	}
	u := *base
	u.RawPath = strings.TrimSuffix(base.EscapedPath(), "/") + rawPath
	decoded, err := url.PathUnescape(u.RawPath)
	if err != nil {
		return nil, fmt.Errorf("path %q: %v", p, err)
	}
	// net/url sends RawPath as is when it is a valid encoding of Path,
	// which the checks above ensure.
	u.Path = decoded
	u.RawQuery, u.ForceQuery = rawQuery, hasQuery && rawQuery == ""
	u.Fragment, u.RawFragment = "", ""
	if u.EscapedPath() != u.RawPath {
		return nil, fmt.Errorf("path %q: cannot be sent exactly as given", p)
	}
	return &u, nil
}

// pathByte reports whether c may appear unencoded in a path segment: RFC
// 3986's pchar (unreserved, sub-delims, ":", "@", and "%" of an escape),
// plus "[" and "]" which net/url also leaves alone.
func pathByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("-._~!$&'()*+,;=:@%[]", c) >= 0
}

// checkEscapes refuses a "%" that does not start two hex digits.
func checkEscapes(s string) error {
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			continue
		}
		if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
			return fmt.Errorf("%q is not a percent-escape (write %% as %%25)", s[i:min(i+3, len(s))])
		}
		i += 2
	}
	return nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// Errors of CheckHeader, for callers that word their own message.
var (
	// ErrHeaderName: the name is not an HTTP token.
	ErrHeaderName = errors.New("is not a valid header name")
	// ErrHeaderValue: the value holds bytes HTTP forbids in a field value.
	ErrHeaderValue = errors.New("value must not contain control characters such as line breaks or NUL")
	// ErrReservedHeader: the HTTP client sets the header itself.
	ErrReservedHeader = errors.New("is set by the HTTP client; a job may not set it")
)

// reservedHeader reports the headers the HTTP client sets or that describe
// the connection, so a job may not set them. Proxy-Authorization is among
// them: it speaks to a proxy between the worker and the upstream, which is
// the operator's (HTTPS_PROXY), not a producer's.
func reservedHeader(name string) bool {
	switch http.CanonicalHeaderKey(name) {
	case "Host", "Content-Length", "Transfer-Encoding", "Connection", "Keep-Alive",
		"Proxy-Connection", "Upgrade", "Te", "Trailer", "Proxy-Authorization", "Expect":
		return true
	}
	return false
}

// CheckHeader checks one of a job's headers by HTTP's own rules: the name is
// a token, the value holds no control characters other than tab (RFC 9110,
// section 5.5), and the header is not one the HTTP client owns. It wraps
// ErrHeaderName, ErrHeaderValue or ErrReservedHeader.
func CheckHeader(name, value string) error {
	switch {
	case !httpguts.ValidHeaderFieldName(name):
		return ErrHeaderName
	case !httpguts.ValidHeaderFieldValue(value):
		return ErrHeaderValue
	case reservedHeader(name):
		return ErrReservedHeader
	}
	return nil
}
