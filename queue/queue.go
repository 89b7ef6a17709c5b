package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/internal/keyspace"
	"github.com/shaperhq/shaper/leaky"
)

// Errors callers branch on.
var (
	// ErrNotFound: no such job, or not the caller's tenant's.
	ErrNotFound = errors.New("job not found")
	// ErrNoLongerKept is a job's error (beside ErrNotFound) when it finished
	// and was deleted since, past its upstream's result_max_count or
	// dead_max_count or its retention: unlike a job that never existed.
	ErrNoLongerKept = errors.New("job finished and is no longer kept")
	// ErrUnknownUpstream: the job names an upstream the config lacks.
	ErrUnknownUpstream = errors.New("unknown upstream")
	// ErrUnknownLane: the job names a lane its upstream lacks.
	ErrUnknownLane = errors.New("unknown lane")
	// ErrBacklogFull: the upstream's max_pending is reached (see BacklogFullError).
	ErrBacklogFull = errors.New("backlog full")
	// ErrNotCancellable: the job is being dispatched or already finished.
	ErrNotCancellable = errors.New("job cannot be cancelled")
)

// BacklogFullError says how full the upstream is, so the API can tell the
// producer when to come back.
type BacklogFullError struct {
	Upstream string
	Pending  int64
	Max      int64
}

func (e *BacklogFullError) Error() string {
	return fmt.Sprintf("upstream %s: backlog full (%d pending, max_pending %d)", e.Upstream, e.Pending, e.Max)
}

func (e *BacklogFullError) Unwrap() error { return ErrBacklogFull }

// Config configures a Queue.
type Config struct {
	// Upstreams are the upstreams whose jobs the queue keeps; zero fields
	// are their defaults (shaper.Upstream.WithDefaults).
	Upstreams []shaper.Upstream
	// Prefix starts shaper's own keys; default keyspace.DefaultPrefix.
	Prefix string
}

// Queue enqueues and inspects jobs. Safe for concurrent use.
type Queue struct {
	rdb redis.UniversalClient
	// bulkRdb is go-redis's autopipeliner, or rdb where it has none (a
	// Ring): EnqueueBatch's concurrent round trips share its pipelines.
	bulkRdb redis.Cmdable
	insp    *asynq.Inspector
	ups     map[string]shaper.Upstream
	prefix  string
	// blocks are the upstreams' bucket block hashes: a block holds their
	// waiting jobs (Info.WaitingFor).
	blocks map[string]string
	// finals wakes long polls (Wait) when their jobs become final.
	finals *jobstore.Finals

	mu      sync.Mutex
	backlog map[string]backlogSample
	// listed holds the upstreams whose queue this process has put in
	// asynq's set of queues, which asynq's Inspector looks a queue up in.
	listed map[string]bool
}

type backlogSample struct {
	at    time.Time
	count int64
}

// New returns a Queue on rdb; the caller owns rdb and closes it after Close.
// It refuses a binary built with an asynq whose Redis layout the store does
// not know (see CHANGELOG.md).
func New(rdb redis.UniversalClient, cfg Config) (*Queue, error) {
	if err := jobstore.CheckBuild(); err != nil {
		return nil, err
	}
	ups := map[string]shaper.Upstream{}
	for _, u := range cfg.Upstreams {
		// The one check of an upstream; the queue relies on it.
		if err := u.Validate(); err != nil {
			return nil, fmt.Errorf("queue: %w", err)
		}
		if _, dup := ups[u.Name]; dup {
			return nil, fmt.Errorf("upstream %s: configured twice", u.Name)
		}
		ups[u.Name] = u.WithDefaults()
	}
	q := &Queue{
		rdb:     rdb,
		insp:    asynq.NewInspectorFromRedisClient(rdb),
		ups:     ups,
		prefix:  keyspace.Prefix(cfg.Prefix),
		backlog: map[string]backlogSample{},
		listed:  map[string]bool{},
		blocks:  map[string]string{},
		finals:  jobstore.NewFinals(rdb, cfg.Prefix),
	}
	pacer := leaky.New(rdb, leaky.Config{Prefix: q.prefix})
	for name := range ups {
		q.blocks[name] = pacer.BlockKey(jobstore.QueueName(name))
	}
	q.bulkRdb = rdb
	// The autopipeliner belongs to rdb and stops when rdb is closed.
	if ap, err := rdb.AutoPipeline(); err == nil {
		q.bulkRdb = ap
	}
	return q, nil
}

// Close ends every Wait (see EndWaits) and releases the asynq inspector
// (not rdb).
func (q *Queue) Close() error {
	q.finals.Close()
	return q.insp.Close()
}

