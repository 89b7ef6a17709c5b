package config

import (
	"os"
	"testing"
	"time"
)

// FuzzParse: any input either parses into a config that validates again
// (defaults included) and can be summarised, or is refused with problems;
// nothing panics.
func FuzzParse(f *testing.F) {
	for _, path := range []string{"testdata/product.yaml", "../deploy/shaper.example.yaml"} {
		data, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(oneUpstream))
	f.Add([]byte("redis: {sentinel: {master: m, addrs: ['h:1']}, db: 2}\n" + oneUpstream))
	f.Add([]byte("x-a: &a {timeout: 1s}\nupstreams: {s: {<<: *a, handler: true, limits: [{rate: 9, per: 1ms, burst: 3, cost: c}]}}"))
	f.Add([]byte(aliasBomb()))
	env := mapEnv(map[string]string{"STRIPE_SECRET_KEY": "sk", "OPENAI_API_KEY": "sk", "A": "1s", "B": "x\ny: z"})
	f.Fuzz(func(t *testing.T, data []byte) {
		start := time.Now()
		c, err := Parse(data, env)
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("Parse took %v", d)
		}
		if err != nil {
			if _, ok := err.(*Error); !ok {
				t.Fatalf("got %T %v, want *Error", err, err)
			}
			if c != nil {
				t.Fatal("got a config and an error")
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("parsed config fails Validate: %v\ninput:\n%s", err, data)
		}
		_ = c.Summary()
		for _, name := range c.UpstreamNames() {
			for _, l := range c.Limits(name) {
				if err := l.Validate(); err != nil {
					t.Fatalf("upstream %s: %v", name, err)
				}
			}
		}
		if _, err := c.Redis.Options(""); err != nil {
			t.Fatalf("Options: %v", err)
		}
	})
}
