package config

import (
	"cmp"
	"fmt"
	"os"
	"strings"
	"unicode"
)

// APIKey is a producer's key with its secret, resolved from the
// environment. String and GoString leave the secret out, so that logging a
// key by mistake does not leak it.
type APIKey struct {
	Name   string
	Tenant string
	Admin  bool
	Secret string
}

// String names the key without its secret: "billing (tenant billing)".
func (k APIKey) String() string {
	s := fmt.Sprintf("%s (tenant %s", k.Name, k.Tenant)
	if k.Admin {
		s += ", admin"
	}
	return s + ")"
}

// GoString keeps %#v from printing the secret too.
func (k APIKey) GoString() string {
	return fmt.Sprintf("config.APIKey{Name: %q, Tenant: %q, Admin: %v, Secret: <redacted>}", k.Name, k.Tenant, k.Admin)
}

// ResolveKeys reads each API key's secret from the environment (lookupEnv;
// nil means os.LookupEnv). Only the API server needs them, so Parse leaves
// them alone and `shaper work` runs without. Every key must resolve to a
// distinct, non-empty secret that fits in an Authorization header; an
// API without keys would refuse every producer, so none is an error too.
func (c *Config) ResolveKeys(lookupEnv func(string) (string, bool)) ([]APIKey, error) {
	if lookupEnv == nil {
		lookupEnv = os.LookupEnv
	}
	ps := newProblems()
	ps.lines = c.lines
	if ps.lines == nil {
		ps.lines = map[string]int{}
	}
	if len(c.API.Keys) == 0 {
		ps.add("api.keys", "no keys configured (shaper serve accepts jobs only from listed keys, e.g. - {name: billing, key_env: SHAPER_KEY_BILLING})")
	}
	keys := make([]APIKey, 0, len(c.API.Keys))
	owner := map[string]int{}
	for i, k := range c.API.Keys {
		p := index("api.keys", i) + ".key_env"
		secret, ok := lookupEnv(k.KeyEnv)
		switch {
		case !ok:
			ps.add(p, "environment variable %s is not set (it holds the secret of key %q)", k.KeyEnv, k.Name)
			continue
		case secret == "":
			ps.add(p, "environment variable %s is empty (it holds the secret of key %q)", k.KeyEnv, k.Name)
			continue
		case strings.ContainsFunc(secret, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
			ps.add(p, "the secret in %s holds whitespace or control characters (it must fit in Authorization: Bearer …)", k.KeyEnv)
			continue
		}
		if j, dup := owner[secret]; dup {
			ps.add(p, "%s holds the same secret as api.keys[%d] (each key needs its own)", k.KeyEnv, j)
			continue
		}
		owner[secret] = i
		keys = append(keys, APIKey{Name: k.Name, Tenant: cmp.Or(k.Tenant, k.Name), Admin: k.Admin, Secret: secret})
	}
	if err := ps.err(c.file); err != nil {
		return nil, err
	}
	return keys, nil
}
