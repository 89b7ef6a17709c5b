package dispatcher

import (
	"context"
	"time"

	"github.com/shaperhq/shaper/leaky"
)

// followLimits keeps every upstream's bucket at the limits operators set
// (PUT /v1/upstreams/{name}/limits), until ctx ends: leaky's Follow applies
// a change as soon as it is announced, and reads the overrides every
// leaky.ApplyWithin besides. The take builds its arguments again from the
// bucket when its limits changed (jobstore.Taker), so a take reads nothing
// more from Redis for it.
func (d *Dispatcher) followLimits(ctx context.Context) {
	buckets := make([]*leaky.Bucket, 0, len(d.order))
	byBucket := map[*leaky.Bucket]*upstream{}
	for _, name := range d.order {
		u := d.ups[name]
		buckets = append(buckets, u.bucket)
		byBucket[u.bucket] = u
	}
	changed := func(b *leaky.Bucket) {
		u := byBucket[b]
		c := b.Config()
		d.log.Info("pacing at new limits", "upstream", u.cfg.Name, "limits", limitsString(c.Limits),
			"generation", c.Generation, "draining", len(c.Draining))
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		d.showLimits(sctx, u)
		cancel()
		// A fetch loop asleep until a slot of the old limits looks again.
		u.poke()
	}
	for ctx.Err() == nil {
		if err := d.pacer.Follow(ctx, buckets, changed); err != nil {
			d.log.Warn("cannot follow changes of limits", "err", err)
			return
		}
		sleep(ctx, time.Second)
	}
}

// isAdaptive reports whether a limit the upstream paces at now is
// adaptive: the configured ones, or an operator's in their place.
func (u *upstream) isAdaptive() bool {
	for _, l := range u.bucket.Config().Limits {
		if l.Adaptive {
			return true
		}
	}
	return false
}

// partitionLimits is what a job's partition is held to beside the
// upstream's limits, for settling its cost: an operator's override of the
// partition when the upstream has any (one HGET), else the config's.
func (u *upstream) partitionLimits(ctx context.Context, partition string) []leaky.Limit {
	if partition != "" && u.bucket.HasPartitionOverrides() {
		if ls, ok, err := u.bucket.ReadPartitionLimits(ctx, partition); err == nil && ok {
			return ls
		}
	}
	return u.cfg.PartitionLimitsFor(partition)
}
