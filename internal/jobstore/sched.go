package jobstore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/keyspace"
	"github.com/shaperhq/shaper/internal/script"
	"github.com/shaperhq/shaper/leaky"
)

// QueueName is the asynq queue that holds an upstream's jobs, all lanes
// together; its name is also the hash tag of every key of the upstream.
func QueueName(upstream string) string { return "shaper." + upstream }

// WakeChannel is where enqueues announce work to sleeping workers; a
// message is the upstream's name.
func WakeChannel(prefix string) string { return keyspace.Prefix(prefix) + ":wake" }

// Space is one upstream's keys. It is a value; build it with For.
type Space struct {
	Upstream string
	Queue    string
	prefix   string
	wake     string
	our      string // P:s:{Q}:
	a        Keys
}

// For returns the space of an upstream under a key prefix ("" = default).
func For(prefix, upstream string) Space {
	p := keyspace.Prefix(prefix)
	q := QueueName(upstream)
	return Space{Upstream: upstream, Queue: q, prefix: p, wake: WakeChannel(p), our: p + ":s:{" + q + "}:", a: AsynqKeys(q)}
}

// Keys of the space.
func (s Space) vKey() string   { return s.our + "v" }
func (s Space) fKey() string   { return s.our + "f" }
func (s Space) calKey() string { return s.our + "cal" }

// SleepKey is the hash whose field "sleep" says a worker sleeps, waiting
// for a wake-up on WakeChannel.
func (s Space) SleepKey() string { return s.vKey() }

func (s Space) CountsKey() string { return s.our + "c" }
func (s Space) parkedKey() string { return s.our + "pk" }

// PausedKey is asynq's mark of a paused queue (Inspector.PauseQueue): its
// value is when it was paused, in Unix seconds. A take gives no job while
// it exists.
func (s Space) PausedKey() string  { return s.a.Paused() }
func (s Space) BacklogKey() string { return s.our + "pb" }

// GoneKey is the upstream's tombstones of finished jobs no longer kept
// (see Tombstones).
func (s Space) GoneKey() string { return s.our + "gone" }

// RememberKey indexes the upstream's records of idempotency keys whose
// jobs are no longer kept (see Remembered); its buckets are
// named after it.
func (s Space) RememberKey() string { return s.our + "ik" }

// SecretsKey is the side key of job id's sensitive headers, named by the
// nonce the job carries (so an idempotent repeat that finds the first job
// deletes only its own); it shares the queue's slot.
func (s Space) SecretsKey(id, nonce string) string {
	return s.prefix + ":secrets:{" + s.Queue + "}:" + id + ":" + nonce
}

// CancelKey marks job id cancelled: it outlives the job's archiving, so
// whoever drops the job later still records it as cancelled, not dead
// (Remembered.CancelPrefix), and goes with the job as a side key.
func (s Space) CancelKey(id string) string { return s.cancelPrefix() + id }

func (s Space) cancelPrefix() string { return s.prefix + ":cancelled:{" + s.Queue + "}:" }

func (s Space) TaskKey(id string) string {
	return s.a.Task(id)
}
func (s Space) taskPrefix() string  { return s.a.TaskPrefix() }
func (s Space) groupPrefix() string { return s.a.Group("") }

// Entry is a job as the ready structure sees it.
type Entry struct {
	ID   string
	Lane string
	// FairKey is what fair share divides by (a tenant, a partition, or
	// "" for none), fixed when the job is enqueued.
	FairKey   string
	Partition string
	Costs     map[string]int64
	// Msg is the job's asynq task message, encoded.
	Msg []byte
	// ProcessAt delays the job; zero or past means ready now.
	ProcessAt time.Time
	// Remember, for a job whose ID is an idempotency key's, is the
	// upstream's RememberKey: an enqueue that finds a record there of
	// the job having finished and been dropped stores nothing (see
	// Enqueued.Final). "" checks none.
	Remember string
	// Callback: the job has a callback_url, whose delivery the script
	// that makes the job final records (see CallbacksDueKey).
	Callback bool
}

// Enqueued is what an enqueue did.
type Enqueued struct {
	// Created: the job was stored. False when a job with its ID exists,
	// or Final is set.
	Created bool
	// Held: stored ready but held back at once (see EnqueueChecked).
	Held bool
	// Final, when not 0, is the recorded final state of the job this ID
	// named, finished and no longer kept: 's' succeeded, 'd' dead, 'c'
	// cancelled.
	Final byte
}

