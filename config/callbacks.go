package config

import (
	"encoding/base64"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/shaperhq/shaper/leaky"
)

// Callbacks configures the signed callbacks shaper POSTs to a job's
// callback_url when the job reaches a final state (succeeded, dead or
// cancelled); `shaper work` replicas deliver them.
type Callbacks struct {
	// AllowedHosts are the only hosts a callback_url may name, each a host
	// ("hooks.example.com"), host:port ("10.0.0.5:9000") or host:* (the
	// host on any port, e.g. "localhost:*"), matched exactly and without
	// regard to case; a job naming any other is refused at
	// enqueue. A name that resolves to a loopback, link-local or private
	// address is called back only when it is listed here as written.
	// Empty (the default) refuses every callback_url.
	AllowedHosts []string `yaml:"allowed_hosts"`
	// SecretEnv is the environment variable holding the signing secret,
	// whsec_ followed by base64 (Standard Webhooks). Required with
	// allowed_hosts unless every API key names its own
	// callback_secret_env.
	SecretEnv string `yaml:"secret_env"`
	// Limits pace deliveries to each destination host, all replicas
	// together: a receiver is itself a rate-limited API. Default
	// [{rate: 50, per: 1s}].
	Limits []Limit `yaml:"limits"`
	// Retry bounds how a delivery that got no 2xx is tried again:
	// exponential backoff with full jitter. Defaults: max_attempts 12,
	// min_backoff 5s, max_backoff 1h.
	Retry Retry `yaml:"retry"`
}

// Defaults of the callbacks block.
const (
	defaultCallbackAttempts   = 12
	defaultCallbackMinBackoff = Duration(5 * time.Second)
	defaultCallbackMaxBackoff = Duration(time.Hour)
	defaultCallbackRate       = 50
)

// CallbackLimits are callbacks.limits as the pacing limiter takes them.
func (c *Callbacks) CallbackLimits() []leaky.Limit { return toLeaky(c.Limits) }

func (c *Callbacks) fillDefaults() {
	if len(c.Limits) == 0 {
		c.Limits = []Limit{{Rate: defaultCallbackRate, Per: Duration(time.Second)}}
	}
	setDefault(&c.Retry.MaxAttempts, defaultCallbackAttempts)
	setDefault(&c.Retry.MinBackoff, defaultCallbackMinBackoff)
	setDefault(&c.Retry.MaxBackoff, defaultCallbackMaxBackoff)
}

// checkAllowedHost reports what is wrong with an allowed_hosts entry:
// it must be a bare host or host:port, nothing a URL adds around it.
func checkAllowedHost(h string) error {
	if h == "" {
		return fmt.Errorf("empty (write a host, e.g. hooks.example.com, or host:port)")
	}
	if name, ok := strings.CutSuffix(h, ":*"); ok {
		// host:* is the host on any port.
		u, err := url.Parse("http://" + name)
		if err != nil || checkAllowedHost(name) != nil || u.Port() != "" || strings.HasSuffix(name, ":") {
			return fmt.Errorf("%q: want a host alone before :* (e.g. localhost:* or [::1]:*)", h)
		}
		return nil
	}
	u, err := url.Parse("http://" + h)
	if err != nil || u.Host != h || u.User != nil || u.Path != "" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%q: want a host or host:port only (no scheme, path or credentials)", h)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("%q: port %s is not 1-65535", h, p)
		}
	}
	if u.Hostname() == "" {
		return fmt.Errorf("%q: no host", h)
	}
	return nil
}

