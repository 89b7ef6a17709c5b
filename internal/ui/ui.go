// Package ui is the status page that `shaper serve` and `shaper dev` serve
// at /ui/: an HTML page, one script and one stylesheet, embedded in the
// binary so there is no front-end build and nothing to deploy beside it.
// The page is a client of the JSON API like any other: it takes its API key
// from the URL fragment (/ui/#key=KEY), which browsers never send, so the
// files themselves are public and the server needs no session of its own.
package ui

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed static
var static embed.FS

// Prefix is the path the page is served under; Handler expects requests
// whose paths start with it.
const Prefix = "/ui/"

// ContentSecurityPolicy is sent with every file: scripts and styles from
// this origin only (no inline script, no eval, no CDN), requests only to
// this origin's API, and never framed, so a page that holds an admin key
// runs nothing but its own embedded code.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; " +
	"connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// file is one embedded file, ready to serve.
type file struct {
	body        []byte
	contentType string
	etag        string
	// cache is the Cache-Control value: the page itself is never stored,
	// so an upgraded binary is seen on the next load; the script and
	// stylesheet are revalidated by ETag each time, so they change with it.
	cache string
}

// Handler serves the status page's files. Build it with New.
type Handler struct {
	files map[string]file // by path under Prefix; "" is the page
}

// New prepares the embedded files.
func New() (*Handler, error) {
	types := map[string]string{
		".html": "text/html; charset=utf-8",
		".js":   "text/javascript; charset=utf-8",
		".css":  "text/css; charset=utf-8",
	}
	h := &Handler{files: map[string]file{}}
	err := fs.WalkDir(static, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		ct, ok := types[path.Ext(p)]
		if !ok {
			return fmt.Errorf("ui: %s: no content type for its extension", p)
		}
		body, err := static.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		name := strings.TrimPrefix(p, "static/")
		f := file{body: body, contentType: ct, etag: `"` + hex.EncodeToString(sum[:16]) + `"`, cache: "no-cache"}
		if name == "index.html" {
			name, f.cache = "", "no-store"
		}
		h.files[name] = f
		return nil
	})
	if err != nil {
		return nil, err
	}
	if _, ok := h.files[""]; !ok {
		return nil, fmt.Errorf("ui: no index.html embedded")
	}
	return h, nil
}

// ServeHTTP answers GET and HEAD for the page (Prefix), its script and its
// stylesheet; any other path under Prefix is a 404, and the index is only
// served as Prefix, so there is one address to link to.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Content-Security-Policy", ContentSecurityPolicy)
	hdr.Set("X-Content-Type-Options", "nosniff")
	// The page's address never carries the key to another site: the
	// fragment is not sent in a Referer, and neither is anything else.
	hdr.Set("Referrer-Policy", "no-referrer")
	hdr.Set("X-Frame-Options", "DENY")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hdr.Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	name, ok := strings.CutPrefix(r.URL.Path, Prefix)
	f, found := h.files[name]
	if !ok || !found {
		hdr.Set("Cache-Control", "no-store")
		http.Error(w, "404 not found: the status page is at "+Prefix, http.StatusNotFound)
		return
	}
	hdr.Set("Content-Type", f.contentType)
	hdr.Set("Cache-Control", f.cache)
	hdr.Set("ETag", f.etag)
	// ServeContent answers If-None-Match with a 304 and HEAD without a body.
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(f.body))
}