// FairKey is the fairness key of a job of tenant with partition under u's
// fairness setting.
func FairKey(u shaper.Upstream, tenant, partition string) string {
	switch u.Fairness.By {
	case shaper.FairByNone:
		return ""
	case shaper.FairByPartition:
		return partition
	default:
		return tenant
	}
}

// EncodeCosts writes costs as the scripts read them: "name=n,...", sorted.
func EncodeCosts(c map[string]int64) string {
	names := make([]string, 0, len(c))
	for k := range c {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	for i, k := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(strconv.FormatInt(max(c[k], 0), 10))
	}
	return b.String()
}

// Enqueue stores e and makes it ready (or scheduled). created is false,
// with nothing changed, if a job with e.ID exists. rdb may be a pipeline
// or an autopipeliner.
func (s Space) Enqueue(ctx context.Context, rdb redis.Scripter, e Entry) (created bool, err error) {
	n, err := s.enqueue(ctx, rdb, e, "", "")
	return n != 0, err
}

// EnqueueChecked is Enqueue that also reports whether a job stored ready
// is held back at once: its upstream blocked (blockKey is the bucket's
// block hash) or paused through asynq, or its partition parked, at no
// extra round trip; and tells a job whose record (in e.Remember) says it
// finished and was dropped: then nothing is stored, in the same script, so
// concurrent repeats cannot make the job again.
func (s Space) EnqueueChecked(ctx context.Context, rdb redis.Scripter, e Entry, blockKey string) (Enqueued, error) {
	n, err := s.enqueue(ctx, rdb, e, blockKey, "")
	return enqueued(n), err
}

// EnqueueCall is one job for EnqueueInOrder: the entry, the Space of its
// upstream and its bucket's block hash (see EnqueueChecked).
type EnqueueCall struct {
	Space    Space
	Entry    Entry
	BlockKey string
}

// EnqueueInOrder is EnqueueChecked for many jobs in one pipeline, run by
// Redis in the order given: the FIFO sequence a job gets is its place in
// calls, so the jobs of a batch leave their flows in the batch's order
// (concurrent round trips could reach Redis in any order). It works on a
// Redis Cluster, each job's keys being in its upstream's slot.
func EnqueueInOrder(ctx context.Context, rdb redis.UniversalClient, calls []EnqueueCall) ([]Enqueued, []error) {
	invs := make([]script.Invocation, len(calls))
	for i, c := range calls {
		keys, args := c.Space.enqueueInvocation(c.Entry, c.BlockKey, "")
		invs[i] = script.Invocation{Keys: keys, Args: args}
	}
	vals, errs := script.RunInOrder(ctx, rdb, "jobstore.enqueue", enqueueScript, invs)
	out := make([]Enqueued, len(calls))
	for i, v := range vals {
		n, _ := v.(int64)
		out[i] = enqueued(n)
	}
	return out, errs
}

// enqueued reads the enqueue script's reply.
func enqueued(n int64) Enqueued {
	switch n {
	case 1, 2:
		return Enqueued{Created: true}
	case 3:
		return Enqueued{Created: true, Held: true}
	case 4:
		return Enqueued{Final: 's'}
	case 5:
		return Enqueued{Final: 'd'}
	case 6:
		return Enqueued{Final: 'c'}
	}
	return Enqueued{}
}

// enqueueInvocation is the enqueue script's keys and arguments for e; now
// overrides Redis's clock (µs, "" for TIME), for the model test.
func (s Space) enqueueInvocation(e Entry, blockKey, now string) ([]string, []any) {
	at := ""
	if !e.ProcessAt.IsZero() {
		at = Score(e.ProcessAt)
	}
	keys := []string{s.TaskKey(e.ID), s.vKey(), s.fKey(), s.calKey(), s.CountsKey(), s.BacklogKey(),
		s.a.Scheduled(), s.a.Groups()}
	if blockKey != "" {
		keys = append(keys, blockKey, s.PausedKey())
	}
	return keys, []any{now, e.Msg, e.Lane, e.FairKey, e.Partition, EncodeCosts(e.Costs), at,
		s.our, s.groupPrefix(), s.taskPrefix(), s.wake, s.Upstream, e.Remember, e.callbackArg(s)}
}