// Upstreams lists the upstreams, with their defaults filled in, sorted by
// name.
func (q *Queue) Upstreams() []shaper.Upstream {
	out := make([]shaper.Upstream, 0, len(q.ups))
	for _, u := range q.ups {
		out = append(out, u)
	}
	slices.SortFunc(out, func(a, b shaper.Upstream) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Upstream returns one upstream, with its defaults filled in.
func (q *Queue) Upstream(name string) (shaper.Upstream, bool) {
	u, ok := q.ups[name]
	return u, ok
}

// Info is a job with what has happened to it. A succeeded job is kept
// without its request's Body and Headers (see SucceededMessage).
type Info struct {
	Job
	State State `json:"state"`
	// WaitingFor, for a job that could otherwise go now, says what holds
	// it back: WaitingPause, WaitingPushback or WaitingLimit (its State is
	// then scheduled, and NextAttemptAt when the hold ends, if known).
	WaitingFor    string    `json:"waiting_for,omitempty"`
	Attempts      int       `json:"attempts"`
	LastError     string    `json:"last_error,omitempty"`
	NextAttemptAt time.Time `json:"next_attempt_at,omitzero"`
	LastFailedAt  time.Time `json:"last_failed_at,omitzero"`
	CompletedAt   time.Time `json:"completed_at,omitzero"`
	Response      *Response `json:"response,omitempty"`
	// Callback is the delivery of the job's callback_url, once the job is
	// final (nil before, and for a job without one).
	Callback *Callback `json:"callback,omitempty"`
}

// Prepare fills in a job's defaults and checks it against the config: the
// upstream and lane exist, the partition, if any, is valid (else it wraps
// shaper.ErrInvalid), an ID is assigned (derived from the idempotency
// key when there is one). It changes nothing in Redis.
func (q *Queue) Prepare(job *Job) error {
	u, ok := q.ups[job.Upstream]
	if !ok {
		return fmt.Errorf("upstream %q: %w", job.Upstream, ErrUnknownUpstream)
	}
	if job.Lane == "" {
		job.Lane = shaper.DefaultLane
	}
	if !u.HasLane(job.Lane) {
		return fmt.Errorf("lane %q of upstream %s (lanes: %s): %w", job.Lane, job.Upstream, strings.Join(u.LaneNames(), ", "), ErrUnknownLane)
	}
	if job.Partition != "" {
		if err := shaper.CheckPartition(job.Partition); err != nil {
			return fmt.Errorf("partition: %v: %w", err, shaper.ErrInvalid)
		}
	}
	if job.MaxAttempts <= 0 {
		job.MaxAttempts = u.Retry.MaxAttempts
	}
	if job.CreatedAt.IsZero() {
		job.CreatedAt = time.Now().UTC()
	}
	if job.ID == "" {
		if job.IdempotencyKey != "" {
			job.ID = IdempotentID(job.Tenant, job.Upstream, job.Lane, job.IdempotencyKey)
		} else {
			job.ID = NewID(job.Tenant, job.Upstream, job.Lane)
		}
	}
	if job.IdempotencyKey == "" {
		job.IdempotencyKey = job.ID
	}
	return nil
}

// Enqueue stores a job for dispatch. If a job with the same ID (the same
// idempotency key) exists, it is returned with created false and nothing
// changes; likewise, with only its ID and final State, if it finished and
// was dropped within its upstream's IdempotencyWindow. If the upstream's backlog is at max_pending it returns a
// *BacklogFullError.
func (q *Queue) Enqueue(ctx context.Context, job *Job) (*Info, bool, error) {
	return q.enqueue(ctx, job, q.rdb)
}

// Result is what became of one job of a batch (EnqueueBatch): as
// Enqueue's three results.
type Result struct {
	Info    *Info
	Created bool
	Err     error
}

// EnqueueBatch is Enqueue for many jobs at once (a batch request), in the
// order given: within a flow, jobs[i] leaves before jobs[i+1]. The work
// around each store (checks, sensitive headers, reads after a repeat) runs
// for all jobs concurrently over coalesced pipelines; the stores themselves
// go in one pipeline, in order, which Redis runs in that order.
func (q *Queue) EnqueueBatch(ctx context.Context, jobs []*Job) []Result {
	out := make([]Result, len(jobs))
	preps := make([]*prepared, len(jobs))
	each(len(jobs), func(i int) {
		preps[i], out[i].Err = q.prepare(ctx, jobs[i], q.bulkRdb)
	})
	var calls []jobstore.EnqueueCall
	var at []int
	for i, p := range preps {
		if p != nil {
			calls = append(calls, p.call)
			at = append(at, i)
		}
	}
	if len(calls) == 0 {
		return out
	}
	rs, errs := jobstore.EnqueueInOrder(ctx, q.rdb, calls)
	each(len(at), func(k int) {
		i := at[k]
		out[i].Info, out[i].Created, out[i].Err = q.stored(ctx, jobs[i], preps[i], rs[k], errs[k])
	})
	return out
}

// batchParallel bounds the goroutines of one EnqueueBatch phase.
const batchParallel = 32

// each runs f(0)…f(n-1), batchParallel at a time, and waits for them.
func each(n int, f func(i int)) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, batchParallel)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			f(i)
		}()
	}
	wg.Wait()
}

