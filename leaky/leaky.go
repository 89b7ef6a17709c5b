// Package leaky paces outbound calls to a rate-limited upstream across any
// number of processes: a leaky bucket per upstream, kept in Redis, that hands
// out send slots at a strict rate.
//
// A Bucket holds one or more Limits (say 100 requests per second and 800,000
// tokens per minute); Reserve books the next slot that satisfies all of them
// at once, in one Lua script on Redis's clock, and says how long to wait for
// it. Sends that follow their reservations never put more than a limit's Rate
// units into any window of its Per, however many replicas reserve, because
// slots are spaced with a guard for the time a send may slip after its slot
// (see Limit.Params) and Wait refuses to send a slot that slipped further.
//
// Most callers should use Take, which reserves, waits and retries. Reserve and
// Wait are the parts, for callers (like shaper's dispatcher) that do something
// else with a long wait than sleep through it. Besides the limits a bucket can
// be blocked fleet-wide until a time (an upstream said "retry after 30s", or
// an operator paused it) and can cap how many sends are in flight at once
// with leases that expire if their holder dies. An operator can replace a
// bucket's limits, or give a partition its own, for every process at once
// and strictly through the change (PutLimits, PutPartitionLimits, Follow;
// see override.go).
package leaky

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/keyspace"
	"github.com/shaperhq/shaper/internal/script"
)

// ErrLate is returned by Wait when the caller woke up so long after its slot
// that sending now could crowd a later slot's send into the same window. The
// slot is used up; reserve again.
var ErrLate = errors.New("leaky: woke too late for the reserved slot")

// ErrCostTooLarge is returned by Reserve when a cost exceeds what one of the
// bucket's limits lets through at once (its Capacity): such a reservation
// could never be honoured strictly.
var ErrCostTooLarge = errors.New("leaky: cost exceeds a limit's burst capacity")

// Defaults for BucketConfig's zero values.
const (
	DefaultMaxWait  = time.Second
	DefaultLeaseTTL = time.Minute
	// DefaultGuard is the guard for limits with Per of a second or more
	// (see DefaultGuardFor): it leaves 10ms for a worker to wake up late and
	// 10ms for the request's trip, at a cost of 2% of a per-second rate.
	DefaultGuard = 20 * time.Millisecond
)

// DefaultGuardFor is the guard a bucket with these limits gets by default:
// DefaultGuard, or a fiftieth of the shortest Per if that is smaller.
func DefaultGuardFor(limits []Limit) time.Duration {
	g := DefaultGuard
	for _, l := range limits {
		g = min(g, l.Per/50)
	}
	return g
}

// Config configures a Pacer. The zero value works.
type Config struct {
	// Prefix starts every key; default keyspace.DefaultPrefix.
	Prefix string
	// Now, when set, replaces Redis's clock with the caller's. Only for
	// tests and for hosts that forbid TIME in scripts: replicas with skewed
	// clocks then break the guarantees.
	Now func() time.Time
}

// Pacer creates buckets on one Redis (a Client, ClusterClient or Ring: all
// of a bucket's keys share a hash tag). It is safe for concurrent use.
type Pacer struct {
	rdb    redis.Scripter
	prefix string
	now    func() time.Time
	blocks *blockBoard
	hooks  changeHooks
}

// New returns a Pacer on rdb. The caller owns rdb and closes it.
func New(rdb redis.Scripter, cfg Config) *Pacer {
	return &Pacer{rdb: rdb, prefix: keyspace.Prefix(cfg.Prefix), now: cfg.Now, blocks: newBlockBoard()}
}

