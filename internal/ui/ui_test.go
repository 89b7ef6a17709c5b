package ui

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func newHandler(t *testing.T) *Handler {
	t.Helper()
	h, err := New()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestFiles: each file is served with its own content type and caching,
// and every answer, a 404 included, carries the strict CSP. No request
// carries a key: the page is public and takes its key from the fragment,
// which the server never sees.
func TestFiles(t *testing.T) {
	h := newHandler(t)
	for _, tc := range []struct {
		method, path string
		code         int
		contentType  string
		cache        string
		body         string // a substring of the body
	}{
		{"GET", "/ui/", 200, "text/html; charset=utf-8", "no-store", `<script src="app.js" defer></script>`},
		{"HEAD", "/ui/", 200, "text/html; charset=utf-8", "no-store", ""},
		{"GET", "/ui/app.js", 200, "text/javascript; charset=utf-8", "no-cache", `"use strict";`},
		{"GET", "/ui/app.css", 200, "text/css; charset=utf-8", "no-cache", ":root"},
		{"GET", "/ui/index.html", 404, "text/plain; charset=utf-8", "no-store", "the status page is at /ui/"},
		{"GET", "/ui/nope.js", 404, "text/plain; charset=utf-8", "no-store", "404"},
		{"GET", "/ui/static/app.js", 404, "text/plain; charset=utf-8", "no-store", "404"},
		{"GET", "/ui/../go.mod", 404, "text/plain; charset=utf-8", "no-store", "404"},
		{"GET", "/elsewhere", 404, "text/plain; charset=utf-8", "no-store", "404"},
		{"POST", "/ui/", 405, "text/plain; charset=utf-8", "", "method not allowed"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, "http://shaper.test/", nil)
			req.URL.Path = tc.path // as given, uncleaned
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			res := rec.Result()
			body, _ := io.ReadAll(res.Body)
			if res.StatusCode != tc.code {
				t.Fatalf("got %d, want %d (%s)", res.StatusCode, tc.code, body)
			}
			if got := res.Header.Get("Content-Type"); got != tc.contentType {
				t.Errorf("Content-Type: got %q, want %q", got, tc.contentType)
			}
			if got := res.Header.Get("Cache-Control"); got != tc.cache {
				t.Errorf("Cache-Control: got %q, want %q", got, tc.cache)
			}
			if got := res.Header.Get("Content-Security-Policy"); got != ContentSecurityPolicy {
				t.Errorf("Content-Security-Policy: got %q, want %q", got, ContentSecurityPolicy)
			}
			for k, want := range map[string]string{"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"} {
				if got := res.Header.Get(k); got != want {
					t.Errorf("%s: got %q, want %q", k, got, want)
				}
			}
			if tc.method == "HEAD" && len(body) != 0 {
				t.Errorf("HEAD: got a body of %d bytes, want none", len(body))
			}
			if !strings.Contains(string(body), tc.body) {
				t.Errorf("body lacks %q:\n%.300s", tc.body, body)
			}
		})
	}
}

// TestCSPIsStrict: scripts come from this origin only, never inline or
// evaluated, and the page may not be framed.
func TestCSPIsStrict(t *testing.T) {
	directives := map[string]string{}
	for _, d := range strings.Split(ContentSecurityPolicy, ";") {
		name, value, _ := strings.Cut(strings.TrimSpace(d), " ")
		directives[name] = value
	}
	for name, want := range map[string]string{
		"default-src": "'none'", "script-src": "'self'", "style-src": "'self'", "connect-src": "'self'",
		"frame-ancestors": "'none'", "base-uri": "'none'",
	} {
		if got := directives[name]; got != want {
			t.Errorf("%s: got %q, want %q", name, got, want)
		}
	}
	if strings.Contains(ContentSecurityPolicy, "unsafe") {
		t.Errorf("CSP %q allows something unsafe", ContentSecurityPolicy)
	}
}

// TestRevalidation: the script and stylesheet answer If-None-Match with a
// 304, so "no-cache" costs a round trip and no body; a changed file has
// another ETag.
func TestRevalidation(t *testing.T) {
	h := newHandler(t)
	get := func(path, etag string) *http.Response {
		req := httptest.NewRequest("GET", path, nil)
		if etag != "" {
			req.Header.Set("If-None-Match", etag)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Result()
	}
	js, css := get("/ui/app.js", ""), get("/ui/app.css", "")
	etag := js.Header.Get("ETag")
	if etag == "" || etag == css.Header.Get("ETag") {
		t.Fatalf("ETags: got %q for the script and %q for the stylesheet, want two different ones", etag, css.Header.Get("ETag"))
	}
	if res := get("/ui/app.js", etag); res.StatusCode != http.StatusNotModified {
		t.Errorf("If-None-Match with the current ETag: got %d, want 304", res.StatusCode)
	}
	if res := get("/ui/app.js", `"stale"`); res.StatusCode != http.StatusOK {
		t.Errorf("If-None-Match with another ETag: got %d, want 200", res.StatusCode)
	}
}

// TestPageObeysItsCSP: the page loads only files this package serves, and
// neither the page nor the script uses what the CSP forbids (inline
// script or style, event-handler attributes, eval) or what would turn data
// from the API into markup. A browser would silently refuse those; this
// says which line.
func TestPageObeysItsCSP(t *testing.T) {
	h := newHandler(t)
	read := func(name string) string {
		f, ok := h.files[name]
		if !ok {
			t.Fatalf("%q is not served", name)
		}
		return string(f.body)
	}
	page := read("")
	for _, m := range regexp.MustCompile(`(?:src|href)="([^"]*)"`).FindAllStringSubmatch(page, -1) {
		if _, ok := h.files[m[1]]; !ok {
			t.Errorf("index.html loads %q, which is not served", m[1])
		}
	}
	for _, tc := range []struct {
		name, body string
		forbidden  *regexp.Regexp
	}{
		{"index.html", page, regexp.MustCompile(`<script>|<script [^>]*>[^<]|<style|\sstyle=|\son[a-z]+=|javascript:|https?://`)},
		// The SVG namespace is a name, not an address the page loads.
		{"app.js", strings.ReplaceAll(read("app.js"), `"http://www.w3.org/2000/svg"`, `SVG_NS`),
			regexp.MustCompile(`innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(|new Function|setAttribute\("style"|https?://`)},
	} {
		for i, line := range strings.Split(tc.body, "\n") {
			if m := tc.forbidden.FindString(line); m != "" {
				t.Errorf("%s:%d: %q is refused by the page's CSP, loads from elsewhere, or builds markup from data: %s", tc.name, i+1, m, strings.TrimSpace(line))
			}
		}
	}
}