func (q *Queue) enqueue(ctx context.Context, job *Job, rdb redis.Cmdable) (*Info, bool, error) {
	p, err := q.prepare(ctx, job, rdb)
	if err != nil {
		return nil, false, err
	}
	r, err := p.call.Space.EnqueueChecked(ctx, rdb, p.call.Entry, p.call.BlockKey)
	return q.stored(ctx, job, p, r, err)
}

// prepared is a job ready for the enqueue script: its sensitive headers are
// already in their side key.
type prepared struct {
	call   jobstore.EnqueueCall
	stored Job
	secret map[string]string
}

// prepare checks job, fills in its defaults, checks its upstream's backlog
// and stores its sensitive headers apart: everything before the enqueue
// script.
func (q *Queue) prepare(ctx context.Context, job *Job, rdb redis.Cmdable) (*prepared, error) {
	if err := q.Prepare(job); err != nil {
		return nil, err
	}
	u := q.ups[job.Upstream]
	if err := q.checkBacklog(ctx, job.Upstream, u); err != nil {
		return nil, err
	}
	stored, secret := splitSecrets(job, u)
	payload, err := EncodeJob(&stored)
	if err != nil {
		return nil, fmt.Errorf("encode job: %w", err)
	}
	if secret != nil {
		if err := putSecrets(ctx, rdb, q.prefix, &stored, secret, time.Now()); err != nil {
			return nil, fmt.Errorf("enqueue %s: store sensitive headers: %w", job.ID, err)
		}
	}
	if err := q.list(ctx, rdb, job.Upstream); err != nil {
		return nil, fmt.Errorf("enqueue %s: %w", job.ID, err)
	}
	space := jobstore.For(q.prefix, job.Upstream)
	fk := jobstore.FairKey(u, job.Tenant, job.Partition)
	msg := &jobstore.Message{
		Type: TaskType, Payload: payload, ID: job.ID, Queue: space.Queue,
		Retry: int32(job.MaxAttempts), // see "Attempts are counted" (protocol.go)
		// Waits for the upstream happen before a job is taken; the
		// upstream's own timeout bounds each request.
		Timeout:   int64((24 * time.Hour).Seconds()),
		Retention: int64(u.ResultRetention.Seconds()),
		GroupKey:  job.Lane + "|" + fk + "|" + job.Partition,
	}
	entry := jobstore.Entry{
		ID: job.ID, Lane: job.Lane, FairKey: fk, Partition: job.Partition, Costs: job.Cost,
		Msg: msg.Marshal(), ProcessAt: job.NotBefore, Callback: job.CallbackURL != "",
	}
	if IsIdempotentID(job.ID) {
		entry.Remember = remembered(q.prefix, u).RecallArg()
	}
	return &prepared{call: jobstore.EnqueueCall{Space: space, Entry: entry, BlockKey: q.blocks[job.Upstream]},
		stored: stored, secret: secret}, nil
}

// stored makes Enqueue's results from the enqueue script's reply r (or
// its error) for the job p prepared.
func (q *Queue) stored(ctx context.Context, job *Job, p *prepared, r jobstore.Enqueued, err error) (*Info, bool, error) {
	created, held := r.Created, r.Held
	if err == nil && !created && p.secret != nil {
		// The repeat found the first job, which has its own side key: this
		// one names no task. (After an error the task may or may not
		// exist, so the key is left to its TTL rather than risk a job that
		// cannot be sent.) The TTL also covers a failed delete.
		DeleteSecrets(context.WithoutCancel(ctx), q.rdb, q.prefix, &p.stored)
	}
	u := q.ups[job.Upstream]
	switch {
	case err != nil:
		return nil, false, fmt.Errorf("enqueue %s: %w", job.ID, err)
	case r.Final != 0:
		return droppedInfo(job, r.Final), false, nil
	case !created:
		info, gerr := q.Get(ctx, job.ID, job.Tenant)
		if errors.Is(gerr, ErrNoLongerKept) && IsIdempotentID(job.ID) {
			// Dropped between the enqueue and this read: its record
			// says how it ended.
			final, rerr := remembered(q.prefix, u).Recall(ctx, q.rdb, job.ID)
			if rerr == nil && final != 0 {
				return droppedInfo(job, final), false, nil
			}
		}
		if gerr != nil {
			return nil, false, fmt.Errorf("enqueue %s: exists, but: %w", job.ID, gerr)
		}
		return info, false, nil
	}
	q.noteEnqueued(job.Upstream)
	info := &Info{Job: p.stored, State: StateQueued}
	if !job.NotBefore.IsZero() && job.NotBefore.After(time.Now()) {
		info.State, info.NextAttemptAt = StateScheduled, job.NotBefore
	}
	if held {
		// Rare (a pause, a pushback, a parked partition): say by what, as
		// GET would, at the cost of a read.
		if err := q.describeWait(ctx, info); err != nil {
			info.State = StateScheduled
		}
	}
	return info, true, nil
}