// enqueue runs the enqueue script; now is as for enqueueInvocation.
func (s Space) enqueue(ctx context.Context, rdb redis.Scripter, e Entry, blockKey, now string) (int64, error) {
	keys, args := s.enqueueInvocation(e, blockKey, now)
	v, err := script.Run(ctx, rdb, "jobstore.enqueue", enqueueScript, keys, args...)
	if err != nil {
		return 0, err
	}
	n, _ := v.(int64)
	return n, nil
}

// Requeue puts active jobs that were never sent back at the head of their
// flows and wakes the workers. conc is the upstream bucket's concurrency
// lease set. It returns how many were still active.
func (s Space) Requeue(ctx context.Context, rdb redis.Scripter, concLeases string, ids ...string) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	keys := []string{s.vKey(), s.fKey(), s.calKey(), s.CountsKey(), s.a.Active(),
		s.a.Lease(), s.a.Groups(), concLeases}
	args := []any{s.our, s.groupPrefix(), s.taskPrefix(), s.wake, s.Upstream}
	for _, id := range ids {
		args = append(args, id)
	}
	v, err := script.Run(ctx, rdb, "jobstore.requeue", requeueScript, keys, args...)
	if err != nil {
		return 0, err
	}
	n, _ := v.(int64)
	return int(n), nil
}

// ErrNotWaiting is returned by Cancel for a job that is not waiting: it is
// being sent or has finished. The job's state is in the error.
var ErrNotWaiting = errors.New("job is not waiting")

// Cancel moves a waiting job (ready, scheduled or retrying) to asynq's
// archive, out of every structure that would dispatch it, and announces
// it on FinalChannel. It returns redis.Nil if there is no such job.
func (s Space) Cancel(ctx context.Context, rdb redis.Scripter, id string) error {
	keys := []string{s.TaskKey(id), s.CountsKey(), s.BacklogKey(), s.a.Scheduled(),
		s.a.Retry(), s.a.Archived(), s.a.Groups(), s.CallbacksDueKey()}
	v, err := script.Run(ctx, rdb, "jobstore.cancel", cancelScript, keys, "", s.groupPrefix(), id, FinalChannel(s.prefix))
	if err != nil {
		return err
	}
	switch st, _ := v.(string); st {
	case "":
		return redis.Nil
	case "aggregating", "scheduled", "retry":
		return nil
	default:
		return fmt.Errorf("%w: it is %s", ErrNotWaiting, st)
	}
}

// RunNow makes retrying jobs ready at once and wakes the workers; it
// returns how many it moved.
func (s Space) RunNow(ctx context.Context, rdb redis.Scripter, ids ...string) (int, error) {
	args := []any{"", s.our, s.groupPrefix(), s.taskPrefix(), s.wake, s.Upstream}
	for _, id := range ids {
		args = append(args, id)
	}
	keys := []string{s.vKey(), s.fKey(), s.calKey(), s.CountsKey(), s.a.Retry(), s.a.Groups()}
	v, err := script.Run(ctx, rdb, "jobstore.run_now", runNowScript, keys, args...)
	if err != nil {
		return 0, err
	}
	n, _ := v.(int64)
	return int(n), nil
}

// Counts are jobs by state and lane.
type Counts map[string]map[string]int64 // lane -> state -> n

// ReadCounts reads the per-lane counts (one HGETALL).
func (s Space) ReadCounts(ctx context.Context, rdb redis.Cmdable) (Counts, error) {
	m, err := rdb.HGetAll(ctx, s.CountsKey()).Result()
	if err != nil {
		return nil, err
	}
	out := Counts{}
	for f, v := range m {
		state, lane, ok := strings.Cut(f, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		if out[lane] == nil {
			out[lane] = map[string]int64{}
		}
		out[lane][state] = n
	}
	return out, nil
}

// PartitionBacklog is a partition and its jobs not yet finished.
type PartitionBacklog struct {
	Partition string `json:"partition"`
	Backlog   int64  `json:"backlog"`
}

// Partitions reads how many partitions have backlog and the top n of them.
func (s Space) Partitions(ctx context.Context, rdb redis.Cmdable, n int) (int64, []PartitionBacklog, error) {
	pipe := rdb.Pipeline()
	card := pipe.ZCard(ctx, s.BacklogKey())
	top := pipe.ZRevRangeWithScores(ctx, s.BacklogKey(), 0, int64(n-1))
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, nil, err
	}
	var out []PartitionBacklog
	for _, z := range top.Val() {
		m, _ := z.Member.(string)
		out = append(out, PartitionBacklog{Partition: m, Backlog: int64(z.Score)})
	}
	return card.Val(), out, nil
}

