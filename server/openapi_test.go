package server

import (
	"bytes"
	"io"
	"slices"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/shaperhq/shaper/api"
	"github.com/shaperhq/shaper/internal/testsupport/apicheck"
)

// TestRoutesMatchDocument: every route registered on the server's mux is
// in the OpenAPI document, and every operation of the document is a route
// of the mux, so neither can drift from the other.
func TestRoutesMatchDocument(t *testing.T) {
	f := newFixture(t, generous, 1000)
	chk, err := apicheck.New()
	if err != nil {
		t.Fatal(err)
	}
	documented, registered := chk.Operations(), f.s.patterns
	if len(registered) < 10 {
		t.Fatalf("got %d routes from the mux (%v), want every route: is the hook still fed?", len(registered), registered)
	}
	for _, p := range registered {
		if !slices.Contains(documented, p) {
			t.Errorf("route %q is registered on the mux but not in api/openapi.yaml", p)
		}
	}
	for _, p := range documented {
		if !slices.Contains(registered, p) {
			t.Errorf("api/openapi.yaml describes %q, which the mux does not serve", p)
		}
	}
}

// TestServesOpenAPI: GET /v1/openapi.json answers without a key with the
// embedded document as JSON, which a validator loads.
func TestServesOpenAPI(t *testing.T) {
	f := newFixture(t, generous, 1000)
	resp, err := f.hc.Get(f.hs.URL + "/v1/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("got %d %s, want 200 application/json", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	want, err := api.JSON()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("got a document of %d bytes, want the embedded one of %d", len(got), len(want))
	}
	doc, err := openapi3.NewLoader().LoadFromData(got)
	if err != nil {
		t.Fatalf("load the served document: %v", err)
	}
	if err := doc.Validate(t.Context()); err != nil {
		t.Errorf("validate the served document: %v", err)
	}
}