// droppedInfo is what is left of job, finished as letter says and no
// longer kept, its idempotency key still remembered: its id and final
// state.
func droppedInfo(job *Job, letter byte) *Info {
	return &Info{Job: Job{ID: job.ID, Tenant: job.Tenant, Upstream: job.Upstream, Lane: job.Lane,
		Partition: job.Partition, IdempotencyKey: job.IdempotencyKey}, State: finalState(letter)}
}

// finalState is the State of a record's letter (see jobstore.Remembered).
func finalState(letter byte) State {
	switch letter {
	case 's':
		return StateSucceeded
	case 'c':
		return StateCancelled
	}
	return StateDead
}

// list puts an upstream's queue in asynq's set of queues, once per
// process (a set member has no TTL to renew, and the set lives in another
// Redis Cluster slot than the queue, so the enqueue script cannot do it).
func (q *Queue) list(ctx context.Context, rdb redis.Cmdable, upstream string) error {
	q.mu.Lock()
	done := q.listed[upstream]
	q.mu.Unlock()
	if done {
		return nil
	}
	if err := rdb.SAdd(ctx, jobstore.AllQueues, jobstore.QueueName(upstream)).Err(); err != nil {
		return fmt.Errorf("list queue: %w", err)
	}
	q.mu.Lock()
	q.listed[upstream] = true
	q.mu.Unlock()
	return nil
}

// backlogFresh is how long a backlog count may be trusted while the
// upstream is far from its max_pending; near it, every enqueue counts afresh.
const (
	backlogFresh  = 250 * time.Millisecond
	backlogMargin = 0.9
)

// checkBacklog refuses an enqueue at max_pending. The count is read from
// asynq's queue keys; while it is well below the bound a recent count plus
// this process's own enqueues since stands in for it, so most enqueues cost
// no extra round trip. Concurrent producers can overshoot the bound by the
// enqueues in flight at once; it bounds memory, not a rate.
func (q *Queue) checkBacklog(ctx context.Context, upstream string, u shaper.Upstream) error {
	if u.MaxPending <= 0 {
		return nil
	}
	q.mu.Lock()
	s, ok := q.backlog[upstream]
	q.mu.Unlock()
	if ok && time.Since(s.at) < backlogFresh && float64(s.count) < backlogMargin*float64(u.MaxPending) {
		return nil
	}
	n, err := q.pendingCount(ctx, upstream)
	if err != nil {
		return err
	}
	q.mu.Lock()
	q.backlog[upstream] = backlogSample{at: time.Now(), count: n}
	q.mu.Unlock()
	if n >= u.MaxPending {
		return &BacklogFullError{Upstream: upstream, Pending: n, Max: u.MaxPending}
	}
	return nil
}

func (q *Queue) noteEnqueued(upstream string) {
	q.mu.Lock()
	if s, ok := q.backlog[upstream]; ok {
		s.count++
		q.backlog[upstream] = s
	}
	q.mu.Unlock()
}

// LaneCounts are one lane's jobs by state, as GET /v1/jobs/{id} would
// show each of them (Info.State).
type LaneCounts struct {
	// Pending: queued, free to go in their turn.
	Pending int64 `json:"pending"`
	// Scheduled: delayed by not_before, or held back (WaitingFor).
	Scheduled int64 `json:"scheduled"`
	// Retry: waiting to try again after a failed attempt.
	Retry     int64 `json:"retry"`
	Active    int64 `json:"active"`
	Dead      int64 `json:"dead"`
	Succeeded int64 `json:"succeeded"`
	// WaitingFor splits the held among Scheduled by what holds them
	// ("pause", "pushback", "limit"); absent when none is.
	WaitingFor map[string]int64 `json:"waiting_for,omitempty"`
}