// PausedPoll is how often a worker looks again at a queue paused through
// asynq (Inspector.PauseQueue): asynq's unpause deletes a key and
// announces nothing, so a take answers such a queue with this wait.
const PausedPoll = time.Second

// Taker takes ready jobs of one upstream, booking their slots on its
// bucket. Build it with NewTaker.
//
// Order: fair share between fairness keys (tenants, or partitions), then
// lanes by weight within a key's share, then the partition that can send
// earliest, then the oldest job. A partition whose own limits keep it
// from sending soon is parked, costing no worker, until its next slot.
type Taker struct {
	s      Space
	rdb    redis.Scripter
	bucket *leaky.Bucket
	cfg    TakerConfig
	conc   bool
	leaseS int64
	lookUs int64
	// args are the keys and ARGV of the bucket's limits as last seen:
	// built again when an operator's change of limits reaches the bucket
	// (leaky.Bucket.BookingVersion).
	args atomic.Pointer[takeArgs]
	// A take looks at everything (the due sets, what comes due next, the
	// leases) unless the last one gave all it asked for (lastFull) and
	// one looked less than fullLookEvery ago (lookAt, Unix ns): then it
	// leaves the due sets alone, and, if it too comes back full, what
	// comes due next and the leases (its caller comes straight back).
	lastFull  atomic.Bool
	lookAt    atomic.Int64
	lookEvery time.Duration // fullLookEvery but in tests
}

// fullLookEvery is how often at least a replica's takes of an upstream
// look at its due sets and leases while each take gives all it asked for:
// a scheduled or retrying job that comes due then joins its flow up to
// this late, and a lapsed lease is found up to this late.
const fullLookEvery = 100 * time.Millisecond

type takeArgs struct {
	keys    []string
	fixed   []any // ARGV after max jobs, lookahead and the look
	version uint64
}

// TakerConfig shapes a Taker.
type TakerConfig struct {
	// Upstream, with defaults filled in.
	Upstream shaper.Upstream
	// Bucket is the upstream's bucket, named QueueName(upstream).
	Bucket *leaky.Bucket
	// Lookahead is how far ahead of now a slot may be booked.
	Lookahead time.Duration
	// Lease is asynq's lease on an active job; the holder extends it.
	Lease time.Duration
	// ConcurrencyLease is how long a concurrency lease outlives its slot.
	ConcurrencyLease time.Duration
}

// NewTaker prepares the arguments every take sends.
func NewTaker(rdb redis.Scripter, s Space, cfg TakerConfig) (*Taker, error) {
	u := cfg.Upstream
	t := &Taker{s: s, rdb: rdb, bucket: cfg.Bucket, cfg: cfg, lookEvery: fullLookEvery, leaseS: int64(cfg.Lease / time.Second),
		lookUs: cfg.Lookahead.Microseconds(), conc: u.Concurrency > 0}
	a, err := t.build()
	if err != nil {
		return nil, err
	}
	t.args.Store(a)
	return t, nil
}

