package cli

import (
	"fmt"

	"github.com/shaperhq/shaper/config"
	"github.com/shaperhq/shaper/queue"
)

// queueConfig is the queue of a config's upstreams.
func queueConfig(cfg *config.Config) queue.Config {
	return queue.Config{Prefix: cfg.Redis.Prefix, Upstreams: cfg.AllUpstreams()}
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