// Backlog is the jobs not yet finished: pending, scheduled, retrying and
// active.
func (c LaneCounts) Backlog() int64 { return c.Pending + c.Scheduled + c.Retry + c.Active }

func (c *LaneCounts) hold(what string, n int64) {
	if n <= 0 {
		return
	}
	if c.WaitingFor == nil {
		c.WaitingFor = map[string]int64{}
	}
	c.WaitingFor[what] += n
	c.Scheduled += n
}

// Held is an upstream's jobs by lane, with what holds the waiting ones.
type Held struct {
	Lanes map[string]LaneCounts
	// AsynqPaused: the upstream's queue is paused through asynq's
	// PauseQueue, since PausedSince (zero if asynq's mark holds no time).
	// Workers take nothing from it until it is unpaused or resumed.
	AsynqPaused bool
	PausedSince time.Time
	// BlockedUntil and BlockReason are the upstream's block, as read with
	// the counts: a pause or a pushback (BlockWaitsFor).
	BlockedUntil time.Time
	BlockReason  string
	// LimitPartial: more partitions were parked than one read counts the
	// jobs of (5,000), so some jobs held by their limit count as pending.
	LimitPartial bool
}

// Counts reads every lane's counts for an upstream; see ReadHeld.
func (q *Queue) Counts(ctx context.Context, upstream string) (map[string]LaneCounts, error) {
	h, err := q.ReadHeld(ctx, upstream)
	if err != nil {
		return nil, err
	}
	return h.Lanes, nil
}

// ReadHeld reads every lane's counts for an upstream in one round trip,
// from counters that every change of a job's state keeps in the same
// script, with what holds the waiting jobs at that instant: while the
// upstream is paused or blocked, every job waiting its turn or handed
// back is scheduled and waiting for the pause or the pushback; otherwise
// jobs whose partition is parked wait for their limit, and jobs handed
// back after a 429 for that pushback.
func (q *Queue) ReadHeld(ctx context.Context, upstream string) (Held, error) {
	u, ok := q.ups[upstream]
	if !ok {
		return Held{}, fmt.Errorf("upstream %q: %w", upstream, ErrUnknownUpstream)
	}
	h, err := jobstore.For(q.prefix, upstream).ReadHolds(ctx, q.rdb, q.blocks[upstream])
	if err != nil {
		return Held{}, fmt.Errorf("count jobs of %s: %w", upstream, err)
	}
	out := Held{Lanes: map[string]LaneCounts{}, AsynqPaused: h.AsynqPaused, PausedSince: h.PausedSince,
		BlockedUntil: h.BlockedUntil, BlockReason: h.BlockReason, LimitPartial: h.Partial}
	for _, lane := range u.LaneNames() {
		out.Lanes[lane] = LaneCounts{}
	}
	all := holdOf(h.Hold)
	for lane, m := range h.Counts {
		c := LaneCounts{
			Pending: m["pending"], Scheduled: m["scheduled"], Retry: m["retry"],
			Active: m["active"], Dead: m["dead"], Succeeded: m["succeeded"],
		}
		deferred := m["deferred"]
		if all != "" {
			c.hold(all, c.Pending+deferred)
			c.Pending = 0
		} else {
			parked := min(h.Parked[lane], c.Pending)
			c.hold(WaitingLimit, parked)
			c.Pending -= parked
			c.hold(WaitingPushback, deferred)
		}
		out.Lanes[lane] = c
	}
	return out, nil
}

// holdOf is what holds every waiting job of an upstream: asynq's pause or
// the bucket's block; "" for neither.
func holdOf(h jobstore.Hold) string {
	switch {
	case h.AsynqPaused:
		return WaitingPause
	case !h.BlockedUntil.IsZero():
		return BlockWaitsFor(h.BlockReason)
	}
	return ""
}

// Partitions reads how many partitions of an upstream have jobs not yet
// finished, and the top n of them by that count.
func (q *Queue) Partitions(ctx context.Context, upstream string, n int) (int64, []jobstore.PartitionBacklog, error) {
	if _, ok := q.ups[upstream]; !ok {
		return 0, nil, fmt.Errorf("upstream %q: %w", upstream, ErrUnknownUpstream)
	}
	return jobstore.For(q.prefix, upstream).Partitions(ctx, q.rdb, n)
}