// BucketConfig shapes one bucket. Zero values are the documented defaults.
type BucketConfig struct {
	// Limits must all allow a send; at least one.
	Limits []Limit
	// Guard is how far a send may slip after its slot; see Limit.Params.
	// Zero means DefaultGuardFor(Limits). Wait treats a slip beyond half the
	// guard as ErrLate, leaving the other half for the trip to the upstream.
	Guard time.Duration
	// Concurrency caps sends in flight across all replicas; 0 is no cap.
	Concurrency int
	// LeaseTTL is how long a concurrency lease outlives its slot if its
	// holder neither releases nor extends it; default DefaultLeaseTTL.
	LeaseTTL time.Duration
	// MaxWait is the longest wait Reserve books; further slots are refused
	// with a RetryAfter. Default DefaultMaxWait.
	MaxWait time.Duration
	// Generation names the state of Limits: 0 (the default) for the
	// limits a bucket is configured with, the generation of an operator's
	// change for the limits it put in their place (see Override), whose
	// state then starts apart from the configured limits'.
	Generation int64
	// Draining are limits in force before the last change of limits,
	// each under its own generation's state, enforced beside Limits while
	// the slots booked under them drain (see Override.Pace). A draining
	// limit whose state is Limits' own (same generation and id) is not
	// enforced twice.
	Draining []Phase
}

// Bucket paces one upstream. Build it with Pacer.Bucket.
type Bucket struct {
	p    *Pacer
	name string
	cfg  BucketConfig // Limits, Generation and Draining as at construction
	// set is the limits paced at now (SetLimits replaces it); every call
	// loads it once.
	set      atomic.Pointer[limitSet]
	clock    *offsetEstimator
	batch    *script.Batcher[reserveReq, reserveRes]
	releases *script.Batcher[string, struct{}]
	// applied is the override last applied (Apply), under applyMu;
	// refreshMu lets one Refresh read at a time.
	applyMu, refreshMu sync.Mutex
	applied            *Override
}

// validName is what a bucket name may be; it becomes a Redis hash tag.
func validName(name string) error {
	if name == "" || len(name) > 200 || strings.ContainsAny(name, "{}") {
		return fmt.Errorf("bucket name %q: must be 1-200 characters without braces", name)
	}
	return nil
}

// Bucket returns the bucket called name, validating its config.
func (p *Pacer) Bucket(name string, cfg BucketConfig) (*Bucket, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	if len(cfg.Limits) == 0 {
		return nil, fmt.Errorf("bucket %s: at least one limit is required", name)
	}
	if cfg.Guard < 0 {
		return nil, fmt.Errorf("bucket %s: guard %v must not be negative", name, cfg.Guard)
	}
	if cfg.Guard == 0 {
		cfg.Guard = DefaultGuardFor(cfg.Limits)
	}
	if cfg.Concurrency < 0 {
		return nil, fmt.Errorf("bucket %s: concurrency %d must not be negative", name, cfg.Concurrency)
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	b := &Bucket{p: p, name: name, cfg: cfg, clock: newOffsetEstimator()}
	b.batch = script.NewBatcher(script.BatchOptions{}, b.runReserve)
	b.releases = script.NewBatcher(script.BatchOptions{}, b.runRelease)
	s, err := b.newSet(cfg.Limits, cfg.Generation, cfg.Draining, 1)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", name, err)
	}
	b.set.Store(s)
	return b, nil
}

// BlockKey is the block hash of the bucket called name (Layout.Block),
// for a reader that must see a block without the bucket's limits: what a
// waiting job waits for.
func (p *Pacer) BlockKey(name string) string { return p.key(name, "block") }

// key builds every key the package writes: prefix:leaky:{name}:part, so a
// bucket's keys share one Redis Cluster slot.
func (p *Pacer) key(name, part string) string {
	return p.prefix + ":leaky:{" + name + "}:" + part
}

// limitID names a limit's state by what it counts and over what window, so
// that reordering limits in a config, or changing a rate, keeps its history.
func limitID(l Limit) string {
	return l.Unit() + ":" + strconv.FormatInt(l.Per.Microseconds(), 10)
}

// Name is the bucket's name.
func (b *Bucket) Name() string { return b.name }

// Config is the bucket's config with defaults filled in, its Limits,
// Generation and Draining those paced at now (see SetLimits).
func (b *Bucket) Config() BucketConfig {
	c, s := b.cfg, b.cur()
	c.Limits, c.Generation, c.Draining = s.current(), s.gen, s.draining
	return c
}

// Costs are a reservation's amounts by cost name ("tokens": 1200). A limit
// without a cost name always counts 1; a limit whose cost is missing from
// Costs counts 0 for this reservation.
type Costs map[string]int64

