package config

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"
)

func TestBadCallbackConfigs(t *testing.T) {
	keys := "api: {keys: [{name: a, key_env: A}, {name: b, key_env: B, callback_secret_env: B_HOOK}]}\n"
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"a URL for a host", "callbacks: {allowed_hosts: ['https://hooks.example.com'], secret_env: S}\n",
			[]string{`callbacks.allowed_hosts[0]: "https://hooks.example.com": want a host or host:port only`}},
		{"a path", "callbacks: {allowed_hosts: ['hooks.example.com/x'], secret_env: S}\n",
			[]string{`callbacks.allowed_hosts[0]: "hooks.example.com/x": want a host or host:port only`}},
		{"credentials", "callbacks: {allowed_hosts: ['u@hooks.example.com'], secret_env: S}\n",
			[]string{`callbacks.allowed_hosts[0]: "u@hooks.example.com": want a host or host:port only`}},
		{"a port out of range", "callbacks: {allowed_hosts: ['hooks.example.com:70000'], secret_env: S}\n",
			[]string{`callbacks.allowed_hosts[0]: "hooks.example.com:70000"`}},
		{"a port and :*", "callbacks: {allowed_hosts: ['localhost:80:*'], secret_env: S}\n",
			[]string{`callbacks.allowed_hosts[0]: "localhost:80:*": want a host alone before :*`}},
		{"no host before :*", "callbacks: {allowed_hosts: [':*'], secret_env: S}\n",
			[]string{`callbacks.allowed_hosts[0]: ":*": want a host alone before :*`}},
		{"empty", "callbacks: {allowed_hosts: [''], secret_env: S}\n",
			[]string{`callbacks.allowed_hosts[0]: empty`}},
		{"twice in other case", "callbacks: {allowed_hosts: [a.example, A.example], secret_env: S}\n",
			[]string{`callbacks.allowed_hosts[1]: "A.example" is also callbacks.allowed_hosts[0]`}},
		{"no secret for a key", keys + "callbacks: {allowed_hosts: [a.example]}\n",
			[]string{`callbacks.secret_env: required with allowed_hosts: api.keys[0] (a)`}},
		{"a bad env name", "callbacks: {allowed_hosts: [a.example], secret_env: 'not-a-var'}\n",
			[]string{`callbacks.secret_env: "not-a-var" is not an environment variable name`}},
		{"a bad key env name", "api: {keys: [{name: a, key_env: A, callback_secret_env: '1x'}]}\n",
			[]string{`api.keys[0].callback_secret_env: "1x" is not an environment variable name`}},
		{"an empty limits list", "callbacks: {limits: []}\n",
			[]string{`callbacks.limits: an empty list`}},
		{"a cost limit", "callbacks: {limits: [{rate: 5, per: 1s, cost: tokens}]}\n",
			[]string{`callbacks.limits[0].cost: a callback limit counts deliveries`}},
		{"an adaptive limit", "callbacks: {limits: [{rate: 5, per: 1s, adaptive: true}]}\n",
			[]string{`callbacks.limits[0].adaptive`}},
		{"a limit without per", "callbacks: {limits: [{rate: 5}]}\n",
			[]string{`callbacks.limits[0].per: required`}},
		{"max below min", "callbacks: {retry: {min_backoff: 10s, max_backoff: 1s}}\n",
			[]string{`callbacks.retry.max_backoff: 1s: must be at least min_backoff (10s)`}},
		{"no attempts", "callbacks: {retry: {max_attempts: 0}}\n",
			[]string{`callbacks.retry.max_attempts: 0: must be at least 1`}},
		{"an unknown key", "callbacks: {allowed: [a.example]}\n",
			[]string{`callbacks.allowed: unknown key (allowed: allowed_hosts, limits, retry, secret_env)`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml+oneUpstream), mapEnv(nil))
			if err == nil {
				t.Fatalf("got no error, want %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("got\n%v\nwant it to contain %q", err, w)
				}
			}
		})
	}
}

func TestCallbackSecrets(t *testing.T) {
	good := "whsec_" + base64.StdEncoding.EncodeToString([]byte("0123456789abcdef01234567"))
	other := "whsec_" + base64.StdEncoding.EncodeToString([]byte("another secret, 32 bytes long!!!"))
	src := `api: {keys: [{name: a, key_env: A}, {name: b, key_env: B, callback_secret_env: B_HOOK}]}
callbacks: {allowed_hosts: [hooks.example.com, "10.0.0.5:9000", "localhost:*", "[::1]:*"], secret_env: HOOK}
` + oneUpstream
	c, err := Parse([]byte(src), mapEnv(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Callbacks.Retry; got.MaxAttempts != 12 || got.MinBackoff != Duration(5*time.Second) || got.MaxBackoff != Duration(time.Hour) {
		t.Errorf("retry defaults: got %+v", got)
	}
	s, err := c.ResolveCallbackSecrets(mapEnv(map[string]string{"HOOK": good, "B_HOOK": other}))
	if err != nil {
		t.Fatal(err)
	}
	if string(s.For("a")) != "0123456789abcdef01234567" || string(s.For("b")) != "another secret, 32 bytes long!!!" || string(s.For("gone")) != "0123456789abcdef01234567" {
		t.Errorf("secrets: got a %q b %q, want the default for a, b's own for b", s.For("a"), s.For("b"))
	}
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"B_HOOK": other}, "callbacks.secret_env: environment variable HOOK is not set"},
		{map[string]string{"HOOK": good, "B_HOOK": ""}, "api.keys[1].callback_secret_env: environment variable B_HOOK is not set or empty"},
		{map[string]string{"HOOK": "s3cret", "B_HOOK": other}, "does not start with whsec_"},
		{map[string]string{"HOOK": "whsec_***", "B_HOOK": other}, "is not whsec_ followed by base64"},
		{map[string]string{"HOOK": "whsec_c2hvcnQ=", "B_HOOK": other}, "holds 5 bytes, want at least 24"},
	} {
		_, err := c.ResolveCallbackSecrets(mapEnv(tc.env))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("env %v: got %v, want %q", tc.env, err, tc.want)
		}
	}
}
