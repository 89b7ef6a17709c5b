package server

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/shaperhq/shaper/internal/ui"
)

// TestStatusPage: the API serves the status page at /ui/ with no key (the
// page reads its key from the URL fragment, which never reaches the
// server, and sends it to the API routes itself), under the page's CSP;
// its unknown files are the page's 404s, not the API's; and its requests
// are counted under one route label.
func TestStatusPage(t *testing.T) {
	f := newFixture(t, generous, 1000)
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	defer client.CloseIdleConnections()
	for _, tc := range []struct {
		name, path, auth string
		code             int
		contentType      string
		location         string
	}{
		{name: "the page, no key", path: "/ui/", code: 200, contentType: "text/html; charset=utf-8"},
		{name: "the page, an unknown key is not read", path: "/ui/", auth: "Bearer not-a-key", code: 200, contentType: "text/html; charset=utf-8"},
		{name: "its script", path: "/ui/app.js", code: 200, contentType: "text/javascript; charset=utf-8"},
		{name: "its stylesheet", path: "/ui/app.css", code: 200, contentType: "text/css; charset=utf-8"},
		{name: "an unknown file", path: "/ui/secrets.json", code: 404, contentType: "text/plain; charset=utf-8"},
		{name: "without the slash", path: "/ui", code: 307, location: "/ui/"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", f.hs.URL+tc.path, nil)
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			res, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != tc.code {
				t.Fatalf("got %d, want %d: %s", res.StatusCode, tc.code, body)
			}
			if got := res.Header.Get("Location"); got != tc.location {
				t.Errorf("Location: got %q, want %q", got, tc.location)
			}
			if tc.location != "" {
				return
			}
			if got := res.Header.Get("Content-Type"); got != tc.contentType {
				t.Errorf("Content-Type: got %q, want %q", got, tc.contentType)
			}
			if got := res.Header.Get("Content-Security-Policy"); got != ui.ContentSecurityPolicy {
				t.Errorf("Content-Security-Policy: got %q, want %q", got, ui.ContentSecurityPolicy)
			}
			if res.Header.Get("WWW-Authenticate") != "" || strings.Contains(string(body), "not-a-key") {
				t.Errorf("the page asked for or echoed a key: %v\n%.200s", res.Header, body)
			}
		})
	}
	for _, tc := range []struct {
		code string
		want float64
	}{{"200", 4}, {"404", 1}} {
		if got := sample(t, f.reg, "shaper_api_requests_total", map[string]string{"route": "GET /ui/", "code": tc.code}); got != tc.want {
			t.Errorf(`shaper_api_requests_total{route="GET /ui/",code=%q}: got %v, want %v`, tc.code, got, tc.want)
		}
	}
}
