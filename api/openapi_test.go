package api_test

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"go.yaml.in/yaml/v3"

	"github.com/shaperhq/shaper/api"
)

// TestDocumentValidates: the document is OpenAPI 3.1 that a real validator
// accepts, examples included (each is checked against its schema).
func TestDocumentValidates(t *testing.T) {
	for _, tc := range []struct {
		name string
		load func() ([]byte, error)
	}{
		{"yaml", func() ([]byte, error) { return api.YAML(), nil }},
		{"json", api.JSON},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := tc.load()
			if err != nil {
				t.Fatal(err)
			}
			doc, err := openapi3.NewLoader().LoadFromData(raw)
			if err != nil {
				t.Fatalf("load: %v", err)
			}
			if !doc.IsOpenAPI31OrLater() {
				t.Fatalf("got openapi %q, want 3.1", doc.OpenAPI)
			}
			if err := doc.Validate(context.Background(), openapi3.EnableExamplesValidation()); err != nil {
				t.Fatalf("validate: %v", err)
			}
			if n := doc.Paths.Len(); n < 10 {
				t.Fatalf("got %d paths, want all of v1", n)
			}
		})
	}
}

// TestJSONIsTheYAML: the JSON the server serves says exactly what the YAML
// says.
func TestJSONIsTheYAML(t *testing.T) {
	raw, err := api.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var fromJSON, fromYAML any
	if err := json.Unmarshal(raw, &fromJSON); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(api.YAML(), &fromYAML); err != nil {
		t.Fatal(err)
	}
	// Through JSON once, so numbers compare as the same type.
	again, _ := json.Marshal(fromYAML)
	var want any
	json.Unmarshal(again, &want)
	if !reflect.DeepEqual(fromJSON, want) {
		t.Fatal("got JSON that differs from the YAML")
	}
	if !strings.Contains(string(raw), `"openapi":"3.1.0"`) {
		t.Errorf("got %.80s..., want an OpenAPI 3.1.0 document", raw)
	}
}

// TestEveryOperationAnswersErrorsAsProblems: each documented 4xx/5xx JSON
// answer is a problem document, so a generated client can read any error
// one way.
func TestEveryOperationAnswersErrorsAsProblems(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromData(api.YAML())
	if err != nil {
		t.Fatal(err)
	}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if op.OperationID == "" {
				t.Errorf("%s %s: no operationId (generators name methods by it)", method, path)
			}
			for code, r := range op.Responses.Map() {
				if code[0] != '4' && code[0] != '5' {
					continue
				}
				for ct := range r.Value.Content {
					if ct != "application/problem+json" && ct != "text/plain" {
						t.Errorf("%s %s %s: got %s, want application/problem+json", method, path, code, ct)
					}
				}
			}
		}
	}
}