func (k checker) callbacks(c *Callbacks, keys []Key) {
	seen := map[string]int{}
	for i, h := range c.AllowedHosts {
		p := index("callbacks.allowed_hosts", i)
		if err := checkAllowedHost(h); err != nil {
			k.add(p, "%v", err)
			continue
		}
		if j, dup := seen[strings.ToLower(h)]; dup {
			k.add(p, "%q is also callbacks.allowed_hosts[%d]", h, j)
		}
		seen[strings.ToLower(h)] = i
	}
	if c.SecretEnv != "" && !envName.MatchString(c.SecretEnv) {
		k.add("callbacks.secret_env", "%q is not an environment variable name (letters, digits and _, e.g. SHAPER_WEBHOOK_SECRET)", c.SecretEnv)
	}
	for i, key := range keys {
		if key.CallbackSecretEnv != "" && !envName.MatchString(key.CallbackSecretEnv) {
			k.add(index("api.keys", i)+".callback_secret_env", "%q is not an environment variable name", key.CallbackSecretEnv)
		}
	}
	if len(c.AllowedHosts) > 0 && c.SecretEnv == "" {
		for i, key := range keys {
			if key.CallbackSecretEnv == "" {
				k.add("callbacks.secret_env", "required with allowed_hosts: api.keys[%d] (%s) names no callback_secret_env of its own, so its callbacks need this secret", i, key.Name)
				break
			}
		}
	}
	if c.Limits != nil && len(c.Limits) == 0 && k.set("callbacks.limits") {
		k.add("callbacks.limits", "an empty list (leave it out for the default [{rate: %d, per: 1s}])", defaultCallbackRate)
	}
	k.limitsWritten("callbacks.limits", c.Limits, skips{under: map[string]bool{}, at: map[string]bool{}})
	for i, l := range c.Limits {
		p := index("callbacks.limits", i)
		if k.ps.isBroken(p) || l.Rate == 0 || l.Per == 0 {
			continue
		}
		switch {
		case l.Cost != "":
			k.add(p+".cost", "a callback limit counts deliveries (remove cost)")
		case l.Adaptive:
			k.add(p+".adaptive", "a callback limit is not adaptive (remove adaptive)")
		default:
			if err := l.Leaky().Validate(); err != nil {
				k.add(p, "%v", err)
			}
		}
	}
	r := c.Retry
	k.atLeast("callbacks.retry.max_attempts", int64(r.MaxAttempts), 1, 1000, defaultCallbackAttempts)
	k.positive("callbacks.retry.min_backoff", r.MinBackoff, defaultCallbackMinBackoff)
	k.positive("callbacks.retry.max_backoff", r.MaxBackoff, defaultCallbackMaxBackoff)
	if r.MinBackoff > 0 && r.MaxBackoff > 0 && r.MaxBackoff < r.MinBackoff {
		k.add("callbacks.retry.max_backoff", "%v: must be at least min_backoff (%v)", r.MaxBackoff, r.MinBackoff)
	}
}

// CallbackSecrets are the signing secrets of callbacks, decoded: Default
// from callbacks.secret_env, ByKey from each API key's own
// callback_secret_env, by key name.
type CallbackSecrets struct {
	Default []byte
	ByKey   map[string][]byte
}

// For is the secret that signs the callbacks of jobs enqueued with the
// named key: its own, else the default (nil when there is none).
func (s CallbackSecrets) For(key string) []byte {
	if b, ok := s.ByKey[key]; ok {
		return b
	}
	return s.Default
}

// secretPrefix starts a Standard Webhooks secret.
const secretPrefix = "whsec_"

// ParseCallbackSecret decodes a Standard Webhooks secret, whsec_ and
// base64 of at least 24 bytes.
func ParseCallbackSecret(s string) ([]byte, error) {
	rest, ok := strings.CutPrefix(s, secretPrefix)
	if !ok {
		return nil, fmt.Errorf("does not start with %s (a Standard Webhooks secret is %s followed by base64)", secretPrefix, secretPrefix)
	}
	b, err := base64.StdEncoding.DecodeString(rest)
	if err != nil {
		return nil, fmt.Errorf("is not %s followed by base64: %v", secretPrefix, err)
	}
	if len(b) < 24 {
		return nil, fmt.Errorf("holds %d bytes, want at least 24 (e.g. %s$(openssl rand -base64 32))", len(b), secretPrefix)
	}
	return b, nil
}

// ResolveCallbackSecrets reads callbacks.secret_env and every
// api.keys[].callback_secret_env from the environment (lookupEnv; nil is
// os.LookupEnv). A variable named but unset, empty or not a whsec_ secret
// is an error naming its field, so a replica refuses to start rather than
// sign nothing.
func (c *Config) ResolveCallbackSecrets(lookupEnv func(string) (string, bool)) (CallbackSecrets, error) {
	if lookupEnv == nil {
		lookupEnv = os.LookupEnv
	}
	ps := newProblems()
	ps.lines = c.lines
	if ps.lines == nil {
		ps.lines = map[string]int{}
	}
	read := func(path, env string) []byte {
		v, ok := lookupEnv(env)
		if !ok || v == "" {
			ps.add(path, "environment variable %s is not set or empty (it holds a callback signing secret, whsec_…)", env)
			return nil
		}
		b, err := ParseCallbackSecret(v)
		if err != nil {
			ps.add(path, "the secret in %s %v", env, err)
		}
		return b
	}
	var out CallbackSecrets
	if env := c.Callbacks.SecretEnv; env != "" {
		out.Default = read("callbacks.secret_env", env)
	}
	for i, k := range c.API.Keys {
		if k.CallbackSecretEnv == "" {
			continue
		}
		if out.ByKey == nil {
			out.ByKey = map[string][]byte{}
		}
		out.ByKey[k.Name] = read(index("api.keys", i)+".callback_secret_env", k.CallbackSecretEnv)
	}
	if err := ps.err(c.file); err != nil {
		return CallbackSecrets{}, err
	}
	return out, nil
}
