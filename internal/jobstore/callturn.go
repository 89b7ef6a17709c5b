package jobstore

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/gcra"
	"github.com/shaperhq/shaper/internal/script"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/tokenbucket"
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

// callKeys are call_turn.lua's own KEYS, before the admission buckets
// and the bucket's.
func (s Space) callKeys() []string {
	return []string{s.fKey(), s.callQueueKey(), s.callMarkKey(), s.callTimeKey()}
}

var callTurnScript = script.New(gcra.LuaFunctions, leaky.BookingLua(), tokenbucket.AdmitLua(), lua("partmarks.lua"), lua("call_turn.lua"))

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
	// Deadline, when set, is when the call stops waiting: its remaining
	// wait is then taken from it when its script call is sent, so that a
	// call that queued for a batch does not book a slot past its wait.
	Deadline time.Time
	// Lease is the call's concurrency lease id, when the bucket has a cap.
	Lease string
	// ID names the call, the same on each attempt: its place in its
	// key's line of waiting calls.
	ID string
	// Now overrides Redis's clock (tests).
	Now func() time.Time
	// Admit, when set, is the admission the call pays before it books, in
	// the same script call (tokenbucket.AdmitLua): a call admission
	// refuses books nothing. Its bucket lies in a slot of its own, so
	// only a client of a single Redis server may set it.
	Admit *tokenbucket.Admission
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
	// Admitted is set when the call paid its admission (Call.Admit) in
	// this booking; Denied, when admission refused it, is admission's
	// decision (and nothing was booked). A booking that paid admission
	// and then failed, booking again under fresh limits, answers Admitted
	// beside its error.
	Admitted bool
	Denied   *shaper.Result
}

// BookCall books call c's slot if it is its turn and within its
// lookahead (see call_turn.lua), in one script call of its own. A
// CallBooker books concurrent calls together.
func (s Space) BookCall(ctx context.Context, rdb redis.Scripter, c Call) (Turn, error) {
	return bookCall(ctx, c, (*leaky.Bucket).Plan, func(ctx context.Context, c Call, plan leaky.Plan) (Turn, error) {
		ts, err := s.runCalls(ctx, rdb, []callReq{{c, plan}})
		if err != nil {
			return Turn{}, err
		}
		return ts[0].turn, ts[0].err
	})
}

