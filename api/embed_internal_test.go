package api

import (
	"bytes"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func TestWriteJSON(t *testing.T) {
	for _, tc := range []struct {
		in, want, wantErr string
	}{
		{"b: 1\na: [x, 'y', true, null, 1.5]\n", `{"b":1,"a":["x","y",true,null,1.5]}`, ""},
		{"responses:\n  '200': {description: ok}\n", `{"responses":{"200":{"description":"ok"}}}`, ""},
		{"when: 2026-11-30T09:00:00Z\n", `{"when":"2026-11-30T09:00:00Z"}`, ""},
		{"base: &b {x: 1}\nuse: *b\n", `{"base":{"x":1},"use":{"x":1}}`, ""},
		{"responses:\n  200: {description: ok}\n", "", `/responses: key "200" (line 2) is not a string: quote it`},
	} {
		var n yaml.Node
		if err := yaml.Unmarshal([]byte(tc.in), &n); err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		err := writeJSON(&b, &n, "")
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%q: got %v, want an error %q", tc.in, err, tc.wantErr)
		case tc.wantErr == "" && (err != nil || b.String() != tc.want):
			t.Errorf("%q: got %s, %v; want %s", tc.in, b.String(), err, tc.want)
		}
	}
}
