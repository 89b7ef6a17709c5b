package apicheck

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

// TestCheck: exchanges that keep to the document pass, and each way of
// breaking it is caught.
func TestCheck(t *testing.T) {
	c, err := New()
	if err != nil {
		t.Fatal(err)
	}
	const job = `{"id":"stripe.default.x","tenant":"billing","upstream":"stripe","lane":"default","state":"queued",
		"attempts":0,"max_attempts":3,"idempotency_key":"k","created_at":"2026-11-30T09:00:00Z"}`
	const accepted = `{"id":"stripe.default.x","state":"queued","upstream":"stripe","lane":"default","idempotency_key":"k","created_at":"2026-11-30T09:00:00Z"}`
	const notFound = `{"type":"https://shaperhq.github.io/problems/not-found","title":"Not found","status":404}`
	rl := map[string]string{"RateLimit-Policy": `"enqueue";q=10;w=10`, "RateLimit": `"enqueue";r=9;t=1`,
		"X-RateLimit-Limit": "10", "X-RateLimit-Remaining": "9", "X-RateLimit-Reset": "1"}
	with := func(h map[string]string, more ...string) map[string]string {
		out := map[string]string{}
		for k, v := range h {
			out[k] = v
		}
		for i := 0; i+1 < len(more); i += 2 {
			out[more[i]] = more[i+1]
		}
		return out
	}
	for _, tc := range []struct {
		name           string
		method, path   string
		reqBody        string
		status         int
		ctype          string
		headers        map[string]string
		respBody       string
		wantErr        string // "" for none
		withoutAuthKey bool
	}{
		{name: "health", method: "GET", path: "/healthz", status: 200, ctype: "text/plain; charset=utf-8", respBody: "ok\n"},
		{name: "undocumented status", method: "GET", path: "/healthz", status: 500, ctype: "text/plain", respBody: "no", wantErr: "status is not supported"},
		{name: "job", method: "GET", path: "/v1/jobs/stripe.default.x", status: 200, ctype: "application/json", respBody: job},
		{name: "undocumented field", method: "GET", path: "/v1/jobs/stripe.default.x", status: 200, ctype: "application/json",
			respBody: strings.Replace(job, `"tenant"`, `"colour":"red","tenant"`, 1), wantErr: "colour"},
		{name: "wrong content type", method: "GET", path: "/v1/jobs/stripe.default.x", status: 200, ctype: "text/html", respBody: job, wantErr: "text/html"},
		{name: "enqueued", method: "POST", path: "/v1/jobs", reqBody: `{"upstream":"stripe","path":"/x"}`, status: 202, ctype: "application/json",
			headers: with(rl, "Location", "/v1/jobs/stripe.default.x"), respBody: accepted},
		{name: "required header missing", method: "POST", path: "/v1/jobs", reqBody: `{"upstream":"stripe","path":"/x"}`, status: 202, ctype: "application/json",
			headers: rl, respBody: accepted, wantErr: `"Location" missing`},
		{name: "header of the wrong type", method: "POST", path: "/v1/jobs", reqBody: `{"upstream":"stripe","path":"/x"}`, status: 202, ctype: "application/json",
			headers: with(rl, "Location", "/v1/jobs/stripe.default.x", "X-RateLimit-Reset", "soon"), respBody: accepted, wantErr: "X-RateLimit-Reset"},
		{name: "own header undocumented", method: "GET", path: "/v1/jobs/stripe.default.x", status: 404, ctype: "application/problem+json",
			headers: map[string]string{"Retry-After": "1"}, respBody: notFound, wantErr: "Retry-After"},
		{name: "accepted a request the document forbids", method: "POST", path: "/v1/jobs", reqBody: `{"upstream":"stripe","path":"/x","colour":"red"}`,
			status: 202, ctype: "application/json", headers: with(rl, "Location", "/v1/jobs/stripe.default.x"), respBody: accepted, wantErr: "does not allow"},
		{name: "refused a request the document forbids", method: "POST", path: "/v1/jobs", reqBody: `{"upstream":"stripe","path":"/x","colour":"red"}`,
			status: 400, ctype: "application/problem+json", headers: rl,
			respBody: `{"type":"https://shaperhq.github.io/problems/invalid-request","title":"Invalid request","status":400,"detail":"unknown field"}`},
		{name: "batch item refused on its own", method: "POST", path: "/v1/jobs/batch", reqBody: `{"jobs":[{"upstream":"stripe","colour":"red"}]}`,
			status: 200, ctype: "application/json", headers: rl,
			respBody: `{"results":[{"index":0,"status":400,"error":{"type":"https://shaperhq.github.io/problems/invalid-request","title":"Invalid job","status":400}}]}`},
		{name: "batch of the wrong shape accepted", method: "POST", path: "/v1/jobs/batch", reqBody: `{"jobs":[{"upstream":"stripe"}],"x":1}`,
			status: 200, ctype: "application/json", headers: rl,
			respBody: `{"results":[{"index":0,"status":202,"job":` + accepted + `}]}`, wantErr: "does not allow"},
		{name: "batch with a bad item and a bad field accepted", method: "POST", path: "/v1/jobs/batch", reqBody: `{"jobs":[{"upstream":"stripe","colour":"red"}],"x":1}`,
			status: 200, ctype: "application/json", headers: rl,
			respBody: `{"results":[{"index":0,"status":400,"error":{"type":"https://shaperhq.github.io/problems/invalid-request","title":"Invalid job","status":400}}]}`,
			wantErr:  "does not allow"},
		{name: "no key yet accepted", method: "GET", path: "/v1/jobs/stripe.default.x", status: 200, ctype: "application/json", respBody: job,
			withoutAuthKey: true, wantErr: "does not allow"},
		{name: "problem without its type", method: "GET", path: "/v1/upstreams/x", status: 404, ctype: "application/problem+json",
			respBody: `{"title":"Not found","status":404}`, wantErr: "type"},
		{name: "unknown route", method: "GET", path: "/v2/jobs", status: 404, ctype: "application/problem+json", respBody: notFound},
		{name: "undocumented route", method: "GET", path: "/v2/jobs", status: 200, ctype: "application/json", respBody: `{}`, wantErr: "undocumented route"},
		{name: "a page", method: "GET", path: "/ui/", status: 200, ctype: "text/html; charset=utf-8", respBody: "<p>"},
		{name: "a page as JSON", method: "GET", path: "/ui/", status: 200, ctype: "application/json", respBody: "{}", wantErr: "application/json"},
		{name: "body where none is documented", method: "POST", path: "/v1/upstreams/stripe/retry-dead", status: 403, ctype: "text/plain", respBody: "no",
			wantErr: "text/plain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, "http://shaper.test"+tc.path, strings.NewReader(tc.reqBody))
			if !tc.withoutAuthKey {
				req.Header.Set("Authorization", "Bearer k")
			}
			if tc.reqBody != "" {
				req.Header.Set("Content-Type", "application/json")
			}
			resp := &http.Response{StatusCode: tc.status, Header: http.Header{}}
			resp.Header.Set("Content-Type", tc.ctype)
			for k, v := range tc.headers {
				resp.Header.Set(k, v)
			}
			err := c.Check(req, []byte(tc.reqBody), resp, []byte(tc.respBody))
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("got %v, want no error", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("got %v, want an error naming %q", err, tc.wantErr)
			}
		})
	}
}

