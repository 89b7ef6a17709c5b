package shaper

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// alwaysSensitive reports the request headers that are sensitive for every
// upstream, whatever its sensitive_headers say.
func alwaysSensitive(name string) bool {
	switch http.CanonicalHeaderKey(name) {
	case "Authorization", "Cookie", "Proxy-Authorization":
		return true
	}
	return false
}

// SensitiveHeader reports whether a job's request header is a secret that
// must not stay in Redis once the job has finished: Authorization, Cookie,
// Proxy-Authorization, and names that match one of SensitiveHeaders (see
// MatchHeader).
func (u Upstream) SensitiveHeader(name string) bool {
	if alwaysSensitive(name) {
		return true
	}
	for _, p := range u.SensitiveHeaders {
		if MatchHeader(p, name) {
			return true
		}
	}
	return false
}

// MatchHeader matches a header name against a pattern, ignoring case. In a
// pattern "*" stands for any run of characters, possibly empty
// ("X-*-Token" matches X-Api-Token and X-Auth-Session-Token); every other
// character stands for itself.
func MatchHeader(pattern, name string) bool {
	return globFold(strings.ToLower(pattern), strings.ToLower(name))
}

func globFold(p, s string) bool {
	// The classic greedy match with one backtrack point: linear enough for
	// header names, and no regexp to compile per pattern.
	pi, si, star, mark := 0, 0, -1, 0
	for si < len(s) {
		switch {
		case pi < len(p) && p[pi] == '*':
			star, mark = pi, si
			pi++
		case pi < len(p) && p[pi] == s[si]:
			pi++
			si++
		case star >= 0:
			mark++
			pi, si = star+1, mark
		default:
			return false
		}
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}

// ValidHeaderPattern checks a header-name pattern: HTTP token characters
// and "*", not empty.
func ValidHeaderPattern(p string) error {
	if p == "" {
		return errors.New("empty header pattern")
	}
	if !httpguts.ValidHeaderFieldName(strings.ReplaceAll(p, "*", "x")) {
		return fmt.Errorf("header pattern %q: only letters, digits, !#$%%&'+-.^_`|~ and * (any run of characters)", p)
	}
	return nil
}
