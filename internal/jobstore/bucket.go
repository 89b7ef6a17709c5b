package jobstore

import (
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
)

// Bucket is upstream u's pacing bucket on p: the one state that every
// worker's take books its jobs' slots on and every proxied call reserves
// its slot on, so that jobs and calls together keep to u's limits. lease is
// how long a concurrency lease outlives its slot (the holder's longest
// send), maxWait the longest wait a plain Reserve books; neither changes
// the shared state, only how this process books on it.
func Bucket(p *leaky.Pacer, u shaper.Upstream, lease, maxWait time.Duration) (*leaky.Bucket, error) {
	return p.Bucket(QueueName(u.Name), leaky.BucketConfig{
		Limits: u.Limits, Guard: u.Guard, Concurrency: u.Concurrency,
		LeaseTTL: lease, MaxWait: maxWait,
	})
}
