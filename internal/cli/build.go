package cli

import (
	"fmt"
	"sort"
	"time"

	"github.com/shaperhq/shaper/config"
	"github.com/shaperhq/shaper/dispatcher"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// queueConfig is the queue's view of a config.
func queueConfig(cfg *config.Config) queue.Config {
	qc := queue.Config{Prefix: cfg.Redis.Prefix, Upstreams: map[string]queue.Upstream{}}
	for name, u := range cfg.Upstreams {
		qc.Upstreams[name] = queue.Upstream{
			Lanes:           laneNames(u.Lanes),
			MaxPending:      u.MaxPending,
			MaxAttempts:     u.Retry.MaxAttempts,
			ResultRetention: time.Duration(u.ResultRetention),
			DeadRetention:   time.Duration(u.DeadRetention),

			SensitiveHeaders: u.SensitiveHeaders,
		}
	}
	return qc
}

// laneNames lists lanes with the default lane first, the rest sorted.
func laneNames(lanes map[string]int) []string {
	var rest []string
	for l := range lanes {
		if l != config.DefaultLane {
			rest = append(rest, l)
		}
	}
	sort.Strings(rest)
	return append([]string{config.DefaultLane}, rest...)
}

// dispatcherUpstream is the dispatcher's view of one upstream.
func dispatcherUpstream(u *config.Upstream) dispatcher.Upstream {
	idem := u.IdempotencyHeader
	if idem == "" {
		// The config's explicit "" means none; the dispatcher spells it "-".
		idem = "-"
	}
	return dispatcher.Upstream{
		Name:              u.Name,
		BaseURL:           u.BaseURL,
		Limits:            limitsOf(u),
		Guard:             time.Duration(u.Guard),
		Concurrency:       u.Concurrency,
		Timeout:           time.Duration(u.Timeout),
		Lanes:             u.Lanes,
		Workers:           u.Workers,
		MinBackoff:        time.Duration(u.Retry.MinBackoff),
		MaxBackoff:        time.Duration(u.Retry.MaxBackoff),
		Headers:           u.Headers,
		IdempotencyHeader: idem,
		MaxResponseBytes:  u.MaxResponseBytes,
		PushbackDefault:   time.Duration(u.PushbackDefault),
		StoreResponse:     u.StoreResponse,
	}
}

func limitsOf(u *config.Upstream) []leaky.Limit {
	out := make([]leaky.Limit, len(u.Limits))
	for i, l := range u.Limits {
		out[i] = l.Leaky()
	}
	return out
}

// selectUpstreams picks the named upstreams (all when names is empty),
// refusing unknown names.
func selectUpstreams(cfg *config.Config, names []string) ([]*config.Upstream, error) {
	if len(names) == 0 {
		names = cfg.UpstreamNames()
	}
	var out []*config.Upstream
	seen := map[string]bool{}
	for _, n := range names {
		u, ok := cfg.Upstreams[n]
		if !ok {
			return nil, fmt.Errorf("--upstream %s: no such upstream in the config (have: %v)", n, cfg.UpstreamNames())
		}
		if !seen[n] {
			seen[n] = true
			out = append(out, u)
		}
	}
	return out, nil
}
