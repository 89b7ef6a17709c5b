// Package api holds shaper's HTTP API as a published contract: the OpenAPI
// 3.1 document api/openapi.yaml, embedded so that the server can serve it
// (GET /v1/openapi.json) and the tests can hold every request and response
// to it. The YAML is the source; JSON is what the server answers with, since
// every OpenAPI tool reads JSON.
package api

import (
	_ "embed"
	"encoding/json"
	"fmt"

	"go.yaml.in/yaml/v3"
)

// document is api/openapi.yaml as written. An embedded file can only be a
// package-level variable; nothing assigns to it.
//
//go:embed openapi.yaml
var document []byte

// YAML is the OpenAPI document as written, a fresh copy for each caller.
func YAML() []byte { return append([]byte(nil), document...) }

// JSON is the OpenAPI document converted to JSON.
func JSON() ([]byte, error) {
	var v any
	if err := yaml.Unmarshal(document, &v); err != nil {
		return nil, fmt.Errorf("openapi.yaml: %w", err)
	}
	v, err := jsonValue(v, "")
	if err != nil {
		return nil, fmt.Errorf("openapi.yaml: %w", err)
	}
	return json.Marshal(v)
}

// jsonValue makes a decoded YAML value encodable as JSON. YAML allows keys
// that JSON does not (numbers, lists); an OpenAPI document needs none, so
// one is reported, with where it is, rather than turned into a string: an
// unquoted status code (200: rather than '200':) is the usual slip.
func jsonValue(v any, at string) (any, error) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			c, err := jsonValue(e, at+"/"+k)
			if err != nil {
				return nil, err
			}
			v[k] = c
		}
		return v, nil
	case map[any]any:
		for k := range v {
			if _, ok := k.(string); !ok {
				return nil, fmt.Errorf("%s: key %v is not a string: quote it", at, k)
			}
		}
		out := make(map[string]any, len(v))
		for k, e := range v {
			c, err := jsonValue(e, at+"/"+k.(string))
			if err != nil {
				return nil, err
			}
			out[k.(string)] = c
		}
		return out, nil
	case []any:
		for i, e := range v {
			c, err := jsonValue(e, fmt.Sprintf("%s/%d", at, i))
			if err != nil {
				return nil, err
			}
			v[i] = c
		}
		return v, nil
	}
	return v, nil
}