// bookCall books c through book, under the plan planOf makes, again
// under fresh limits after an operator changed them (without its
// admission, paid the first time).
func bookCall(ctx context.Context, c Call, planOf func(*leaky.Bucket, time.Duration) leaky.Plan, book func(context.Context, Call, leaky.Plan) (Turn, error)) (Turn, error) {
	admitted := false
	for range 3 {
		plan := planOf(c.Bucket, c.LeaseAfterSlot)
		t, err := book(ctx, c, plan)
		if c.Admit != nil && err == nil && t.Denied == nil {
			admitted, c.Admit = true, nil
		}
		t.Admitted = t.Admitted || admitted
		if err != nil || t.Reason != leaky.ReasonStale {
			return t, err
		}
		// An operator changed the limits since this process read them, and
		// nothing was booked under the old ones: read them, book again.
		if err := c.Bucket.Refresh(ctx, plan.Version()); err != nil {
			return Turn{Admitted: admitted}, err
		}
	}
	// Changed three times over within one call: come back shortly.
	return Turn{Wait: 10 * time.Millisecond, Reason: leaky.ReasonStale, Admitted: admitted}, nil
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

// callArgs appends call c's arguments to call_turn.lua (A there) to
// args; adm is the index of its admission bucket among the script's (0
// for none).
func (s Space) callArgs(args []any, c Call, adm int) ([]any, error) {
	lane := c.Lane
	if lane == "" {
		lane = shaper.DefaultLane
	}
	var pargs []any
	if len(c.PartitionLimits) > 0 {
		var err error
		if pargs, err = c.Bucket.PartitionArgs(c.PartitionLimits); err != nil {
			return nil, fmt.Errorf("book call on %s: partition limits: %w", s.Upstream, err)
		}
	}
	remaining := c.Remaining
	if !c.Deadline.IsZero() {
		remaining = time.Until(c.Deadline)
	}
	args = append(args, script.NowArg(c.Now), max(remaining, 0).Microseconds(), c.Lease, c.FairKey, lane,
		max(c.Upstream.Lanes[lane], 1), c.ID, adm)
	if adm > 0 {
		args = append(args, c.Admit.Cost)
	}
	if pargs == nil {
		args = append(args, 0)
	} else {
		args = append(args, pargs...)
	}
	args = append(args, c.Partition, len(c.Costs))
	for _, name := range sortedCosts(c.Costs) {
		args = append(args, name, c.Costs[name])
	}
	return args, nil
}

// runCalls books calls, in order, in one script call; they share one
// plan, lookahead, fairness weights and admission limiter (see
// batchable). An error is the script call's; a call's own (its
// arguments, its reply) is in its result.
func (s Space) runCalls(ctx context.Context, rdb redis.Scripter, calls []callReq) ([]callRes, error) {
	return s.runBatch(ctx, rdb, s.callKeys(), calls)
}

// runBatch is runCalls with the script's own KEYS built already (callKeys).
func (s Space) runBatch(ctx context.Context, rdb redis.Scripter, own []string, calls []callReq) ([]callRes, error) {
	out := make([]callRes, len(calls))
	keys, args, sent := s.batchArgs(own, calls, out)
	if len(sent) == 0 {
		return out, nil
	}
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

// batchArgs are the KEYS and ARGV of call_turn.lua for calls, and which
// of them it books (sent): a call whose arguments cannot be made has its
// error in out instead. own are the script's own KEYS (callKeys).
func (s Space) batchArgs(own []string, calls []callReq, out []callRes) (keys []string, args []any, sent []int) {
	first := calls[0]
	u := first.c.Upstream
	keys = make([]string, 4, 4+len(first.plan.Keys)+1)
	copy(keys, own)
	args = make([]any, 0, 8+2*len(u.Fairness.Weights)+len(first.plan.Args)+16*len(calls))
	args = append(args, 0, s.our, first.c.Lookahead.Microseconds(), CallMark.Microseconds(), len(u.Fairness.Weights))
	for _, k := range sortedKeys(u.Fairness.Weights) {
		args = append(args, k, u.Fairness.Weights[k])
	}
	// Admission's buckets, each named once; the calls give their index.
	adm := make([]int, len(calls))
	var lim *tokenbucket.Admission
	for i, r := range calls {
		a := r.c.Admit
		if a == nil {
			continue
		}
		if lim == nil {
			lim = a
		}
		for j := 4; j < len(keys); j++ {
			if keys[j] == a.Key {
				adm[i] = j - 3
			}
		}
		if adm[i] == 0 {
			keys = append(keys, a.Key)
			adm[i] = len(keys) - 4
		}
	}
	if lim == nil {
		args = append(args, 0)
	} else {
		args = append(args, len(keys)-4, lim.Clock(), lim.Interval, lim.Capacity)
	}
	keys = append(keys, first.plan.Keys...)
	args = append(args, len(first.plan.Args))
	args = append(args, first.plan.Args...)
	for i, r := range calls {
		a, err := s.callArgs(args, r.c, adm[i])
		if err != nil {
			out[i].err = err
			continue
		}
		args = a
		sent = append(sent, i)
	}
	args[0] = len(sent)
	return keys, args, sent
}

// batchable is whether call r may share the script call of a batch
// whose first call is first and whose admission limiter is lim (nil for
// none yet): the same bucket keys and booking args, lookahead and
// fairness weights, and no admission of another limiter.
func batchable(first, r callReq, lim *tokenbucket.Limiter) bool {
	return slices.Equal(first.plan.Keys, r.plan.Keys) && slices.Equal(first.plan.Args, r.plan.Args) &&
		first.c.Lookahead == r.c.Lookahead && maps.Equal(first.c.Upstream.Fairness.Weights, r.c.Upstream.Fairness.Weights) &&
		(r.c.Admit == nil || lim == nil || r.c.Admit.Limiter() == lim)
}

// adoptTurn reads one call's reply.
func adoptTurn(r callReq, v any, issued, received time.Time) (Turn, error) {
	c, plan := r.c, r.plan
	out, err := script.Ints(v, -1)
	n := plan.Limits()
	if err != nil || len(out) < 5 || (out[0] == 1 && len(out) != 5+2*n && len(out) != 5+2*n+2*len(c.PartitionLimits)) ||
		(out[0] == 2 && c.Admit == nil) {
		return Turn{}, fmt.Errorf("script jobstore.call_turn: malformed reply %v: %v", v, err)
	}
	switch out[0] {
	case 0:
		return Turn{Wait: time.Duration(out[1]) * time.Microsecond, Reason: leaky.Reason(out[2]), Refused: out[3] == 1}, nil
	case 2:
		res := c.Admit.Result(out[1])
		return Turn{Denied: &res}, nil
	}
	res := c.Bucket.AdoptBooked(plan, out[4], out[1], c.Lease, out[5:5+2*n], c.Partition, c.PartitionLimits, out[5+2*n:], issued, received)
	res.Reason = leaky.Reason(out[2])
	return Turn{Slot: res, Reason: res.Reason}, nil
}

func sortedCosts(c leaky.Costs) []string {
	if len(c) == 0 {
		return nil
	}
	m := make(map[string]int, len(c))
	for k := range c {
		m[k] = 0
	}
	return sortedKeys(m)
}
