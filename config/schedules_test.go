package config

import (
	"encoding/json"
	"strings"
	"testing"
)

const scheduleKeys = "api: {keys: [{name: billing, key_env: K}]}\n"

func TestBadSchedules(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       []string
	}{
		{"no name", "schedules: [{tenant: billing, cron: '@hourly', job: {upstream: u, path: /x}}]",
			[]string{"schedules[0].name: is required"}},
		{"bad name", "schedules: [{name: 'a b', tenant: billing, cron: '@hourly', job: {upstream: u}}]",
			[]string{`schedules[0].name: "a b": must be 1-100 letters`}},
		{"no tenant", "schedules: [{name: n, cron: '@hourly', job: {upstream: u}}]",
			[]string{"schedules[0].tenant: is required"}},
		{"tenant of no key", "schedules: [{name: n, tenant: ops, cron: '@hourly', job: {upstream: u}}]",
			[]string{`schedules[0].tenant: "ops" is no API key's tenant (have: [billing])`}},
		{"twice", "schedules: [{name: n, tenant: billing, cron: '@hourly', job: {upstream: u}}, {name: n, tenant: billing, cron: '@daily', job: {upstream: u}}]",
			[]string{`schedules[1].name: "n": tenant billing declares it twice`}},
		{"bad cron", "schedules: [{name: n, tenant: billing, cron: '* * *', job: {upstream: u}}]",
			[]string{"schedules[0].cron:", "expected 5 to 6 fields"}},
		{"bad timezone", "schedules: [{name: n, tenant: billing, cron: '@daily', timezone: Europe/Atlantis, job: {upstream: u}}]",
			[]string{`schedules[0].timezone: "Europe/Atlantis": not an IANA time zone`}},
		{"bad catch_up", "schedules: [{name: n, tenant: billing, cron: '@daily', catch_up: all, job: {upstream: u}}]",
			[]string{`schedules[0].catch_up: "all": must be last`}},
		{"no upstream", "schedules: [{name: n, tenant: billing, cron: '@daily', job: {path: /x}}]",
			[]string{"schedules[0].job.upstream: is required"}},
		{"unknown upstream", "schedules: [{name: n, tenant: billing, cron: '@daily', job: {upstream: twilio}}]",
			[]string{`schedules[0].job.upstream: "twilio" is not a configured upstream (have: [u])`}},
		{"unknown job key", "schedules: [{name: n, tenant: billing, cron: '@daily', job: {upstream: u, idempotency_key: k}}]",
			[]string{"schedules[0].job.idempotency_key: unknown key"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(scheduleKeys+c.yaml+oneUpstream), mapEnv(nil))
			if err == nil {
				t.Fatalf("got no error, want %v", c.want)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("got:\n%v\nwant it to contain %q", err, w)
				}
			}
		})
	}
}

func TestScheduleDefs(t *testing.T) {
	c, err := Parse([]byte(scheduleKeys+`schedules:
  - {name: nightly-report, tenant: billing, cron: "0 3 * * *", timezone: Europe/Berlin,
     job: {upstream: u, method: POST, path: /v1/run, body: '{"a":1}', cost: {}}}
  - {name: often, tenant: billing, cron: "@every 10s", catch_up: none, paused: true, job: {upstream: u, path: /x}}
`+oneUpstream), mapEnv(nil))
	if err != nil {
		t.Fatal(err)
	}
	defs, err := c.ScheduleDefs()
	if err != nil {
		t.Fatal(err)
	}
	if len(defs) != 2 {
		t.Fatalf("got %d schedules, want 2", len(defs))
	}
	d := defs[0]
	if d.Name != "nightly-report" || d.Tenant != "billing" || d.Timezone != "Europe/Berlin" || d.CatchUp != "last" || d.Source != "config" {
		t.Errorf("got %+v", d)
	}
	var job map[string]any
	if err := json.Unmarshal(d.Job, &job); err != nil {
		t.Fatal(err)
	}
	if job["upstream"] != "u" || job["method"] != "POST" || job["path"] != "/v1/run" || job["body"] != `{"a":1}` {
		t.Errorf("got job %s", d.Job)
	}
	if o := defs[1]; o.Timezone != "UTC" || o.CatchUp != "none" || !o.Paused {
		t.Errorf("got %+v, want UTC, none, paused", o)
	}
}