// Reason says what decided a reservation's slot, or why none was booked.
type Reason int

const (
	// ReasonNone: the slot is now; nothing held it back.
	ReasonNone Reason = codeNone
	// ReasonLimit: a limit set the slot (Reservation.Limit says which).
	ReasonLimit Reason = codeLimit
	// ReasonBlocked: the bucket is blocked until the slot.
	ReasonBlocked Reason = codeBlocked
	// ReasonConcurrency: every concurrency lease is taken.
	ReasonConcurrency Reason = codeConcurrency
	// ReasonStale: an operator changed the bucket's limits since this
	// process last read them, and nothing was booked under the old ones.
	// Reserve and ReserveIn read them again and book (Refresh); a script
	// that books through BookingLua answers it to its caller, which calls
	// Refresh and tries again.
	ReasonStale Reason = codeStale
	// ReasonTurn: a proxied call's fairness key is ahead of another key
	// that waits, so it is not its turn (the job store's call_turn.lua).
	ReasonTurn Reason = codeTurn
)

func (r Reason) String() string {
	switch r {
	case ReasonNone:
		return "none"
	case ReasonLimit:
		return "limit"
	case ReasonBlocked:
		return "blocked"
	case ReasonConcurrency:
		return "concurrency"
	case ReasonPartition:
		return "partition"
	case ReasonStale:
		return "stale limits"
	case ReasonTurn:
		return "its tenant's fair share"
	}
	return "Reason(" + strconv.Itoa(int(r)) + ")"
}

// Reservation is the answer to Reserve.
type Reservation struct {
	// OK reports whether a slot was booked.
	OK bool
	// Delay is the wait from Redis's now until the booked slot (OK).
	Delay time.Duration
	// RetryAfter is how long until reserving again can succeed (not OK).
	RetryAfter time.Duration
	// Reason says what set the slot or refused it.
	Reason Reason
	// Limit is the limit that set the slot when Reason is ReasonLimit.
	Limit *Limit
	// Lease is the concurrency lease held from now until Release, or until
	// LeaseTTL after the slot. Empty without a concurrency cap.
	Lease string
	// Now is Redis's clock when the reservation was decided.
	Now time.Time

	sendAt   time.Time // local time certainly not before the slot
	earliest time.Time // local time certainly not after the slot
	tats     []int64   // prev, next per limit, for Cancel
	set      *limitSet // the limits it was booked under, for Cancel
	also     []partTAT // a partition's limits booked beside (ReserveIn)
	bucket   *Bucket
}

// SendAt is the local time at which to send: certainly not before the slot
// on Redis's clock (see offsetEstimator), and at most one round trip after.
func (r *Reservation) SendAt() time.Time { return r.sendAt }

// ReserveOption adjusts one Reserve call.
type ReserveOption func(*reserveOpts)

type reserveOpts struct {
	maxWait time.Duration
	lease   string
	stale   int // times ReserveIn was answered ReasonStale
}

// retriedStale counts a ReserveIn answered ReasonStale.
func retriedStale(o *reserveOpts) { o.stale++ }

// MaxWait overrides the bucket's MaxWait for one call. Zero books only a
// slot that is free right now.
func MaxWait(d time.Duration) ReserveOption {
	return func(o *reserveOpts) { o.maxWait = max(d, 0) }
}

// WithLease names the concurrency lease (a job id, say) instead of a random
// one. Reserving again with a lease already held renews it, so a job that
// lost its slot keeps its place in the concurrency count.
func WithLease(id string) ReserveOption {
	return func(o *reserveOpts) { o.lease = id }
}

