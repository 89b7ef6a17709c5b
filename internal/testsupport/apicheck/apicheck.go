// Package apicheck holds HTTP exchanges with shaper's API to its published
// OpenAPI document (package api), for tests: every request a test sends and
// every answer it gets goes through Checker.Check, usually by way of the
// http.RoundTripper from Transport (which checks them when the test ends,
// off the clock of tests that time the server), so a status, header or
// field the document does not describe fails the test that met it. The
// document is tested against the server this way, not trusted.
//
// What is checked, for an exchange on a documented operation:
//   - the answer: its status must be documented for the operation; its
//     headers as documented (each required one present, each value of its
//     schema), and none of the API's own headers (Location, Retry-After and
//     the rate-limit ones, WWW-Authenticate) where the document does not
//     list it; its body of a documented content type and schema, so an
//     undocumented field fails where the schema is closed.
//   - the request, when the server accepted it (2xx): a request the server
//     takes must be one the document allows, or generated clients could not
//     send it. A request the server refused may well break the document; that
//     is often why it was refused.
//
// An exchange on no documented route must be the server's 404 problem.
package apicheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"

	"github.com/shaperhq/shaper/api"
)

// PerItemErrors is the extension an operation carries when an invalid item
// of its request body does not fail the request but gets its own result
// (POST /v1/jobs/batch); its value names the array of items ("jobs"). A
// request answered 2xx may then break the schema within an item, and
// nowhere else.
const PerItemErrors = "x-per-item-errors"

// ownHeaders are the response headers the API itself sets: where one
// appears, the document must list it.
func ownHeaders() []string {
	return []string{"Location", "Retry-After", "RateLimit", "RateLimit-Policy",
		"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "WWW-Authenticate"}
}

// Checker checks exchanges against the document. It is safe for concurrent
// use.
type Checker struct {
	doc *openapi3.T
	// routes holds every documented operation in a ServeMux, so a request
	// finds its operation by the very rules the server's mux routes it by.
	routes *http.ServeMux
	ops    map[string]*routers.Route // by "METHOD PATH"

	// mu serialises validation: kin-openapi compiles and caches schemas
	// as it goes.
	mu sync.Mutex
}

// New loads and validates the embedded document.
func New() (*Checker, error) {
	doc, err := openapi3.NewLoader().LoadFromData(api.YAML())
	if err != nil {
		return nil, fmt.Errorf("load openapi.yaml: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("validate openapi.yaml: %w", err)
	}
	c := &Checker{doc: doc, routes: http.NewServeMux(), ops: map[string]*routers.Route{}}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			pattern := method + " " + path
			c.ops[pattern] = &routers.Route{Spec: doc, Path: path, PathItem: item, Method: method, Operation: op}
			c.routes.Handle(pattern, http.NotFoundHandler())
		}
	}
	return c, nil
}

