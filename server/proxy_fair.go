package server

import (
	"context"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/leaky"
)

// callLookahead is how far ahead of now a call books its slot: the
// workers' horizon, as a job's, and never further, so that a change of
// limits drains calls as it drains jobs (docs/limits.md).
func (s *Server) callLookahead() time.Duration {
	if s.cfg.Horizon <= 0 {
		return shaper.DefaultHorizon
	}
	return s.cfg.Horizon
}

// reserveCall is one attempt to book call c's slot in its fairness key's
// turn (jobstore.Space.BookCall, batched with the replica's other calls
// booking at once): a reservation OK when booked; else not
// OK with RetryAfter (refused: how far beyond the call's wait its slot
// lies, answered 429 at once; not refused: when to come back).
func (s *Server) reserveCall(ctx context.Context, e *proxyEntry, c callSpec, fk, id, lease string, limits []leaky.Limit, remaining time.Duration) (res *leaky.Reservation, refused bool, err error) {
	t, err := e.booker.Book(ctx, jobstore.Call{
		Upstream: e.up, Bucket: e.bucket, LeaseAfterSlot: e.up.Timeout + 10*time.Second,
		FairKey: fk, Lane: c.lane, Partition: c.partition, PartitionLimits: limits, Costs: c.costs,
		Lookahead: s.callLookahead(), Remaining: remaining, Lease: lease, ID: id, Now: s.cfg.PacerNow,
	})
	if err != nil {
		return nil, false, err
	}
	if t.Slot != nil {
		return t.Slot, false, nil
	}
	return &leaky.Reservation{RetryAfter: t.Wait, Reason: t.Reason}, t.Refused, nil
}

// reasonText names why a call was refused, for its 429's detail.
func reasonText(r leaky.Reason) string {
	if r == jobstore.ReasonTurn {
		return "its tenant's fair share"
	}
	return r.String()
}
