package shaper

import "testing"

func TestMatchHeader(t *testing.T) {
	for _, tc := range []struct {
		pattern, name string
		want          bool
	}{
		{"X-*-Token", "X-Api-Token", true},
		{"X-*-Token", "x-auth-session-token", true},
		{"X-*-Token", "X--Token", true},
		{"X-*-Token", "X-Token", false},
		{"X-*-Token", "X-Api-Tokens", false},
		{"*-Key", "Api-Key", true},
		{"*", "Anything", true},
		{"RateLimit*", "RateLimit-Remaining", true},
		{"RateLimit*", "ratelimit", true},
		{"X-Secret", "x-secret", true},
		{"X-Secret", "X-Secret-2", false},
		{"a*b*c", "aXbYbZc", true},
		{"a*b*c", "aXcYb", false},
	} {
		if got := MatchHeader(tc.pattern, tc.name); got != tc.want {
			t.Errorf("MatchHeader(%q, %q): got %v, want %v", tc.pattern, tc.name, got, tc.want)
		}
	}
	for _, p := range []string{"X-*-Token", "*", "Api_Key"} {
		if err := ValidHeaderPattern(p); err != nil {
			t.Errorf("ValidHeaderPattern(%q): %v", p, err)
		}
	}
	for _, p := range []string{"", "X Token", "X-Tok?en", "X-Töken", "X:Y"} {
		if err := ValidHeaderPattern(p); err == nil {
			t.Errorf("ValidHeaderPattern(%q): got nil, want an error", p)
		}
	}
	u := Upstream{SensitiveHeaders: []string{"X-*-Token"}}
	for _, name := range []string{"authorization", "Cookie", "PROXY-AUTHORIZATION", "X-Api-Token"} {
		if !u.SensitiveHeader(name) {
			t.Errorf("SensitiveHeader(%q): got false, want true", name)
		}
	}
	if u.SensitiveHeader("X-Trace") {
		t.Error("SensitiveHeader(X-Trace): got true, want false")
	}
}