// build makes the keys and ARGV of a take under the bucket's limits now.
func (t *Taker) build() (*takeArgs, error) {
	s, cfg, u := t.s, t.cfg, t.cfg.Upstream
	plan := cfg.Bucket.Plan(cfg.ConcurrencyLease)
	bk, ba, version := plan.Keys, plan.Args, plan.Version()
	// The take names every other key it uses from the prefixes: our
	// own, and asynq's of the queue (Keys.Prefix); the bucket's, from its
	// own (leaky.Bucket.BookingArgs).
	keys := append([]string{s.fKey()}, bk...)
	f := []any{t.leaseS, s.our, s.a.Prefix()}
	f = append(f, ba...)
	// Partition limits, overrides, weights and lanes other than 1 follow
	// unless there are none of them at all, the common case: every
	// argument costs Redis as much as a small command's share of a call.
	var opt []any
	plimits := func(ls []leaky.Limit) error {
		args, err := cfg.Bucket.PartitionArgs(ls)
		opt = append(opt, args...)
		return err
	}
	if err := plimits(u.PartitionLimits); err != nil {
		return nil, fmt.Errorf("partition_limits: %w", err)
	}
	names := make([]string, 0, len(u.PartitionOverrides))
	for p, ls := range u.PartitionOverrides {
		// An empty override means the partition limits, as
		// shaper.Upstream.PartitionLimitsFor reads it.
		if len(ls) > 0 {
			names = append(names, p)
		}
	}
	sort.Strings(names)
	opt = append(opt, len(names))
	for _, p := range names {
		opt = append(opt, p)
		if err := plimits(u.PartitionOverrides[p]); err != nil {
			return nil, fmt.Errorf("partition_overrides[%s]: %w", p, err)
		}
	}
	// weighted appends the weights other than 1 (others weigh 1), or all
	// of them (all: the take keeps lanes' virtual times, see take.lua),
	// and says how many.
	weighted := func(m map[string]int, all bool) int {
		var ks []string
		for _, k := range sortedKeys(m) {
			if all || max(m[k], 1) != 1 {
				ks = append(ks, k)
			}
		}
		opt = append(opt, len(ks))
		for _, k := range ks {
			opt = append(opt, k, max(m[k], 1))
		}
		return len(ks)
	}
	nw, nl := weighted(u.Fairness.Weights, false),
		weighted(u.Lanes, len(u.Lanes) > 1 && (u.HasPartitionLimits() || cfg.Bucket.HasPartitionOverrides()))
	if len(u.PartitionLimits) > 0 || len(names) > 0 || nw > 0 || nl > 0 {
		f = append(f, opt...)
	}
	return &takeArgs{keys: keys, fixed: f, version: version}, nil
}

