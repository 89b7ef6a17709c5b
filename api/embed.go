// Package api holds shaper's HTTP API as a published contract: the OpenAPI
// 3.1 document api/openapi.yaml, embedded so that the server can serve it
// (GET /v1/openapi.json) and the tests can hold every request and response
// to it. The YAML is the source; JSON is what the server answers with, since
// every OpenAPI tool reads JSON.
package api

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"time"

	"go.yaml.in/yaml/v3"
)

// document is api/openapi.yaml as written. An embedded file can only be a
// package-level variable; nothing assigns to it.
//
//go:embed openapi.yaml
var document []byte

// YAML is the OpenAPI document as written, a fresh copy for each caller.
func YAML() []byte { return append([]byte(nil), document...) }

// JSON is the OpenAPI document converted to JSON, its keys in the order
// the YAML has them (openapi, info, servers, ... as a reader expects).
func JSON() ([]byte, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(document, &root); err != nil {
		return nil, fmt.Errorf("openapi.yaml: %w", err)
	}
	var b bytes.Buffer
	if err := writeJSON(&b, &root, ""); err != nil {
		return nil, fmt.Errorf("openapi.yaml: %w", err)
	}
	return b.Bytes(), nil
}

// writeJSON writes a YAML node as JSON. YAML allows mapping keys that JSON
// does not (numbers, lists); an OpenAPI document needs none, so one is
// reported, with where it is, rather than turned into a string: an unquoted
// status code (200: rather than '200':) is the usual slip.
func writeJSON(b *bytes.Buffer, n *yaml.Node, at string) error {
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) != 1 {
			return fmt.Errorf("want one document, got %d", len(n.Content))
		}
		return writeJSON(b, n.Content[0], at)
	case yaml.AliasNode:
		return writeJSON(b, n.Alias, at)
	case yaml.MappingNode:
		b.WriteByte('{')
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str" {
				return fmt.Errorf("%s: key %q (line %d) is not a string: quote it", at, k.Value, k.Line)
			}
			if i > 0 {
				b.WriteByte(',')
			}
			key, _ := json.Marshal(k.Value)
			b.Write(key)
			b.WriteByte(':')
			if err := writeJSON(b, n.Content[i+1], at+"/"+k.Value); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case yaml.SequenceNode:
		b.WriteByte('[')
		for i, e := range n.Content {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeJSON(b, e, fmt.Sprintf("%s/%d", at, i)); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	default:
		var v any
		if err := n.Decode(&v); err != nil {
			return fmt.Errorf("%s (line %d): %w", at, n.Line, err)
		}
		if _, ok := v.(time.Time); ok {
			// An unquoted date decodes as a time; JSON has only its text.
			v = n.Value
		}
		raw, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("%s (line %d): %w", at, n.Line, err)
		}
		b.Write(raw)
	}
	return nil
}
