package dispatcher

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/shaperhq/shaper/internal/pushback"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// What the dispatcher does with an upstream's answer beyond the job's own
// outcome (see classify): limits the upstream states become the fleet's
// (leaky.Bucket.Learn), pushback cuts adaptive limits, costs are settled
// from the answer, and a bare 429 pauses the upstream by a pushback that
// grows while they repeat.

// heard is what a replica remembers of an upstream's word.
type heard struct {
	mu        sync.Mutex
	stated    []leaky.Limit
	learnedAt time.Time
}

// any reports whether the upstream has stated limits to this replica.
func (h *heard) any() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.stated) > 0
}

// configuredLimits is what the gauges show before Redis says more.
func configuredLimits(u *upstream) []leaky.LimitState {
	out := make([]leaky.LimitState, len(u.cfg.Limits))
	for i, l := range u.cfg.Limits {
		src := leaky.SourceConfigured
		if l.Adaptive {
			src = leaky.SourceAdaptive
		}
		out[i] = leaky.LimitState{Limit: l, Rate: float64(l.Rate), Source: src}
	}
	return out
}

// setSpacing records how far apart the request limits among ls, at the
// rates they are paced at, space sends: a quota that frees its next unit
// sooner than this needs no pause.
func (u *upstream) setSpacing(ls []leaky.LimitState) {
	if out := pushback.Spacing(ls, u.bucket.Guard()); out > 0 {
		u.spacingUs.Store(out.Microseconds())
	}
}

// spacing is what setSpacing recorded last.
func (u *upstream) spacing() time.Duration {
	return time.Duration(u.spacingUs.Load()) * time.Microsecond
}

// heed acts on an answer's word for the whole fleet: it learns stated
// limits, feeds pushback to adaptive limits, pauses the upstream, and
// settles the job's costs. It returns the verdict with the wait a bare
// pushback set.
func (d *Dispatcher) heed(ctx context.Context, u *upstream, job *queue.Job, resp *queue.Response, v verdict) verdict {
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if v.rd != nil {
		d.learn(bg, u, pushback.Stated(v.rd))
	}
	if v.refused && u.isAdaptive() {
		if cuts, err := u.bucket.Feedback(bg, true); err != nil {
			d.m.RedisErrors.WithLabelValues("pacing").Inc()
			d.log.Error("could not lower an adaptive limit after pushback", "upstream", u.cfg.Name, "err", err)
		} else if cuts > 0 {
			d.log.Info("upstream pushed back; adaptive limits lowered fleet-wide", "upstream", u.cfg.Name)
			d.showLimits(bg, u)
		}
	}
	switch {
	case v.bare:
		until, dur, paused, err := pushback.Pause(bg, u.bucket, u.cfg.PushbackDefault, u.spacing(), v.sentAt)
		switch {
		case err != nil:
			d.m.RedisErrors.WithLabelValues("pacing").Inc()
			d.log.Error("could not pause upstream after a 429", "upstream", u.cfg.Name, "err", err)
			dur = u.cfg.PushbackDefault
		case paused:
			d.m.UpstreamBlocks.WithLabelValues(u.cfg.Name, queue.BlockRefused).Inc()
			d.log.Warn("upstream answered 429 without a time; paused fleet-wide", "upstream", u.cfg.Name,
				"for", dur, "until", until.Format(time.RFC3339Nano))
		}
		v.wait = max(v.wait, dur)
		if err == nil {
			v.until = until
		}
	case v.block > 0:
		v.until = d.block(bg, u, v.block, v.blockReason)
	}
	if resp != nil && len(u.cfg.Settle) > 0 {
		d.settle(bg, u, job, resp)
	}
	return v
}