// current is the take's keys and ARGV under the bucket's limits now.
func (t *Taker) current() (*takeArgs, error) {
	a := t.args.Load()
	if a.version == t.bucket.BookingVersion() {
		return a, nil
	}
	a, err := t.build()
	if err != nil {
		return nil, err
	}
	t.args.Store(a)
	return a, nil
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Taken is a job taken for sending, with its booked slot.
type Taken struct {
	ID  string
	Msg []byte
	// Slot is the reservation to send under: Wait for it, then send, then
	// Release it.
	Slot *leaky.Reservation
}

// Take is the answer of one take.
type Take struct {
	Jobs []Taken
	// Wait, when positive, is how long until the upstream itself can send
	// again (a limit, a block, the concurrency cap: Reason).
	Wait   time.Duration
	Reason leaky.Reason
	// Next, when positive, is when something else comes due: a scheduled
	// or retrying job, a parked partition, an active job's lease; or 1µs
	// when the take stopped at its bound on work per call before looking
	// at every flow, so the caller takes again at once.
	Next time.Duration
	// Expired reports active jobs whose lease ran out: recover them.
	// (A take that gives all it was asked for may leave Next and Expired
	// out: see fullLookEvery.)
	Expired bool
	// Now is Redis's clock when the take was decided.
	Now time.Time
}

// Take takes up to n ready jobs.
func (t *Taker) Take(ctx context.Context, n int) (Take, error) { return t.take(ctx, n, "") }

// take is Take with clock overriding Redis's clock (µs, "" for TIME), for
// the model test.
func (t *Taker) take(ctx context.Context, n int, clock string) (Take, error) {
	ta, err := t.current()
	if err != nil {
		return Take{}, err
	}
	look := "1"
	if clock == "" && t.lastFull.Load() && time.Now().UnixNano() < t.lookAt.Load() {
		look = "0"
	} else {
		t.lookAt.Store(time.Now().Add(t.lookEvery).UnixNano())
	}
	args := make([]any, 0, 4+len(ta.fixed))
	args = append(args, clock, n, t.lookUs, look)
	args = append(args, ta.fixed...)
	issued := time.Now()
	v, err := script.Run(ctx, t.rdb, "jobstore.take", takeScript, ta.keys, args...)
	if err != nil {
		return Take{}, err
	}
	received := time.Now()
	arr, ok := v.([]any)
	if !ok || len(arr) < 5 || (len(arr)-5)%3 != 0 {
		return Take{}, fmt.Errorf("script jobstore.take: malformed reply %v", v)
	}
	ints := func(i int) int64 { n, _ := arr[i].(int64); return n }
	now := ints(0)
	out := Take{Reason: leaky.Reason(ints(2)), Expired: ints(4) == 1, Now: time.UnixMicro(now)}
	if w := ints(1); w >= 0 {
		out.Wait = time.Duration(w) * time.Microsecond
		if out.Wait == 0 {
			out.Wait = time.Microsecond
		}
	}
	if nx := ints(3); nx >= 0 {
		out.Next = max(time.Duration(nx)*time.Microsecond, time.Microsecond)
	}
	t.lastFull.Store((len(arr)-5)/3 == n)
	for i := 5; i < len(arr); i += 3 {
		id, _ := arr[i].(string)
		msg, _ := arr[i+1].(string)
		delay := ints(i + 2)
		lease := ""
		if t.conc {
			lease = id
		}
		out.Jobs = append(out.Jobs, Taken{ID: id, Msg: []byte(msg), Slot: t.bucket.Adopt(now, delay, lease, issued, received)})
	}
	if out.Reason == leaky.ReasonStale {
		// An operator changed the limits since this process read them, and
		// the take booked nothing under the old ones: read them, take again.
		if err := t.bucket.Refresh(ctx, ta.version); err != nil {
			return Take{}, err
		}
		if t.bucket.BookingVersion() != ta.version && len(out.Jobs) == 0 {
			return t.take(ctx, n, clock)
		}
		out.Wait = min(out.Wait, 10*time.Millisecond)
	}
	return out, nil
}

// Hold is what keeps an upstream's waiting jobs from being taken, read at
// one instant on Redis's clock.
type Hold struct {
	// Now is Redis's clock.
	Now time.Time
	// BlockedUntil is when the bucket's block (a pause or a pushback)
	// ends; zero when none is in force. BlockReason is what it was given.
	BlockedUntil time.Time
	BlockReason  string
	// AsynqPaused: the queue is paused through asynq's PauseQueue, since
	// PausedSince (zero if asynq's mark holds no time).
	AsynqPaused bool
	PausedSince time.Time
}

func (h *Hold) read(now int64, until any, reason any, paused any) {
	h.Now = time.UnixMicro(now)
	if u, _ := until.(int64); u > now {
		h.BlockedUntil = time.UnixMicro(u)
		h.BlockReason, _ = reason.(string)
	}
	if p, ok := paused.(string); ok {
		h.AsynqPaused = true
		if sec, err := strconv.ParseInt(p, 10, 64); err == nil && sec > 0 {
			h.PausedSince = time.Unix(sec, 0)
		}
	}
}

// JobHold is what keeps one job from being taken.
type JobHold struct {
	Hold
	// State is the job's state in asynq's task hash ("" if there is none).
	State string
	// ParkedUntil, for a job waiting in its flow (aggregating), is when
	// its partition may send again, if later than Now: its partition's
	// limits hold it.
	ParkedUntil time.Time
	// Deferred: the job's last end was a hand-back (a 429), not a failed
	// attempt; in asynq's retry set (State "retry") it waits, spending no
	// attempt, for WaitsFor ("" for nothing named).
	Deferred bool
	WaitsFor string
}

// ReadJobHold reads what keeps job id from being taken now; blockKey is
// the upstream bucket's block hash (leaky.Pacer.BlockKey).
func (s Space) ReadJobHold(ctx context.Context, rdb redis.Scripter, blockKey, id string) (JobHold, error) {
	v, err := script.Run(ctx, rdb, "jobstore.job_hold", jobHoldScript, []string{s.TaskKey(id), blockKey, s.PausedKey()}, "", s.our)
	if err != nil {
		return JobHold{}, err
	}
	arr, ok := v.([]any)
	if !ok || len(arr) != 7 {
		return JobHold{}, fmt.Errorf("script jobstore.job_hold: malformed reply %v", v)
	}
	var h JobHold
	now, _ := arr[0].(int64)
	h.read(now, arr[2], arr[3], arr[4])
	h.State, _ = arr[1].(string)
	if p, _ := arr[5].(int64); p > now {
		h.ParkedUntil = time.UnixMicro(p)
	}
	sd, _ := arr[6].(string)
	h.WaitsFor, h.Deferred = WaitsFor(sd)
	return h, nil
}

// maxParksCounted bounds the parked partitions one ReadHolds counts the
// jobs of, so that a status read holds Redis briefly however many
// partitions are parked.
const maxParksCounted = 5000

// Holds are an upstream's counts with what holds its waiting jobs.
type Holds struct {
	Hold
	// Counts are the per-lane counters.
	Counts Counts
	// Parked is, per lane, the jobs waiting in flows whose partition is
	// parked for its limits (not counting those of partitions beyond the
	// first maxParksCounted by park end: then Partial is true).
	Parked  map[string]int64
	Partial bool
}

// ReadHolds reads the per-lane counters and what holds the waiting jobs,
// at one instant; blockKey is as for ReadJobHold.
func (s Space) ReadHolds(ctx context.Context, rdb redis.Scripter, blockKey string) (Holds, error) {
	v, err := script.Run(ctx, rdb, "jobstore.holds", holdsScript,
		[]string{s.CountsKey(), blockKey, s.PausedKey(), s.parkedKey()}, "", s.groupPrefix(), maxParksCounted)
	if err != nil {
		return Holds{}, err
	}
	arr, ok := v.([]any)
	if !ok || len(arr) != 7 {
		return Holds{}, fmt.Errorf("script jobstore.holds: malformed reply %v", v)
	}
	var h Holds
	now, _ := arr[0].(int64)
	h.read(now, arr[1], arr[2], arr[3])
	more, _ := arr[4].(int64)
	h.Partial = more == 1
	h.Counts = Counts{}
	flat, _ := arr[5].([]any)
	for i := 0; i+1 < len(flat); i += 2 {
		f, _ := flat[i].(string)
		n, _ := strconv.ParseInt(fmt.Sprint(flat[i+1]), 10, 64)
		state, lane, ok := strings.Cut(f, ":")
		if !ok {
			continue
		}
		if h.Counts[lane] == nil {
			h.Counts[lane] = map[string]int64{}
		}
		h.Counts[lane][state] = n
	}
	h.Parked = map[string]int64{}
	flat, _ = arr[6].([]any)
	for i := 0; i+1 < len(flat); i += 2 {
		lane, _ := flat[i].(string)
		n, _ := flat[i+1].(int64)
		h.Parked[lane] = n
	}
	return h, nil
}

// FinishBounds are the bounds on the upstream's finished jobs: at most u's
// ResultMaxCount succeeded and DeadMaxCount dead or cancelled jobs, a
// cancelled job's mark deleted with it, and a tombstone for each deleted
// job, so that reading it can tell it finished. Tombstones are bounded too:
// as many as the jobs kept (so they cost a small fraction of them), for
// the longer retention. A job whose ID matches idempotent (the Lua pattern
// of IDs made from an idempotency key) gets a record instead (see
// Remembered), kept for u's IdempotencyWindow after the drop.
func (s Space) FinishBounds(u shaper.Upstream, idempotent string) Bounds {
	u = u.WithDefaults()
	return Bounds{
		Completed: u.ResultMaxCount,
		Archived:  u.DeadMaxCount,
		Gone: Tombstones{Key: s.GoneKey(),
			Max: u.ResultMaxCount + u.DeadMaxCount, For: max(u.ResultRetention, u.DeadRetention)},
		SidePrefixes: []string{s.cancelPrefix()},
		Remember:     s.Remembered(u, idempotent),
	}
}

// Remembered are the upstream's records of idempotency keys whose jobs are
// dropped (see FinishBounds): for u's IdempotencyWindow after the drop, a
// repeat of the key finds the job's final state. They replace the job's
// tombstone; an ID not matching idempotent gets none, as no one can repeat
// it.
func (s Space) Remembered(u shaper.Upstream, idempotent string) Remembered {
	return Remembered{Key: s.RememberKey(), Window: u.IdempotencyWindow,
		Pattern: idempotent, CancelPrefix: s.cancelPrefix()}
}