// pendingCount is an upstream's jobs not yet finished, from the counters
// alone (one HGETALL: it runs on enqueues near max_pending).
func (q *Queue) pendingCount(ctx context.Context, upstream string) (int64, error) {
	if _, ok := q.ups[upstream]; !ok {
		return 0, fmt.Errorf("upstream %q: %w", upstream, ErrUnknownUpstream)
	}
	counts, err := jobstore.For(q.prefix, upstream).ReadCounts(ctx, q.rdb)
	if err != nil {
		return 0, fmt.Errorf("count jobs of %s: %w", upstream, err)
	}
	var n int64
	for _, m := range counts {
		n += m["pending"] + m["scheduled"] + m["retry"] + m["deferred"] + m["active"]
	}
	return n, nil
}

// Get reads a job. With a non-empty tenant, a job of another tenant is
// reported as not found; for an ID with a tenant tag (see NewID) that is
// decided without touching Redis.
func (q *Queue) Get(ctx context.Context, id, tenant string) (*Info, error) {
	upstream, _, err := ParseID(id)
	if err != nil {
		return nil, fmt.Errorf("%v: %w", err, ErrNotFound)
	}
	if _, ok := q.ups[upstream]; !ok {
		return nil, fmt.Errorf("job %s: %w", id, ErrNotFound)
	}
	// Before Redis: reading another tenant's job only to refuse it would
	// take as long as its payload is large, telling that it exists.
	if tenant != "" && foreignID(id, tenant) {
		return nil, fmt.Errorf("job %s: %w", id, ErrNotFound)
	}
	ti, err := q.insp.GetTaskInfo(jobstore.QueueName(upstream), id)
	if errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound) {
		// Only now, for a job not there: one read of the tombstones. A
		// tombstone names no tenant, so an ID without a tenant tag is
		// told apart only to a caller that sees every tenant.
		if _, tagged := idTag(id); !tagged && tenant != "" {
			return nil, fmt.Errorf("job %s: %w", id, ErrNotFound)
		}
		b := finishBounds(q.prefix, q.ups[upstream])
		var gone bool
		var gerr error
		if IsIdempotentID(id) {
			var final byte
			final, gerr = b.Remember.Recall(ctx, q.rdb, id)
			gone = final != 0
		} else {
			gone, gerr = b.Gone.WasDeleted(ctx, q.rdb, id)
		}
		if gerr == nil && gone {
			return nil, fmt.Errorf("job %s: %w: %w", id, ErrNotFound, ErrNoLongerKept)
		}
		return nil, fmt.Errorf("job %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get job %s: %w", id, err)
	}
	info, err := infoFromTask(ti)
	if err != nil {
		return nil, err
	}
	if tenant != "" && info.Tenant != tenant {
		return nil, fmt.Errorf("job %s: %w", id, ErrNotFound)
	}
	if err := q.describeWait(ctx, info); err != nil {
		return nil, fmt.Errorf("get job %s: %w", id, err)
	}
	if err := q.readCallback(ctx, info); err != nil {
		return nil, fmt.Errorf("get job %s: %w", id, err)
	}
	if info.State == StateDead {
		cancelled, err := q.rdb.Exists(ctx, q.cancelKey(id)).Result()
		if err != nil {
			return nil, fmt.Errorf("get job %s: %w", id, err)
		}
		if cancelled == 1 {
			// Cancelled while it waited: the attempt a dead job is
			// counted for was never made.
			info.State = StateCancelled
			info.Attempts = max(info.Attempts-1, 0)
		}
	}
	return info, nil
}

// describeWait tells a waiting job held back from one free to go: a job
// in its flow while its upstream is paused or blocked, or its partition
// parked, and a job handed back, are scheduled with WaitingFor and, when
// known, NextAttemptAt the hold's end. A job whose last end was a
// hand-back shows no last error: that wait was no failure. Other states
// are left as they are.
func (q *Queue) describeWait(ctx context.Context, info *Info) error {
	if _, ok := q.ups[info.Upstream]; !ok {
		// An upstream no longer configured: no block key to read (and ""
		// would be another hash slot on a cluster).
		return nil
	}
	space := jobstore.For(q.prefix, info.Upstream)
	switch info.State {
	case StateQueued, StateRetrying:
		// Only a job waiting in its flow or in the retry set (handed
		// back, or after a failure) can be held; one scheduled by its
		// not_before is not read again.
	case StateActive, StateSucceeded:
		if info.LastError == "" {
			return nil
		}
		sd, err := q.rdb.HGet(ctx, space.TaskKey(info.ID), "sd").Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		if _, back := jobstore.WaitsFor(sd); back {
			info.LastError = ""
		}
		return nil
	default:
		return nil
	}
	h, err := space.ReadJobHold(ctx, q.rdb, q.blocks[info.Upstream], info.ID)
	if err != nil {
		return err
	}
	if h.Deferred {
		info.LastError = ""
	}
	all := holdOf(h.Hold)
	var until time.Time
	if all != "" && !h.AsynqPaused {
		until = h.BlockedUntil
	}
	switch {
	case h.State == "aggregating" && all != "":
		info.State, info.WaitingFor, info.NextAttemptAt = StateScheduled, all, until
	case h.State == "aggregating" && !h.ParkedUntil.IsZero():
		info.State, info.WaitingFor, info.NextAttemptAt = StateScheduled, WaitingLimit, h.ParkedUntil
	case h.State == "retry" && h.Deferred:
		// Handed back: no attempt spent, it waits for its upstream.
		info.State, info.WaitingFor = StateScheduled, h.WaitsFor
		if all != "" {
			info.WaitingFor = all
			if until.After(info.NextAttemptAt) {
				info.NextAttemptAt = until
			}
		}
	}
	return nil
}