// recordingTB is a test that keeps its errors and cleanups, so that a
// test can see what Transport reports.
type recordingTB struct {
	testing.TB
	errs     []string
	cleanups []func()
}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recordingTB) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }

// TestTransport: the exchange goes on as answered, and a mismatch is
// reported when the test ends.
func TestTransport(t *testing.T) {
	c, err := New()
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			w.Write([]byte("ok\n"))
			return
		}
		w.WriteHeader(http.StatusTeapot)
		w.Write([]byte("short and stout"))
	}))
	defer hs.Close()
	rec := &recordingTB{TB: t}
	hc := c.Client(rec)
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := hc.Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if path == "/readyz" && (resp.StatusCode != http.StatusTeapot || string(body) != "short and stout") {
			t.Fatalf("got %d %q, want the answer as the server gave it", resp.StatusCode, body)
		}
	}
	if len(rec.errs) != 0 || len(rec.cleanups) != 1 {
		t.Fatalf("got %d errors and %d cleanups before the end, want none and one", len(rec.errs), len(rec.cleanups))
	}
	rec.cleanups[0]()
	if len(rec.errs) != 1 || !strings.Contains(rec.errs[0], "GET /readyz: answer 418") {
		t.Fatalf("got errors %q, want one about GET /readyz's 418", rec.errs)
	}
}

// TestWaitingCounts: the counts of held jobs take only the three causes.
func TestWaitingCounts(t *testing.T) {
	c, err := New()
	if err != nil {
		t.Fatal(err)
	}
	s := c.doc.Components.Schemas["WaitingCounts"].Value
	for _, tc := range []struct {
		v  map[string]any
		ok bool
	}{
		{map[string]any{}, true},
		{map[string]any{"pause": 2.0, "pushback": 1.0, "limit": 0.0}, true},
		{map[string]any{"sleep": 1.0}, false},
		{map[string]any{"pause": -1.0}, false},
	} {
		err := s.VisitJSON(tc.v, openapi3.EnableJSONSchema2020())
		if (err == nil) != tc.ok {
			t.Errorf("%v: got %v, want ok %v", tc.v, err, tc.ok)
		}
	}
}
