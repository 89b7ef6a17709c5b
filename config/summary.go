package config

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/shaperhq/shaper"
)

// Summary explains a parsed config in plain words for `shaper config
// validate`: where Redis is, how the API admits producers, how workers run,
// and one line per upstream with each limit and the rate a full backlog
// actually drains at under it (slightly below the limit: the guard keeps a
// late send from ever putting one too many in a window). Secrets are never
// shown.
func (c *Config) Summary() string {
	var b strings.Builder
	b.WriteString("redis: " + c.Redis.describe() + "\n")

	a := c.API
	admins := 0
	for _, k := range a.Keys {
		if k.Admin {
			admins++
		}
	}
	fmt.Fprintf(&b, "api: listen %s, %s (%d admin), admission per key: burst %d then %s/s, on Redis error %s, bodies up to %d bytes\n",
		a.Listen, plural(len(a.Keys), "key"), admins, a.Admission.Capacity, num(a.Admission.RefillPerSecond),
		a.Admission.OnRedisError, a.MaxBodyBytes)

	w := c.Work
	metrics := "metrics off"
	if w.MetricsListen != "" {
		metrics = "metrics on " + w.MetricsListen
	}
	fmt.Fprintf(&b, "work: %s, books pacing waits up to %v, shutdown within %v\n", metrics, w.Horizon, w.ShutdownTimeout)

	var total int64
	for _, name := range c.UpstreamNames() {
		u := c.Upstreams[name]
		b.WriteString(u.describe(name) + "\n")
		m := u.Memory()
		b.WriteString(m.describe(u) + "\n")
		total += m.Total()
	}
	if len(c.Upstreams) > 1 {
		fmt.Fprintf(&b, "Redis memory all upstreams can reach: %s (size Redis for it, with maxmemory-policy noeviction)\n", size(total))
	}
	return b.String()
}

func (r *Redis) describe() string {
	var s string
	switch r.mode() {
	case "cluster":
		s = "cluster via " + strings.Join(r.Cluster, ", ")
	case "sentinel":
		s = fmt.Sprintf("sentinel master %s via %s, db %d", r.Sentinel.Master, strings.Join(r.Sentinel.Addrs, ", "), r.DB)
	default:
		raw := r.URL
		if raw == "" {
			raw = defaultRedisURL
		}
		if u, err := url.Parse(raw); err == nil {
			raw = u.Redacted()
		}
		s = raw
	}
	if r.TLS {
		s += ", TLS"
	}
	if r.Password != "" {
		s += ", password set"
	}
	return s + ", keys under " + r.Prefix
}

func (u *Upstream) describe(name string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "upstream %s: ", name)
	if u.Handler {
		b.WriteString("Go handler")
	} else {
		b.WriteString(u.BaseURL)
	}
	for i, l := range u.Limits {
		sep := "; "
		if i == 0 {
			sep = " at "
		}
		ll := l.Leaky()
		if ll.Adaptive {
			// The rate is a ceiling; the fleet finds the real one.
			fmt.Fprintf(&b, "%sup to %s, adaptive (drains at up to %s)", sep, ll, rate(ll.SustainedRate(time.Duration(u.Guard)), ll.Per))
			continue
		}
		fmt.Fprintf(&b, "%s%s (drains at %s)", sep, ll, rate(ll.SustainedRate(time.Duration(u.Guard)), ll.Per))
	}
	b.WriteString(u.describePartitions())
	for _, cost := range sortedKeys(u.Settle) {
		fmt.Fprintf(&b, "; %s settled from %s", cost, u.Settle[cost].Shaper())
	}
	conc := "unlimited"
	if u.Concurrency > 0 {
		conc = fmt.Sprint(u.Concurrency)
	}
	fmt.Fprintf(&b, "; concurrency %s, %d workers per replica, lanes %s, up to %s, timeout %v",
		conc, u.Workers, lanes(u.Lanes), plural(u.Retry.MaxAttempts, "attempt"), u.Timeout)
	return b.String()
}

// describePartitions says how partitions are limited and slots shared,
// or nothing when the upstream uses neither beyond the defaults.
func (u *Upstream) describePartitions() string {
	var b strings.Builder
	limits := func(ls []Limit) string {
		parts := make([]string, len(ls))
		for i, l := range ls {
			ll := l.Leaky()
			parts[i] = fmt.Sprintf("%s (drains at %s)", ll, rate(ll.SustainedRate(time.Duration(u.Guard)), ll.Per))
		}
		return strings.Join(parts, " and ")
	}
	if len(u.PartitionLimits) > 0 {
		b.WriteString("; each partition at " + limits(u.PartitionLimits))
	}
	for _, p := range sortedKeys(u.PartitionOverrides) {
		fmt.Fprintf(&b, "; partition %q at %s", p, limits(u.PartitionOverrides[p]))
	}
	f := u.Fairness
	by := f.By
	if by == "" {
		by = shaper.FairByTenant
	}
	switch {
	case by == shaper.FairByNone:
		b.WriteString("; no fair share (queue order)")
	case b.Len() > 0 || len(f.Weights) > 0 || by != shaper.FairByTenant:
		fmt.Fprintf(&b, "; fair share by %s", by)
		if len(f.Weights) > 0 {
			b.WriteString(" (" + lanes(f.Weights) + ", others 1)")
		}
	}
	return b.String()
}

// rate writes units per window the way people quote limits: per second,
// minute, hour or day when the window is one of those.
func rate(perWindow float64, per time.Duration) string {
	switch per {
	case time.Second:
		return num(perWindow) + "/s"
	case time.Minute:
		return num(perWindow) + "/min"
	case time.Hour:
		return num(perWindow) + "/h"
	case 24 * time.Hour:
		return num(perWindow) + "/day"
	}
	return num(perWindow) + " per " + per.String()
}

func num(f float64) string {
	switch {
	case f >= 1000 || f == float64(int64(f)):
		return fmt.Sprintf("%.0f", f)
	case f < 1:
		return fmt.Sprintf("%.3g", f)
	}
	return fmt.Sprintf("%.1f", f)
}

func lanes(m map[string]int) string {
	var parts []string
	for _, name := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%s=%d", name, m[name]))
	}
	return strings.Join(parts, ",")
}

func plural(n int, noun string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", noun)
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