// learn records what the upstream states, when it changed or is due a
// refresh, and says once, fleet-wide, when it is below the config.
func (d *Dispatcher) learn(ctx context.Context, u *upstream, stated []leaky.Limit) {
	if len(stated) == 0 {
		// An answer that states nothing (a proxy's 502, a CDN's 429)
		// says nothing about the upstream's policy: what was stated
		// stands until it lapses in Redis, an hour after it was last
		// stated.
		return
	}
	u.heard.mu.Lock()
	before := u.heard.stated
	same := slices.Equal(stated, before) && time.Since(u.heard.learnedAt) < pushback.Relearn
	u.heard.mu.Unlock()
	if same {
		return
	}
	changed, err := u.bucket.Learn(ctx, stated)
	if err != nil {
		d.m.RedisErrors.WithLabelValues("pacing").Inc()
		d.log.Error("could not record the limits the upstream states", "upstream", u.cfg.Name, "err", err)
		return
	}
	u.heard.mu.Lock()
	u.heard.stated, u.heard.learnedAt = stated, time.Now()
	u.heard.mu.Unlock()
	ls := configuredLimits(u)
	for _, l := range stated {
		ls = append(ls, leaky.LimitState{Limit: l, Rate: float64(l.Rate), Source: leaky.SourceStated})
	}
	u.setSpacing(ls)
	if !changed {
		return
	}
	if lower := belowConfig(stated, u.cfg.Limits); lower != "" {
		d.log.Warn("upstream states a lower limit than configured; pacing at the stated one", "upstream", u.cfg.Name,
			"limits", lower)
		if slowest(stated) < slowest(before) {
			// Slots booked at the old pace up to the horizon ahead, here
			// and on other replicas, would still go out at it: a block
			// over them hands their jobs back, to be booked anew.
			d.block(ctx, u, d.cfg.Horizon, queue.BlockStatedLimit)
		}
	} else if len(stated) > 0 {
		d.log.Info("upstream states its limits", "upstream", u.cfg.Name, "stated", describe(stated))
	}
	d.showLimits(ctx, u)
}

// belowConfig describes stated limits that allow fewer requests per
// second than every configured request limit: "stated 40 per 1s,
// configured 100 per 1s".
func belowConfig(stated, configured []leaky.Limit) string {
	var parts []string
	for _, s := range stated {
		for _, c := range configured {
			if c.Cost != "" {
				continue
			}
			if float64(s.Rate)/s.Per.Seconds() < float64(c.Rate)/c.Per.Seconds() {
				parts = append(parts, fmt.Sprintf("stated %d per %v, configured %d per %v", s.Rate, s.Per, c.Rate, c.Per))
				break
			}
		}
	}
	return strings.Join(parts, "; ")
}

// slowest is the lowest rate per second among ls; +Inf for none.
func slowest(ls []leaky.Limit) float64 {
	out := math.Inf(1)
	for _, l := range ls {
		out = min(out, float64(l.Rate)/l.Per.Seconds())
	}
	return out
}

func describe(ls []leaky.Limit) string {
	parts := make([]string, len(ls))
	for i, l := range ls {
		parts[i] = fmt.Sprintf("%d per %v", l.Rate, l.Per)
	}
	return strings.Join(parts, ", ")
}

// settle replaces the job's estimated costs by what the answer says it
// used.
func (d *Dispatcher) settle(ctx context.Context, u *upstream, job *queue.Job, resp *queue.Response) {
	for cost, rule := range u.cfg.Settle {
		actual, ok := rule.Amount(resp.Headers, resp.Body)
		if !ok {
			continue
		}
		estimate := job.Cost[cost]
		if actual == estimate {
			continue
		}
		if err := u.bucket.Settle(ctx, cost, estimate, actual, job.Partition, u.partitionLimits(ctx, job.Partition)); err != nil {
			d.m.RedisErrors.WithLabelValues("pacing").Inc()
			d.log.Error("could not settle a job's cost", "upstream", u.cfg.Name, "job", job.ID, "cost", cost, "err", err)
			continue
		}
		if actual < estimate {
			// The fetch loop sleeps until the slot it last saw, which the
			// units given back have moved closer: look again now.
			u.poke()
		}
	}
}

// showLimits sets the effective-rate gauge of each of the upstream's
// limits from the bucket's state.
func (d *Dispatcher) showLimits(ctx context.Context, u *upstream) {
	st, err := u.bucket.State(ctx)
	if err != nil {
		return
	}
	d.setLimitGauges(u, st.Limits)
	// The spacing follows an adaptive limit's current rate and the
	// stated limits, whichever replica learned them.
	u.setSpacing(st.Limits)
}

// setLimitGauges shows each limit's rate in units per second, labelled by
// what it counts and its window ("requests/1s") and where the rate comes
// from. A stated limit that is no longer stated drops out, as do limits an
// operator's change replaced.
func (d *Dispatcher) setLimitGauges(u *upstream, ls []leaky.LimitState) {
	g := d.m.UpstreamLimitRate
	g.DeletePartialMatch(map[string]string{"upstream": u.cfg.Name})
	for _, l := range ls {
		g.WithLabelValues(u.cfg.Name, l.Limit.Unit()+"/"+l.Limit.Per.String(), l.Source).Set(l.Rate / l.Limit.Per.Seconds())
	}
}
