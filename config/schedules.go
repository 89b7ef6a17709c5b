package config

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/shaperhq/shaper/schedule"
)

// Schedule declares a schedule: a job enqueued on each tick of a cron,
// exactly once however many replicas run. Schedules declared here are the
// config's: every replica (serve and work) writes them to Redis at start,
// keeping each one's next tick when its cron and timezone are unchanged,
// and removes config schedules no longer declared. Through the API they
// can be read but not changed, paused or removed; a declared schedule
// replaces an API schedule of the same name and tenant. See
// docs/schedules.md.
type Schedule struct {
	// Name identifies the schedule within its tenant and is part of each
	// run's idempotency key, schedule:NAME:UNIXTIME. Required: 1-100
	// letters, digits and ._-, unique within the tenant.
	Name string `yaml:"name"`
	// Tenant owns the schedule and its jobs, as an API key's tenant owns
	// the jobs it enqueues. Required; when api.keys are configured, one of
	// their tenants.
	Tenant string `yaml:"tenant"`
	// Cron is when it ticks: 5 fields (minute hour day-of-month month
	// day-of-week), 6 with a leading seconds field, @every D (whole
	// seconds, at least 1s), or @yearly, @monthly, @weekly, @daily,
	// @hourly. Required.
	Cron string `yaml:"cron"`
	// Timezone is the IANA zone the cron reads in ("Europe/Berlin").
	// Default UTC.
	Timezone string `yaml:"timezone"`
	// CatchUp is what happens to ticks no replica ran in time (the fleet
	// was down): last (the most recent of them runs once) or none. Default
	// last.
	CatchUp string `yaml:"catch_up"`
	// Paused keeps the schedule from running.
	Paused bool `yaml:"paused"`
	// Job is the job each tick enqueues, as POST /v1/jobs takes it (its
	// idempotency_key and not_before are the schedule's). Checked against
	// the upstreams at start, as the API checks a job.
	Job ScheduleJob `yaml:"job"`
}

// ScheduleJob is a schedule's job, with the fields of a POST /v1/jobs body.
type ScheduleJob struct {
	// Upstream is the configured upstream the job is for. Required.
	Upstream string `yaml:"upstream" json:"upstream"`
	// Method is the HTTP method; default GET.
	Method string `yaml:"method" json:"method,omitempty"`
	// Path is the request path relative to the upstream's base_url.
	Path string `yaml:"path" json:"path,omitempty"`
	// Headers are sent with the request.
	Headers map[string]string `yaml:"headers" json:"headers,omitempty"`
	// Body is the request body as text.
	Body string `yaml:"body" json:"body,omitempty"`
	// BodyBase64 is the request body as base64, for bytes that are not
	// text; not with body.
	BodyBase64 string `yaml:"body_base64" json:"body_base64,omitempty"`
	// Cost is the job's amounts by name ({tokens: 1200}).
	Cost map[string]int64 `yaml:"cost" json:"cost,omitempty"`
	// Lane is the upstream's lane; default default.
	Lane string `yaml:"lane" json:"lane,omitempty"`
	// MaxAttempts overrides the upstream's retry.max_attempts.
	MaxAttempts int `yaml:"max_attempts" json:"max_attempts,omitempty"`
	// TTL gives a run up if it has not been sent that long after its tick
	// (a duration such as 10m).
	TTL string `yaml:"ttl" json:"ttl,omitempty"`
	// Task names the work of a Go handler upstream.
	Task string `yaml:"task" json:"task,omitempty"`
	// Partition is the job's partition (see partition_limits).
	Partition string `yaml:"partition" json:"partition,omitempty"`
}

// schedules checks what the config alone can: names, tenants, cron,
// timezone, catch_up and the job's upstream. The API server's job checks
// run at start (server.CheckSchedule).
func (k checker) schedules(c *Config) {
	tenants := keyTenants(c.API.Keys)
	seen := map[string]bool{}
	for i, s := range c.Schedules {
		path := index("schedules", i)
		if err := schedule.CheckName(s.Name); err != nil {
			k.add(join(path, "name"), "%v", err)
		}
		switch {
		case s.Tenant == "":
			k.add(join(path, "tenant"), "is required: the tenant that owns the schedule and its jobs")
		case tenants != nil && !tenants[s.Tenant]:
			k.add(join(path, "tenant"), "%q is no API key's tenant (have: %v)", s.Tenant, sortedSet(tenants))
		}
		if id := s.Tenant + "/" + s.Name; s.Name != "" && seen[id] {
			k.add(join(path, "name"), "%q: tenant %s declares it twice", s.Name, s.Tenant)
		} else {
			seen[id] = true
		}
		loc, zerr := schedule.LoadZone(s.Timezone)
		if _, err := schedule.ParseCron(s.Cron, loc); err != nil {
			k.add(join(path, "cron"), "%v", err)
		}
		if zerr != nil {
			k.add(join(path, "timezone"), "%v", zerr)
		}
		switch schedule.CatchUp(s.CatchUp) {
		case "", schedule.CatchUpLast, schedule.CatchUpNone:
		default:
			k.add(join(path, "catch_up"), "%q: must be last (the default) or none", s.CatchUp)
		}
		switch u := s.Job.Upstream; {
		case u == "":
			k.add(join(join(path, "job"), "upstream"), "is required")
		case c.Upstreams[u] == nil && len(c.Upstreams) > 0:
			k.add(join(join(path, "job"), "upstream"), "%q is not a configured upstream (have: %v)", u, c.UpstreamNames())
		}
	}
}

func sortedSet(m map[string]bool) []string {
	return slices.Sorted(maps.Keys(m))
}

// scheduleDefaults fills in what the field documentation gives.
func scheduleDefaults(c *Config) {
	for i := range c.Schedules {
		s := &c.Schedules[i]
		if s.Timezone == "" {
			s.Timezone = "UTC"
		}
		if s.CatchUp == "" {
			s.CatchUp = string(schedule.CatchUpLast)
		}
	}
}

// ScheduleDefs are the declared schedules as package schedule takes them.
func (c *Config) ScheduleDefs() ([]*schedule.Schedule, error) {
	var out []*schedule.Schedule
	for i, s := range c.Schedules {
		job, err := json.Marshal(s.Job)
		if err != nil {
			return nil, fmt.Errorf("schedules[%d].job: %w", i, err)
		}
		out = append(out, &schedule.Schedule{Name: s.Name, Tenant: s.Tenant, Cron: s.Cron, Timezone: s.Timezone,
			CatchUp: schedule.CatchUp(s.CatchUp), Paused: s.Paused, Job: job, Source: schedule.SourceConfig})
	}
	return out, nil
}