func infoFromTask(ti *asynq.TaskInfo) (*Info, error) {
	job, err := DecodeJob(ti.ID, ti.Payload)
	if err != nil {
		return nil, fmt.Errorf("job %s: undecodable payload: %w", ti.ID, err)
	}
	info := &Info{Job: job, LastError: ti.LastErr, LastFailedAt: ti.LastFailedAt, CompletedAt: ti.CompletedAt,
		Attempts: attemptsMade(ti.State, ti.Retried)}
	switch ti.State {
	case asynq.TaskStatePending, asynq.TaskStateAggregating:
		// Aggregating: waiting in its flow (see internal/jobstore).
		info.State = StateQueued
	case asynq.TaskStateScheduled:
		info.State, info.NextAttemptAt = StateScheduled, ti.NextProcessAt
	case asynq.TaskStateRetry:
		// Or handed back to wait, which only shaper's mark tells (see
		// describeWait).
		info.State, info.NextAttemptAt = StateRetrying, ti.NextProcessAt
	case asynq.TaskStateActive:
		info.State = StateActive
	case asynq.TaskStateCompleted:
		info.State = StateSucceeded
	case asynq.TaskStateArchived:
		info.State = StateDead
	default:
		info.State = StateQueued
	}
	if len(ti.Result) > 0 {
		if resp, err := DecodeResponse(ti.Result); err == nil {
			info.Response = &resp
		}
	}
	return info, nil
}

func (q *Queue) cancelKey(id string) string {
	upstream, _, _ := ParseID(id)
	return jobstore.For(q.prefix, upstream).CancelKey(id)
}

// finishBounds are the bounds on an upstream's finished jobs under a key
// prefix ("" = default) (see jobstore.Space.FinishBounds).
func finishBounds(prefix string, u shaper.Upstream) jobstore.Bounds {
	return jobstore.For(prefix, u.Name).FinishBounds(u, IdempotentIDPattern)
}

// remembered are an upstream's records of idempotency keys whose jobs are
// dropped: for IdempotencyWindow after the drop, a repeat of the key
// finds the job's final state (see Enqueue), and reading the job answers
// ErrNoLongerKept.
func remembered(prefix string, u shaper.Upstream) jobstore.Remembered {
	return jobstore.For(prefix, u.Name).Remembered(u, IdempotentIDPattern)
}

// Cancel stops a job that has not been dispatched: it is kept among the
// dead, marked cancelled, for the upstream's dead retention. A job being
// dispatched or already finished cannot be cancelled (ErrNotCancellable).
func (q *Queue) Cancel(ctx context.Context, id, tenant string) (*Info, error) {
	info, err := q.Get(ctx, id, tenant)
	if err != nil {
		return nil, err
	}
	switch info.State {
	case StateQueued, StateScheduled, StateRetrying:
	default:
		// A cancelled job included: a second cancel is told it came too
		// late, as for any finished job, and never reads as its success.
		return info, fmt.Errorf("job %s is %s: %w", id, info.State, ErrNotCancellable)
	}
	// The mark outlives the job (which the dead sweep deletes once
	// DeadRetention has passed, taking the mark with it as a side key), so
	// that whoever drops the job still reads it as cancelled: an
	// idempotency record says "cancelled", not "dead".
	ttl := q.ups[info.Upstream].DeadRetention + 24*time.Hour
	// The mark goes first: a job archived without it would read as dead.
	if err := q.rdb.Set(ctx, q.cancelKey(id), "1", ttl).Err(); err != nil {
		return nil, fmt.Errorf("cancel %s: %w", id, err)
	}
	if err := jobstore.For(q.prefix, info.Upstream).Cancel(ctx, q.rdb, id); err != nil {
		q.rdb.Del(context.WithoutCancel(ctx), q.cancelKey(id))
		if errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("job %s: %w", id, ErrNotFound)
		}
		if errors.Is(err, jobstore.ErrNotWaiting) {
			// A worker took it in the meantime.
			return nil, fmt.Errorf("cancel %s: %v: %w", id, err, ErrNotCancellable)
		}
		return nil, fmt.Errorf("cancel %s: %w", id, err)
	}
	// The job will not be sent; its TTL covers a failed delete.
	DeleteSecrets(context.WithoutCancel(ctx), q.rdb, q.prefix, &info.Job)
	info.State = StateCancelled
	return info, nil
}

