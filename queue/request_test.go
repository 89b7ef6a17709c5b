package queue

import (
	"errors"
	"net/url"
	"strings"
	"testing"
)

func TestTarget(t *testing.T) {
	base, _ := url.Parse("https://api.example/v4")
	for _, tc := range []struct {
		path string
		want string // the URL sent, or "" when refused
		why  string // part of the refusal
	}{
		{"/projects", "https://api.example/v4/projects", ""},
		{"/projects/", "https://api.example/v4/projects/", ""},
		{"/", "https://api.example/v4/", ""},
		{"/projects/a%2Fb/issues", "https://api.example/v4/projects/a%2Fb/issues", ""},
		{"/projects/a%2fb", "https://api.example/v4/projects/a%2fb", ""},
		{"/%2F", "https://api.example/v4/%2F", ""},
		{"/a%20b?q=x%20y&expand[]=c", "https://api.example/v4/a%20b?q=x%20y&expand[]=c", ""},
		{"/search?q=a+b&empty=", "https://api.example/v4/search?q=a+b&empty=", ""},
		{"/x?", "https://api.example/v4/x?", ""},
		{"/users/me@example.com;v=1", "https://api.example/v4/users/me@example.com;v=1", ""},
		{"/a/.well/b..c", "https://api.example/v4/a/.well/b..c", ""},
		{"https://evil.example/x", "", "single /"},
		{"//evil.example/x", "", "single /"},
		{"x", "", "single /"},
		{"", "", "single /"},
		{"/a//b", "", "empty segments"},
		{"/a/../b", "", ". or .."},
		{"/a/./b", "", ". or .."},
		{"/..", "", ". or .."},
		{"/a/%2e%2E/b", "", ". or .."},
		{"/a/%2E", "", ". or .."},
		{"/a%2F..%2Fadmin", "", ". or .."},
		{"/a\\b", "", "backslash"},
		{"/a%5Cb", "", "backslash"},
		{"/a?x=\\", "", "backslash"},
		{"/a b", "", "percent-encode"},
		{"/a\r\nHost: evil", "", "percent-encode"},
		{"/caf\u00e9", "", "percent-encode"},
		{"/a#frag", "", "fragment"},
		{"/a%zz", "", "percent-escape"},
		{"/a%2", "", "percent-escape"},
		{"/a?x=%", "", "percent-escape"},
		{"/a{b}", "", "percent-encoded in a path"},
		{"/a|b", "", "percent-encoded in a path"},
	} {
		got, err := Target(base, tc.path)
		switch {
		case tc.want == "" && err == nil:
			t.Errorf("Target(%q): got %s, want it refused (%s)", tc.path, got, tc.why)
		case tc.want == "" && !strings.Contains(err.Error(), tc.why):
			t.Errorf("Target(%q): got error %q, want it to say %q", tc.path, err, tc.why)
		case tc.want != "" && err != nil:
			t.Errorf("Target(%q): got error %v, want %s", tc.path, err, tc.want)
		case tc.want != "" && got.String() != tc.want:
			t.Errorf("Target(%q): got %s, want %s", tc.path, got, tc.want)
		}
	}
}

func TestTargetBaseWithSlash(t *testing.T) {
	base, _ := url.Parse("https://api.example.com/v2/")
	for path, want := range map[string]string{
		"/charges":                "https://api.example.com/v2/charges",
		"/charges?limit=3&x=%20y": "https://api.example.com/v2/charges?limit=3&x=%20y",
		"/a/b/":                   "https://api.example.com/v2/a/b/",
	} {
		if got, err := Target(base, path); err != nil || got.String() != want {
			t.Errorf("Target(%q): got %v, %v; want %s", path, got, err, want)
		}
	}
}

func TestCheckHeader(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		want        error
	}{
		{"X-Trace", "t1", nil},
		{"Content-Type", "application/json; charset=utf-8", nil},
		{"X-Tab", "a\tb", nil},
		{"X-Latin", "caf\xc3\xa9", nil}, // obs-text is allowed in values
		{"Bad Header", "v", ErrHeaderName},
		{"X-Caf\u00e9", "v", ErrHeaderName},
		{"", "v", ErrHeaderName},
		{"X:A", "v", ErrHeaderName},
		{"X-A", "v\r\nX-B: w", ErrHeaderValue},
		{"X-A", "v\x00", ErrHeaderValue},
		{"X-A", "v\x01", ErrHeaderValue},
		{"X-A", "v\x7f", ErrHeaderValue},
		{"host", "evil", ErrReservedHeader},
		{"Transfer-Encoding", "chunked", ErrReservedHeader},
		{"Proxy-Authorization", "Basic eA==", ErrReservedHeader},
		{"te", "trailers", ErrReservedHeader},
		{"EXPECT", "100-continue", ErrReservedHeader},
		{"X-Proxy-Authorization", "v", nil},
	} {
		if err := CheckHeader(tc.name, tc.value); !errors.Is(err, tc.want) {
			t.Errorf("CheckHeader(%q, %q): got %v, want %v", tc.name, tc.value, err, tc.want)
		}
	}
}
