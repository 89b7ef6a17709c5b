package server

import (
	"context"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/tokenbucket"
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

// reserveCall is one attempt to book call c's slot in its turn
// (jobstore.Space.BookCall, batched with the replica's other calls
// booking at once), paying admit first when set: a slot when booked; else
// when to come back, or (Refused) how far beyond the call's wait, which
// ends at deadline, its slot lies.
func (s *Server) reserveCall(ctx context.Context, e *proxyEntry, c callSpec, fk, id, lease string, limits []leaky.Limit, deadline time.Time, admit *tokenbucket.Admission) (jobstore.Turn, error) {
	return e.booker.Book(ctx, jobstore.Call{
		Upstream: e.up, Bucket: e.bucket, LeaseAfterSlot: e.up.Timeout + 10*time.Second,
		FairKey: fk, Lane: c.lane, Partition: c.partition, PartitionLimits: limits, Costs: c.costs,
		Lookahead: s.callLookahead(), Deadline: deadline, Lease: lease, ID: id, Now: s.cfg.PacerNow, Admit: admit,
	})
}

// reasonText names why a call was refused, for its 429's detail.
func reasonText(r leaky.Reason) string {
	if r == jobstore.ReasonTurn {
		return "its tenant's fair share"
	}
	return r.String()
}
