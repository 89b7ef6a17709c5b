package jobstore

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/gcra"
	"github.com/shaperhq/shaper/internal/script"
	"github.com/shaperhq/shaper/leaky"
)

// Proxied calls in fair share (call_turn.lua): beside the take's ready
// structure, three keys in the upstream's slot.
//
//	P:s:{Q}:cq   zset: fairness key with calls waiting -> its virtual time
//	P:s:{Q}:cw   zset: the same keys -> µs until their mark lapses
//	P:s:{Q}:cv   hash: fairness key -> the virtual time its calls reached
func (s Space) callQueueKey() string { return s.our + "cq" }
func (s Space) callMarkKey() string  { return s.our + "cw" }
func (s Space) callTimeKey() string  { return s.our + "cv" }

var callTurnScript = script.New(gcra.LuaFunctions, leaky.BookingLua(), lua("call_turn.lua"))

// ReasonTurn: a call's fairness key is ahead of another key that waits,
// by more than one of its sends; it comes back when the others had theirs.
const ReasonTurn = leaky.ReasonTurn

// CallMark is how long a waiting call's mark outlives the time it said it
// would come back (or its booking, for the key's other calls): a replica
// that died mid-wait, or a caller that left, stops counting within this,
// and a take that yielded to it takes again.
const CallMark = 100 * time.Millisecond

// Call is one attempt of a proxied call to book its slot in its turn.
type Call struct {
	// Upstream is the call's upstream, with defaults (its fairness
	// weights and lanes).
	Upstream shaper.Upstream
	Bucket   *leaky.Bucket
	// LeaseAfterSlot is how long a concurrency lease outlives its slot.
	LeaseAfterSlot time.Duration
	// FairKey is the key a job of the call's tenant and partition would
	// have (FairKey); Lane the call's lane ("" the default).
	FairKey, Lane string
	Partition     string
	// PartitionLimits are the partition's configured limits.
	PartitionLimits []leaky.Limit
	Costs           leaky.Costs
	// Lookahead is the latest slot the call books, from now; Remaining
	// how long it may still wait.
	Lookahead, Remaining time.Duration
	// Lease is the call's concurrency lease id, when the bucket has a cap.
	Lease string
	// ID names the call, the same on each attempt: its place in its
	// key's line of waiting calls.
	ID string
	// Now overrides Redis's clock (tests).
	Now func() time.Time
}

// Turn is what an attempt decided.
type Turn struct {
	// Slot is the booked reservation, nil when none was booked.
	Slot *leaky.Reservation
	// Wait, with no slot, is when to come back, or when Refused how far
	// beyond the call's wait its slot lies (as estimated).
	Wait    time.Duration
	Reason  leaky.Reason
	Refused bool
}

// BookCall books call c's slot if it is its turn and within its
// lookahead (see call_turn.lua), in one script call of its own. A
// CallBooker books concurrent calls together.
func (s Space) BookCall(ctx context.Context, rdb redis.Scripter, c Call) (Turn, error) {
	return bookCall(ctx, c, func(ctx context.Context, c Call, plan leaky.Plan) (Turn, error) {
		ts, err := s.runCalls(ctx, rdb, []callReq{{c, plan}})
		if err != nil {
			return Turn{}, err
		}
		return ts[0].turn, ts[0].err
	})
}

// bookCall books c through book, again under fresh limits after an
// operator changed them.
func bookCall(ctx context.Context, c Call, book func(context.Context, Call, leaky.Plan) (Turn, error)) (Turn, error) {
	for range 3 {
		plan := c.Bucket.Plan(c.LeaseAfterSlot)
		t, err := book(ctx, c, plan)
		if err != nil || t.Reason != leaky.ReasonStale {
			return t, err
		}
		// An operator changed the limits since this process read them, and
		// nothing was booked under the old ones: read them, book again.
		if err := c.Bucket.Refresh(ctx, plan.Version()); err != nil {
			return Turn{}, err
		}
	}
	// Changed three times over within one call: come back shortly.
	return Turn{Wait: 10 * time.Millisecond, Reason: leaky.ReasonStale}, nil
}

// callReq is one call to book under plan; callRes what became of it.
type callReq struct {
	c    Call
	plan leaky.Plan
}

type callRes struct {
	turn Turn
	err  error
}