// RunDeferred makes every job of an upstream that was handed back to wait
// for it (a pause, pushback) due now, for when the wait ended early: an
// operator resumed the upstream. Jobs waiting to retry after a failure keep
// their backoff. It returns how many jobs it moved.
func (q *Queue) RunDeferred(ctx context.Context, upstream string) (int, error) {
	if _, ok := q.ups[upstream]; !ok {
		return 0, fmt.Errorf("upstream %q: %w", upstream, ErrUnknownUpstream)
	}
	qn := jobstore.QueueName(upstream)
	var ids []string
	// Collect first: moving a task while paging would shift the pages.
	for page := 1; ; page++ {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		tasks, err := q.insp.ListRetryTasks(qn, asynq.Page(page), asynq.PageSize(500))
		if errors.Is(err, asynq.ErrQueueNotFound) {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("list waiting jobs of %s: %w", qn, err)
		}
		back, err := q.handedBack(ctx, upstream, tasks)
		if err != nil {
			return 0, fmt.Errorf("list waiting jobs of %s: %w", qn, err)
		}
		ids = append(ids, back...)
		if len(tasks) < 500 {
			break
		}
	}
	moved := 0
	space := jobstore.For(q.prefix, upstream)
	for len(ids) > 0 {
		n := min(len(ids), 500)
		m, err := space.RunNow(ctx, q.rdb, ids[:n]...)
		if err != nil {
			return moved, fmt.Errorf("run waiting jobs of %s: %w", qn, err)
		}
		moved += m
		ids = ids[n:]
	}
	return moved, nil
}

// handedBack picks, of tasks in the retry set, those handed back to wait
// (shaper's sd mark) rather than failed.
func (q *Queue) handedBack(ctx context.Context, upstream string, tasks []*asynq.TaskInfo) ([]string, error) {
	space := jobstore.For(q.prefix, upstream)
	cmds := make([]*redis.StringCmd, len(tasks))
	q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, t := range tasks {
			cmds[i] = p.HGet(ctx, space.TaskKey(t.ID), "sd")
		}
		return nil
	})
	var ids []string
	for i, t := range tasks {
		// (Pipelined's own error is the first command's that failed, a
		// task with no mark included.)
		if err := cmds[i].Err(); err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
		if _, back := jobstore.WaitsFor(cmds[i].Val()); back {
			ids = append(ids, t.ID)
		}
	}
	return ids, nil
}

// ClearAsynqPause lifts a pause placed on the upstream's queue through
// asynq (Inspector.PauseQueue), as asynq's UnpauseQueue does; it reports
// whether there was one. (Workers see it gone at their next look, within
// jobstore.PausedPoll, or at once if woken.)
func (q *Queue) ClearAsynqPause(ctx context.Context, upstream string) (bool, error) {
	if _, ok := q.ups[upstream]; !ok {
		return false, fmt.Errorf("upstream %q: %w", upstream, ErrUnknownUpstream)
	}
	n, err := q.rdb.Del(ctx, jobstore.For(q.prefix, upstream).PausedKey()).Result()
	if err != nil {
		return false, fmt.Errorf("unpause %s in asynq: %w", upstream, err)
	}
	return n == 1, nil
}

// TrimDead deletes an upstream's dead and cancelled jobs older than its dead
// retention (asynq itself keeps at most 10,000 for 90 days). It returns how
// many it deleted.
func (q *Queue) TrimDead(ctx context.Context, upstream string) (int, error) {
	u, ok := q.ups[upstream]
	if !ok {
		return 0, nil
	}
	cutoff := time.Now().Add(-u.DeadRetention)
	space := jobstore.For(q.prefix, upstream)
	n, err := jobstore.DeleteExpired(ctx, q.rdb, jobstore.AsynqKeys(space.Queue), space.CountsKey(), jobstore.Archived, cutoff, 500,
		finishBounds(q.prefix, u))
	if err != nil {
		return n, fmt.Errorf("trim dead jobs of %s: %w", upstream, err)
	}
	return n, nil
}