// Reserve books the earliest slot at which every limit allows costs and the
// bucket is not blocked, if that slot is within the max wait (and a
// concurrency lease is free). Nothing is booked otherwise: the Reservation
// says when to come back. The caller should send at SendAt, or give the slot
// back with Cancel; Wait does the former.
//
// Concurrent Reserve calls on one Bucket share a round trip to Redis: the
// first caller goes at once, and callers arriving while it is under way are
// booked together in the next script call, in arrival order.
func (b *Bucket) Reserve(ctx context.Context, costs Costs, opts ...ReserveOption) (*Reservation, error) {
	o := reserveOpts{maxWait: b.cfg.MaxWait}
	for _, opt := range opts {
		opt(&o)
	}
	if b.cfg.Concurrency > 0 && o.lease == "" {
		o.lease = newLeaseID()
	}
	if b.cfg.Concurrency == 0 {
		o.lease = ""
	}
	var res reserveRes
	var s *limitSet
	for try := 0; ; try++ {
		s = b.cur()
		req := reserveReq{maxWait: o.maxWait.Microseconds(), lease: o.lease, costs: make([]int64, len(s.params)), set: s}
		for i, l := range s.limits {
			c, err := b.cost(l, costs)
			if i >= s.n && errors.Is(err, ErrCostTooLarge) {
				// A draining limit counts what it can carry at once.
				c, err = l.Capacity(), nil
			}
			if err != nil {
				return nil, err
			}
			req.costs[i] = c
		}
		var err error
		res, err = b.batch.Do(ctx, req)
		if errors.Is(err, errLimitsChanged) && try < 3 {
			continue
		}
		if errors.Is(err, errStale) && try < 3 {
			// An operator changed the limits since this process read them.
			if err := b.Refresh(ctx, s.version); err != nil {
				return nil, fmt.Errorf("reserve %s: %w", b.name, err)
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reserve %s: %w", b.name, err)
		}
		break
	}
	out := res.out
	n := len(s.params)
	r := &Reservation{
		OK:     out[0] == 1,
		Reason: Reason(out[2]),
		Now:    time.UnixMicro(out[4]),
		bucket: b,
		set:    s,
	}
	if i := out[3]; i >= 1 && int(i) <= n {
		l := s.limits[i-1]
		r.Limit = &l
	}
	if r.OK {
		r.Delay = time.Duration(out[1]) * time.Microsecond
		r.Lease = o.lease
		r.tats = out[5:]
		slot := out[4] + out[1]
		r.sendAt, r.earliest = b.clock.toLocal(slot-res.lo), b.clock.toLocal(slot-res.hi)
	} else {
		r.RetryAfter = time.Duration(out[1]) * time.Microsecond
	}
	return r, nil
}

// reserveReq is one reservation in a shared script call.
type reserveReq struct {
	maxWait int64
	lease   string
	costs   []int64   // per limit
	set     *limitSet // the limits the costs are for
}

// reserveRes is its raw reply and the clock bounds of the call it rode in.
type reserveRes struct {
	out    []int64
	lo, hi int64
}

// runReserve books a batch of reservations in one script call.
func (b *Bucket) runReserve(ctx context.Context, calls []*script.Call[reserveReq, reserveRes]) {
	s := calls[0].Req.set
	n := len(s.params)
	args := make([]any, 0, 5+5*n+len(calls)*(2+n))
	args = append(args, script.NowArg(b.p.now), b.cfg.LeaseTTL.Microseconds(), b.cfg.Concurrency, n)
	for i, l := range s.limits {
		args = append(args, s.params[i].Interval, s.params[i].Capacity, l.Per.Microseconds(), dynField(l), s.upto[i])
	}
	args = append(args, s.changes)
	var booked []*script.Call[reserveReq, reserveRes]
	for _, c := range calls {
		if c.Req.set != s {
			// Reserved across a change of limits: Reserve tries again.
			c.Err = errLimitsChanged
			continue
		}
		booked = append(booked, c)
		args = append(args, c.Req.maxWait, c.Req.lease)
		for _, cost := range c.Req.costs {
			args = append(args, cost)
		}
	}
	fail := func(err error) {
		for _, c := range calls {
			c.Err = err
		}
	}
	calls = booked
	issued := time.Now()
	v, err := script.Run(ctx, b.p.rdb, "leaky.reserve", reserveScript, s.reserveKeys, args...)
	if err != nil {
		fail(err)
		return
	}
	received := time.Now()
	replies, ok := v.([]any)
	if !ok || len(replies) != len(calls) {
		fail(fmt.Errorf("malformed reply %v", v))
		return
	}
	var lo, hi int64
	for i, c := range calls {
		out, err := script.Ints(replies[i], -1)
		if err != nil || (len(out) != 5 && len(out) != 5+2*n) {
			c.Err = fmt.Errorf("malformed reply %v: %v", replies[i], err)
			continue
		}
		if i == 0 {
			// One "now" for the whole call: one observation of the clocks.
			lo, hi = b.clock.observe(issued, received, out[4])
		}
		if out[0] == 0 && out[2] == codeStale {
			c.Err = errStale
			continue
		}
		c.Res = reserveRes{out: out, lo: lo, hi: hi}
	}
}

func (b *Bucket) cost(l Limit, costs Costs) (int64, error) {
	if l.Cost == "" {
		return 1, nil
	}
	c := costs[l.Cost]
	if c < 0 {
		return 0, fmt.Errorf("reserve %s: cost %s %d: must not be negative", b.name, l.Cost, c)
	}
	if c > l.Capacity() {
		return 0, fmt.Errorf("reserve %s: %s %d over limit %v: %w", b.name, l.Cost, c, l, ErrCostTooLarge)
	}
	return c, nil
}

// CheckCosts reports costs that no reservation on this bucket could carry,
// so a producer can be told at enqueue time rather than at dispatch.
func (b *Bucket) CheckCosts(costs Costs) error {
	for _, l := range b.cur().current() {
		if _, err := b.cost(l, costs); err != nil {
			return err
		}
	}
	return nil
}

// Cancel gives an unused reservation back: its lease is released, and each
// limit whose state no later reservation has moved is restored. It reports
// how many limits were restored. Cancel once the slot has begun (on Redis's
// clock) only releases the lease: the send may already count in some window.
func (b *Bucket) Cancel(ctx context.Context, r *Reservation) (int, error) {
	if r == nil || !r.OK {
		return 0, nil
	}
	if r.tats == nil {
		// Adopted: booked by another script; only the lease is ours.
		r.OK = false
		if r.Lease == "" {
			return 0, nil
		}
		return 0, b.ReleaseLease(ctx, r.Lease)
	}
	s := r.set
	keys := make([]string, 0, 1+len(s.params))
	keys = append(keys, s.keys[1])
	keys = append(keys, s.keys[2:]...)
	args := []any{script.NowArg(b.p.now), r.Lease, r.Now.Add(r.Delay).UnixMicro()}
	for i, l := range s.limits {
		args = append(args, r.tats[2*i], r.tats[2*i+1], l.Per.Microseconds())
	}
	for _, p := range r.also {
		keys = append(keys, p.key)
		args = append(args, p.prev, p.next, p.per.Microseconds())
	}
	v, err := script.Run(ctx, b.p.rdb, "leaky.cancel", cancelScript, keys, args...)
	if err != nil {
		return 0, fmt.Errorf("cancel reservation on %s: %w", b.name, err)
	}
	n, _ := v.(int64)
	r.OK = false
	return int(n), nil
}

// Release ends the reservation's concurrency lease, once its send is done.
func (b *Bucket) Release(ctx context.Context, r *Reservation) error {
	if r == nil || r.Lease == "" {
		return nil
	}
	return b.ReleaseLease(ctx, r.Lease)
}

// ReleaseLease ends a concurrency lease by id. Concurrent releases on one
// Bucket share a round trip.
func (b *Bucket) ReleaseLease(ctx context.Context, lease string) error {
	if _, err := b.releases.Do(ctx, lease); err != nil {
		return fmt.Errorf("release lease on %s: %w", b.name, err)
	}
	return nil
}

// runRelease ends a batch of leases in one script call.
func (b *Bucket) runRelease(ctx context.Context, calls []*script.Call[string, struct{}]) {
	args := make([]any, len(calls))
	for i, c := range calls {
		args[i] = c.Req
	}
	_, err := script.Run(ctx, b.p.rdb, "leaky.release", releaseScript, b.leasesKey(), args...)
	for _, c := range calls {
		c.Err = err
	}
}

// ExtendLease keeps a lease for d more from now. It returns false if the
// lease already expired, in which case the holder no longer counts.
func (b *Bucket) ExtendLease(ctx context.Context, lease string, d time.Duration) (bool, error) {
	v, err := script.Run(ctx, b.p.rdb, "leaky.extend", extendScript, b.leasesKey(), script.NowArg(b.p.now), lease, d.Microseconds())
	if err != nil {
		return false, fmt.Errorf("extend lease on %s: %w", b.name, err)
	}
	return v == int64(1), nil
}

// Block holds every later reservation on the bucket, in every process,
// until d from now on Redis's clock. An existing longer block stays. The
// reason is shown by State. It returns the block's end.
func (b *Bucket) Block(ctx context.Context, d time.Duration, reason string) (time.Time, error) {
	if d <= 0 {
		return time.Time{}, fmt.Errorf("block %s: duration %v must be positive", b.name, d)
	}
	v, err := script.Run(ctx, b.p.rdb, "leaky.block", blockScript, b.blockKey(), script.NowArg(b.p.now), d.Microseconds(), reason,
		b.p.blocksChannel(), b.name)
	if err != nil {
		return time.Time{}, fmt.Errorf("block %s: %w", b.name, err)
	}
	out, err := script.Ints(v, 2)
	if err != nil {
		return time.Time{}, fmt.Errorf("block %s: %w", b.name, err)
	}
	b.p.blocks.set(b.name, out[0])
	return time.UnixMicro(out[0]), nil
}

// Unblock lifts any block at once.
func (b *Bucket) Unblock(ctx context.Context) error {
	if _, err := script.Run(ctx, b.p.rdb, "leaky.unblock", unblockScript, b.blockKey(), b.p.blocksChannel(), b.name); err != nil {
		return fmt.Errorf("unblock %s: %w", b.name, err)
	}
	b.p.blocks.set(b.name, 0)
	return nil
}

// State is a bucket's shared state at one instant.
type State struct {
	// Now is Redis's clock.
	Now time.Time
	// BlockedUntil is when the block ends; zero when not blocked.
	BlockedUntil time.Time
	// BlockReason is what Block was given.
	BlockReason string
	// InFlight counts unexpired concurrency leases.
	InFlight int64
	// Booked is, per limit, how far ahead of now slots are booked: the
	// bucket's level expressed as time.
	Booked []time.Duration
	// Limits is every limit as paced now: the configured ones in order
	// (an adaptive one at its current rate), then those the upstream
	// stated (see Learn).
	Limits []LimitState
}

// State reads the bucket without changing it.
func (b *Bucket) State(ctx context.Context) (State, error) {
	s := b.cur()
	v, err := script.Run(ctx, b.p.rdb, "leaky.state", stateScript, s.stateKeys, script.NowArg(b.p.now))
	if err != nil {
		return State{}, fmt.Errorf("state of %s: %w", b.name, err)
	}
	arr, ok := v.([]any)
	if !ok || len(arr) != 5+len(s.params) {
		return State{}, fmt.Errorf("state of %s: malformed reply %v", b.name, v)
	}
	ints := func(i int) int64 { n, _ := arr[i].(int64); return n }
	now := ints(0)
	st := State{Now: time.UnixMicro(now), InFlight: ints(3)}
	if u := ints(1); u > now {
		st.BlockedUntil = time.UnixMicro(u)
		st.BlockReason, _ = arr[2].(string)
	}
	fields := map[string]string{}
	if flat, ok := arr[4].([]any); ok {
		for i := 0; i+1 < len(flat); i += 2 {
			k, _ := flat[i].(string)
			val, _ := flat[i+1].(string)
			fields[k] = val
		}
	}
	st.Limits = b.limitStates(s, fields, now)
	for i := range s.params {
		st.Booked = append(st.Booked, time.Duration(max(0, ints(5+i)-now))*time.Microsecond)
	}
	return st, nil
}

func newLeaseID() string {
	var buf [12]byte
	rand.Read(buf[:])
	return hex.EncodeToString(buf[:])
}