// args are call c's arguments to call_turn.lua (A there); the plan's
// args, shared by the batch, go once before every call's.
func (s Space) callArgs(c Call) ([]any, error) {
	u := c.Upstream
	lane := c.Lane
	if lane == "" {
		lane = shaper.DefaultLane
	}
	pargs, err := c.Bucket.PartitionArgs(c.PartitionLimits)
	if err != nil {
		return nil, fmt.Errorf("book call on %s: partition limits: %w", s.Upstream, err)
	}
	args := make([]any, 0, 16+len(pargs)+2*len(c.Costs)+2*len(u.Fairness.Weights))
	args = append(args, script.NowArg(c.Now), c.Lookahead.Microseconds(), max(c.Remaining, 0).Microseconds(), c.Lease,
		c.FairKey, s.our, lane, max(u.Lanes[lane], 1), CallMark.Microseconds(), c.ID)
	args = append(args, len(u.Fairness.Weights))
	for _, k := range sortedKeys(u.Fairness.Weights) {
		args = append(args, k, u.Fairness.Weights[k])
	}
	args = append(args, pargs...)
	args = append(args, c.Partition, len(c.Costs))
	for _, name := range sortedCosts(c.Costs) {
		args = append(args, name, c.Costs[name])
	}
	return args, nil
}

// runCalls books calls, in order, in one script call; they share one
// plan (its keys and args: one bucket under one set of limits, see
// samePlan). An error is the script call's; a call's own (its arguments,
// its reply) is in its result.
func (s Space) runCalls(ctx context.Context, rdb redis.Scripter, calls []callReq) ([]callRes, error) {
	out := make([]callRes, len(calls))
	keys := append([]string{s.vKey(), s.fKey(), s.callQueueKey(), s.callMarkKey(), s.callTimeKey()}, calls[0].plan.Keys...)
	args := append([]any{0, len(calls[0].plan.Args)}, calls[0].plan.Args...)
	var sent []int
	for i, r := range calls {
		a, err := s.callArgs(r.c)
		if err != nil {
			out[i].err = err
			continue
		}
		args = append(args, len(a))
		args = append(args, a...)
		sent = append(sent, i)
	}
	if len(sent) == 0 {
		return out, nil
	}
	args[0] = len(sent)
	issued := time.Now()
	v, err := script.Run(ctx, rdb, "jobstore.call_turn", callTurnScript, keys, args...)
	if err != nil {
		return nil, err
	}
	received := time.Now()
	replies, ok := v.([]any)
	if !ok || len(replies) != len(sent) {
		return nil, fmt.Errorf("script jobstore.call_turn: malformed reply %v", v)
	}
	for j, i := range sent {
		out[i].turn, out[i].err = adoptTurn(calls[i], replies[j], issued, received)
	}
	return out, nil
}

// samePlan is whether calls under plans p and q may share a script call:
// the same bucket keys and booking args.
func samePlan(p, q leaky.Plan) bool {
	return slices.Equal(p.Keys, q.Keys) && slices.Equal(p.Args, q.Args)
}

// adoptTurn reads one call's reply.
func adoptTurn(r callReq, v any, issued, received time.Time) (Turn, error) {
	c, plan := r.c, r.plan
	out, err := script.Ints(v, -1)
	n := plan.Limits()
	if err != nil || len(out) < 5 || (out[0] == 1 && len(out) != 5+2*n && len(out) != 5+2*n+2*len(c.PartitionLimits)) {
		return Turn{}, fmt.Errorf("script jobstore.call_turn: malformed reply %v: %v", v, err)
	}
	if out[0] != 1 {
		return Turn{Wait: time.Duration(out[1]) * time.Microsecond, Reason: leaky.Reason(out[2]), Refused: out[3] == 1}, nil
	}
	res := c.Bucket.AdoptBooked(plan, out[4], out[1], c.Lease, out[5:5+2*n], c.Partition, c.PartitionLimits, out[5+2*n:], issued, received)
	res.Reason = leaky.Reason(out[2])
	return Turn{Slot: res, Reason: res.Reason}, nil
}

func sortedCosts(c leaky.Costs) []string {
	m := make(map[string]int, len(c))
	for k := range c {
		m[k] = 0
	}
	return sortedKeys(m)
}
