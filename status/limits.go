package status

import (
	"context"
	"fmt"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// SourceOperator is a limit an operator put in place of the configured
// ones (PUT /v1/upstreams/{name}/limits, shaper limits set).
const SourceOperator = leaky.SourceOperator

// Override says that an operator's limits are in force on an upstream
// (Upstream.Override), since when, and what the config says.
type Override struct {
	Since      time.Time `json:"since"`
	Configured []Limit   `json:"configured_limits"`
}

// PartitionLimits is one partition's own limits as shown: an operator's
// (source operator), the config's override or partition_limits (source
// configured), or none.
type PartitionLimits struct {
	Upstream  string  `json:"upstream"`
	Partition string  `json:"partition"`
	Limits    []Limit `json:"limits"`
	Source    string  `json:"source,omitempty"`
}

// Follow keeps the readers' buckets at the limits operators set, for a
// process (the API) that checks jobs against them, until ctx ends; see
// leaky.Pacer.Follow. Upstream reads an override itself.
func (r *Reader) Follow(ctx context.Context) error {
	bs := make([]*leaky.Bucket, 0, len(r.names))
	for _, n := range r.names {
		bs = append(bs, r.buckets[n])
	}
	if len(bs) == 0 {
		return nil
	}
	return r.pacer.Follow(ctx, bs, nil)
}

// PutLimits replaces the upstream's configured limits for every replica
// until ResetLimits. Limits with problems (shaper.Upstream.CheckLimits)
// change nothing: it returns the problems instead.
func (r *Reader) PutLimits(ctx context.Context, name string, limits []leaky.Limit) ([]shaper.Problem, error) {
	src, b, err := r.upstream(name)
	if err != nil {
		return nil, err
	}
	if ps := src.CheckLimits(limits); len(ps) > 0 {
		return ps, nil
	}
	if _, err := b.PutLimits(ctx, limits); err != nil {
		return nil, err
	}
	return nil, nil
}

// ResetLimits puts the configured limits back in force.
func (r *Reader) ResetLimits(ctx context.Context, name string) error {
	_, b, err := r.upstream(name)
	if err != nil {
		return err
	}
	_, err = b.ResetLimits(ctx)
	return err
}

// PutPartitionLimits gives one partition of the upstream limits of its
// own, in place of what the config gives it, until ResetPartitionLimits.
// Limits with problems (shaper.Upstream.CheckPartitionLimits) change
// nothing: it returns the problems instead.
func (r *Reader) PutPartitionLimits(ctx context.Context, name, partition string, limits []leaky.Limit) ([]shaper.Problem, error) {
	src, b, err := r.upstream(name)
	if err != nil {
		return nil, err
	}
	if ps := src.CheckPartitionLimits(partition, limits); len(ps) > 0 {
		return ps, nil
	}
	return nil, b.PutPartitionLimits(ctx, partition, limits)
}

// ResetPartitionLimits gives the partition back what the config gives it.
func (r *Reader) ResetPartitionLimits(ctx context.Context, name, partition string) error {
	_, b, err := r.upstream(name)
	if err != nil {
		return err
	}
	return b.ResetPartitionLimits(ctx, partition)
}

// PartitionLimits reads what limits a partition of the upstream is held
// to, beside the upstream's own.
func (r *Reader) PartitionLimits(ctx context.Context, name, partition string) (PartitionLimits, error) {
	src, b, err := r.upstream(name)
	if err != nil {
		return PartitionLimits{}, err
	}
	out := PartitionLimits{Upstream: name, Partition: partition, Limits: []Limit{}}
	ls, ok, err := b.ReadPartitionLimits(ctx, partition)
	if err != nil {
		return PartitionLimits{}, err
	}
	if ok {
		out.Source = SourceOperator
	} else if ls = src.PartitionLimitsFor(partition); len(ls) > 0 {
		out.Source = SourceConfigured
	}
	for _, l := range ls {
		out.Limits = append(out.Limits, shownLimit(l, b.Config().Guard, float64(l.Rate), out.Source))
	}
	return out, nil
}

func (r *Reader) upstream(name string) (shaper.Upstream, *leaky.Bucket, error) {
	src, ok := r.sources[name]
	if !ok {
		return shaper.Upstream{}, nil, fmt.Errorf("upstream %q: %w", name, queue.ErrUnknownUpstream)
	}
	return src, r.buckets[name], nil
}

// applyOverride brings the bucket to what an operator set, for a reader
// that does not Follow (the command line), and says what to show of it.
func applyOverride(ctx context.Context, b *leaky.Bucket, src shaper.Upstream, now time.Time) (*Override, error) {
	o, err := b.ReadOverride(ctx)
	if err != nil {
		return nil, err
	}
	if _, _, err := b.Apply(o, now); err != nil {
		return nil, err
	}
	if o.Limits == nil {
		return nil, nil
	}
	ov := &Override{Since: o.At.UTC(), Configured: []Limit{}}
	for _, l := range src.Limits {
		ov.Configured = append(ov.Configured, shownLimit(l, b.Config().Guard, float64(l.Rate), SourceConfigured))
	}
	return ov, nil
}

func shownLimit(l leaky.Limit, guard time.Duration, eff float64, src string) Limit {
	return Limit{
		Rate: l.Rate, Per: l.Per.String(), Cost: l.Cost, Burst: l.Burst,
		Description: l.String(), SustainedPerSecond: l.SustainedRate(guard) / l.Per.Seconds(),
		Adaptive: l.Adaptive, EffectiveRate: eff, Source: src,
	}
}