// Operations lists the documented operations as ServeMux patterns
// ("GET /v1/jobs/{id}"), sorted.
func (c *Checker) Operations() []string {
	out := make([]string, 0, len(c.ops))
	for p := range c.ops {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// Check checks one exchange: req as sent with its body, resp as answered
// with its body (the bodies are passed apart since both have been read).
func (c *Checker) Check(req *http.Request, reqBody []byte, resp *http.Response, respBody []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, pattern := c.routes.Handler(req)
	route, ok := c.ops[pattern]
	if !ok {
		return c.checkUnrouted(req, resp, respBody)
	}
	ctx := context.Background()
	opts := &openapi3filter.Options{IncludeResponseStatus: true, AuthenticationFunc: authenticate}
	in := &openapi3filter.RequestValidationInput{
		Request:    withBody(req, reqBody),
		PathParams: pathParams(route.Path, req.URL.EscapedPath()),
		Route:      route,
		// Every failure, so that withinItems sees them all.
		Options: &openapi3filter.Options{MultiError: true, AuthenticationFunc: authenticate},
	}
	if err := openapi3filter.ValidateRequest(ctx, in); err != nil && resp.StatusCode/100 == 2 {
		if items, _ := route.Operation.Extensions[PerItemErrors].(string); items == "" || !withinItems(err, items) {
			return fmt.Errorf("%s %s: the server answered %d to a request the document does not allow: %w",
				req.Method, req.URL.Path, resp.StatusCode, err)
		}
	}
	in.Request, in.Options = withBody(req, reqBody), opts
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header, Options: opts}
	out.SetBodyBytes(respBody)
	if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
		return fmt.Errorf("%s %s: answer %d does not match the document: %w", req.Method, req.URL.Path, resp.StatusCode, err)
	}
	ref := route.Operation.Responses.Status(resp.StatusCode)
	if ref == nil || ref.Value == nil {
		return fmt.Errorf("%s %s: answer %d is not documented", req.Method, req.URL.Path, resp.StatusCode)
	}
	doc := ref.Value
	for _, h := range ownHeaders() {
		if resp.Header.Get(h) != "" && doc.Headers[h] == nil {
			return fmt.Errorf("%s %s: answer %d carries %s: %q, which the document does not list for it",
				req.Method, req.URL.Path, resp.StatusCode, h, resp.Header.Get(h))
		}
	}
	if len(respBody) > 0 && len(doc.Content) == 0 {
		return fmt.Errorf("%s %s: answer %d has a body (%s) the document does not describe",
			req.Method, req.URL.Path, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return nil
}

// checkUnrouted checks an exchange on no documented operation: it must be
// the server's 404 problem, which every unknown route gets.
func (c *Checker) checkUnrouted(req *http.Request, resp *http.Response, body []byte) error {
	if resp.StatusCode != http.StatusNotFound {
		return fmt.Errorf("%s %s: no operation in the document, yet the server answered %d (an undocumented route?)",
			req.Method, req.URL.Path, resp.StatusCode)
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "application/problem+json" {
		return fmt.Errorf("%s %s: a 404 for an unknown route as %q, want application/problem+json", req.Method, req.URL.Path, mt)
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Errorf("%s %s: a 404 problem that is not JSON: %w", req.Method, req.URL.Path, err)
	}
	if err := c.doc.Components.Schemas["Problem"].Value.VisitJSON(v, openapi3.EnableJSONSchema2020(), openapi3.VisitAsResponse()); err != nil {
		return fmt.Errorf("%s %s: a 404 that is not a Problem: %w", req.Method, req.URL.Path, err)
	}
	return nil
}

// withinItems reports whether every failure in err is inside one item of
// the request body's array named items (at /items/N/...).
func withinItems(err error, items string) bool {
	var multi openapi3.MultiError
	var req *openapi3filter.RequestError
	var schema *openapi3.SchemaError
	switch {
	case errors.As(err, &multi) && len(multi) > 0:
		for _, e := range multi {
			if !withinItems(e, items) {
				return false
			}
		}
		return true
	case errors.As(err, &req):
		return req.RequestBody != nil && req.Parameter == nil && req.Err != nil && withinItems(req.Err, items)
	case errors.As(err, &schema):
		p := schema.JSONPointer()
		if len(p) < 2 || p[0] != items {
			return false
		}
		_, nerr := strconv.Atoi(p[1])
		return nerr == nil
	}
	return false
}

// authenticate says whether a request carries what a security scheme asks
// for, read the way the server reads it: a Bearer token, else X-API-Key
// (which an Authorization header of another scheme overrides). Whether the
// key is known is the server's business.
func authenticate(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	h := in.RequestValidationInput.Request.Header
	auth := h.Get("Authorization")
	switch s := in.SecurityScheme; {
	case s.Type == "http" && strings.EqualFold(s.Scheme, "bearer"):
		scheme, token, _ := strings.Cut(auth, " ")
		if strings.EqualFold(scheme, "Bearer") && strings.TrimSpace(token) != "" {
			return nil
		}
	case s.Type == "apiKey" && s.In == "header":
		if auth == "" && strings.TrimSpace(h.Get(s.Name)) != "" {
			return nil
		}
	}
	return in.NewError(nil)
}

// withBody is a copy of req whose body reads b.
func withBody(req *http.Request, b []byte) *http.Request {
	r := req.Clone(req.Context())
	r.Body = io.NopCloser(bytes.NewReader(b))
	r.ContentLength = int64(len(b))
	return r
}

// pathParams reads the {name} segments of a documented path from a
// request's escaped path; the server's mux unescapes them the same way.
func pathParams(template, path string) map[string]string {
	out := map[string]string{}
	ts, ps := strings.Split(template, "/"), strings.Split(path, "/")
	for i, t := range ts {
		if i < len(ps) && strings.HasPrefix(t, "{") && strings.HasSuffix(t, "}") {
			v := ps[i]
			if u, err := url.PathUnescape(v); err == nil {
				v = u
			}
			out[strings.Trim(t, "{}")] = v
		}
	}
	return out
}

// Transport is an http.RoundTripper (over next, http.DefaultTransport when
// nil) that keeps every exchange and checks them all when t ends, reporting
// each mismatch to t as an error. The exchange itself goes on as it was
// answered, so a test sees what it would have seen, and also fails.
//
// The checks wait for the end of the test so that they cost the exchange
// nothing: several tests time how fast the server answers (a burst while
// Redis is down must be answered within a bound), and validating an answer
// takes milliseconds under the race detector.
func (c *Checker) Transport(t testing.TB, next http.RoundTripper) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	tr := &transport{c: c, next: next}
	t.Cleanup(func() {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		for _, e := range tr.kept {
			if err := c.Check(e.req, e.reqBody, e.resp, e.respBody); err != nil {
				t.Errorf("openapi: %v", err)
			}
		}
		tr.kept = nil
	})
	return tr
}

type transport struct {
	c    *Checker
	next http.RoundTripper

	mu   sync.Mutex
	kept []exchange
}

// exchange is one request and its answer, with both bodies as read.
type exchange struct {
	req      *http.Request
	reqBody  []byte
	resp     *http.Response
	respBody []byte
}

func (tr *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	var reqBody []byte
	if req.Body != nil {
		var err error
		if reqBody, err = io.ReadAll(req.Body); err != nil {
			return nil, err
		}
		req.Body.Close()
		req = req.Clone(req.Context())
		req.Body = io.NopCloser(bytes.NewReader(reqBody))
	}
	resp, err := tr.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	respBody, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(respBody))
	// Kept apart from what the caller gets, which it may change.
	kept := *resp
	kept.Header = resp.Header.Clone()
	kept.Body = nil
	tr.mu.Lock()
	tr.kept = append(tr.kept, exchange{req: req.Clone(context.Background()), reqBody: reqBody, resp: &kept, respBody: respBody})
	tr.mu.Unlock()
	return resp, nil
}

// Client is an *http.Client whose every exchange is checked when t ends
// (see Transport).
func (c *Checker) Client(t testing.TB) *http.Client {
	return &http.Client{Transport: c.Transport(t, nil)}
}
