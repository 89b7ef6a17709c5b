package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
)

// The previous layout (shaper before one queue per upstream) kept each lane
// of an upstream in an asynq queue of its own, "shaper.UPSTREAM.LANE",
// drained by asynq's server, with a job's sensitive headers and cancel mark
// in side keys tagged by that queue. MigrateLegacy carries a deployment's
// jobs from there into the upstream's one queue. The old and new keys hash
// to different Redis Cluster slots, so nothing moves a job in one step:
// each job is read from the old queue, written into the new one through
// sched (which refuses an ID it already has), and only then deleted from
// the old. A crash anywhere leaves the job in the old queue, the new one,
// or both; a rerun deletes from the old what the new one has, so no job is
// lost or doubled.

// legacyQueueName is the asynq queue of an upstream's lane in the previous
// layout.
func legacyQueueName(upstream, lane string) string { return jobstore.QueueName(upstream) + "." + lane }

// migrateBatch is how many jobs of an old queue are read at a time.
const migrateBatch = 200

// Migration is what MigrateLegacy did for one upstream. Its zero value
// (besides Upstream) means there was nothing to do.
type Migration struct {
	Upstream string
	// Queues are the old lane queues that had jobs or were still listed
	// in asynq's set of queues.
	Queues []string
	// Jobs moved into the upstream's queue, by their state in the old
	// one: Pending ones are queued; Scheduled and Retry ones wait until
	// the same time; Dead (cancelled included) and Succeeded ones keep
	// their times, result and cancel mark.
	Pending, Scheduled, Retry, Dead, Succeeded int
	// Active counts jobs whose worker's lease had run out: their attempt
	// was lost, so each was moved as queued with that attempt spent, or,
	// when it was its last (Exhausted of them), as dead.
	Active, Exhausted int
	// Existing counts jobs already in the new queue (moved by an earlier
	// run that stopped midway, or by another replica): deleted from the
	// old one only.
	Existing int
	// Dropped counts ids in an old queue with no task behind them
	// (asynq leftovers, nothing to move): removed.
	Dropped int
	// Skipped are jobs left in the old queue; see SkippedJob.
	Skipped []SkippedJob
	// Unlisted are the old queues found empty at the end and removed from
	// asynq's set of queues.
	Unlisted []string
}

// SkippedJob is a job MigrateLegacy left in the old layout.
type SkippedJob struct {
	ID    string
	Queue string
	// LeaseUntil, when set, is when the old worker's lease on the job
	// ends: a worker of the previous version may still be running it, so
	// it is moved by a run after that (if the worker finishes it first,
	// as whatever state it ends in).
	LeaseUntil time.Time
	// Reason says why it was left.
	Reason string
}

// Moved is how many jobs were moved into the new queue.
func (m Migration) Moved() int {
	return m.Pending + m.Scheduled + m.Retry + m.Dead + m.Succeeded + m.Active
}

// Leased is how many skipped jobs wait for an old worker's lease to end:
// a later run may move them.
func (m Migration) Leased() int {
	n := 0
	for _, s := range m.Skipped {
		if !s.LeaseUntil.IsZero() {
			n++
		}
	}
	return n
}

// Empty reports whether the run found nothing to do.
func (m Migration) Empty() bool {
	return len(m.Queues) == 0 && m.Moved() == 0 && m.Existing == 0 && m.Dropped == 0 && len(m.Skipped) == 0
}

func (m Migration) String() string {
	return fmt.Sprintf("moved %d (pending %d, scheduled %d, retry %d, dead %d, succeeded %d, active %d of which %d dead), "+
		"%d already moved, %d dropped, %d skipped (%d leased)",
		m.Moved(), m.Pending, m.Scheduled, m.Retry, m.Dead, m.Succeeded, m.Active, m.Exhausted,
		m.Existing, m.Dropped, len(m.Skipped), m.Leased())
}

// MigrateLegacy moves every job of the upstream's queues in the previous
// layout (one per lane: every configured lane's, and any other listed in
// asynq's set of queues as "shaper.UPSTREAM.LANE") into the upstream's
// queue, keeping each job's state, counters, result, sensitive headers and
// cancel mark, then removes each emptied old queue from asynq's set of
// queues. It first checks, in one round trip, whether any old queue has
// anything; most calls end there.
//
// An active job whose old worker's lease has not run out is skipped (see
// SkippedJob.LeaseUntil): stop the old workers, and call again after the
// lease. One whose lease ran out is moved as asynq's recoverer would have
// left it: its attempt spent, queued again, or dead if that was its last.
//
// It is safe to rerun after a failure, and to run from several processes
// at once: a job already in the new queue is only deleted from the old.
// Workers of the previous version must not run meanwhile; they would keep
// taking jobs from the old queues.
func (q *Queue) MigrateLegacy(ctx context.Context, upstream string) (Migration, error) {
	m := Migration{Upstream: upstream}
	u, ok := q.ups[upstream]
	if !ok {
		return m, fmt.Errorf("upstream %q: %w", upstream, ErrUnknownUpstream)
	}
	found, err := q.legacyLanes(ctx, []string{upstream})
	lanes := found[upstream]
	if err != nil || len(lanes) == 0 {
		return m, err
	}
	// asynq's Inspector finds a job only in a listed queue.
	if err := q.list(ctx, q.rdb, upstream); err != nil {
		return m, fmt.Errorf("migrate %s: %w", upstream, err)
	}
	mv := &migrator{q: q, u: u, space: jobstore.For(q.prefix, upstream), m: &m}
	for _, lane := range lanes {
		name := legacyQueueName(upstream, lane)
		m.Queues = append(m.Queues, name)
		if err := mv.migrateQueue(ctx, lane); err != nil {
			return m, fmt.Errorf("migrate %s: %w", name, err)
		}
	}
	return m, nil
}

// LegacyUpstreams returns, sorted, the named upstreams (every configured
// one when none are named) that have anything left in the previous layout:
// jobs in an old queue of a configured lane, or an old queue still listed
// in asynq's set of queues. It costs one pipelined round trip, so a
// deployment that has migrated pays almost nothing to ask at every start.
func (q *Queue) LegacyUpstreams(ctx context.Context, names ...string) ([]string, error) {
	if len(names) == 0 {
		for _, u := range q.Upstreams() {
			names = append(names, u.Name)
		}
	}
	lanes, err := q.legacyLanes(ctx, names)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, name := range names {
		if len(lanes[name]) > 0 {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// legacyLanes returns, for each named upstream, its lanes that have an old
// queue to migrate or unlist, sorted: in one pipelined round trip, each
// configured lane's old queue's sizes, and asynq's set of queues for the
// others.
func (q *Queue) legacyLanes(ctx context.Context, names []string) (map[string][]string, error) {
	pipe := q.rdb.Pipeline()
	listed := pipe.SMembers(ctx, jobstore.AllQueues)
	type lane struct{ upstream, lane string }
	sizes := map[lane][]*redis.IntCmd{}
	for _, name := range names {
		u, ok := q.ups[name]
		if !ok {
			return nil, fmt.Errorf("upstream %q: %w", name, ErrUnknownUpstream)
		}
		for _, l := range u.LaneNames() {
			k := jobstore.AsynqKeys(legacyQueueName(name, l))
			sizes[lane{name, l}] = []*redis.IntCmd{
				pipe.LLen(ctx, k.Pending()), pipe.LLen(ctx, k.Active()),
				pipe.ZCard(ctx, k.Scheduled()), pipe.ZCard(ctx, k.Retry()),
				pipe.ZCard(ctx, k.Archived()), pipe.ZCard(ctx, k.Completed()),
			}
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("look for queues of the previous layout: %w", err)
	}
	found := map[lane]bool{}
	for l, cmds := range sizes {
		for _, c := range cmds {
			if c.Val() > 0 {
				found[l] = true
			}
		}
	}
	for _, qn := range listed.Val() {
		for _, name := range names {
			if l, ok := strings.CutPrefix(qn, jobstore.QueueName(name)+"."); ok && ValidName(l) {
				found[lane{name, l}] = true
			}
		}
	}
	out := map[string][]string{}
	for l := range found {
		out[l.upstream] = append(out[l.upstream], l.lane)
	}
	for _, ls := range out {
		slices.Sort(ls)
	}
	return out, nil
}

// migrator moves the old queues of one upstream.
type migrator struct {
	q     *Queue
	u     shaper.Upstream
	space jobstore.Space
	m     *Migration
}

// oldState is where a job sits in an old queue.
type oldState uint8

const (
	oldActive oldState = iota + 1
	oldPending
	oldScheduled
	oldRetry
	oldArchived
	oldCompleted
)

// migrateQueue moves one old queue, state by state: active jobs first,
// since they were taken before the pending ones, then pending oldest
// first, so they keep their order in the new queue.
func (mv *migrator) migrateQueue(ctx context.Context, lane string) error {
	k := jobstore.AsynqKeys(legacyQueueName(mv.u.Name, lane))
	ids, err := mv.q.rdb.LRange(ctx, k.Active(), 0, -1).Result()
	if err != nil {
		return err
	}
	if err := mv.batch(ctx, lane, oldActive, ids, nil); err != nil {
		return err
	}
	// Skipped jobs stay where they are: each batch starts past them.
	for left := 0; ; {
		// asynq pushes on the left and takes from the right.
		ids, err := mv.q.rdb.LRange(ctx, k.Pending(), int64(-(left + migrateBatch)), int64(-(left + 1))).Result()
		if err != nil {
			return err
		}
		slices.Reverse(ids)
		before := len(mv.m.Skipped)
		if err := mv.batch(ctx, lane, oldPending, ids, nil); err != nil {
			return err
		}
		left += len(mv.m.Skipped) - before
		if len(ids) < migrateBatch {
			break
		}
	}
	for _, st := range []oldState{oldScheduled, oldRetry, oldArchived, oldCompleted} {
		set := mv.oldSet(k, st)
		for left := 0; ; {
			zs, err := mv.q.rdb.ZRangeWithScores(ctx, set, int64(left), int64(left+migrateBatch-1)).Result()
			if err != nil {
				return err
			}
			ids := make([]string, len(zs))
			scores := make([]float64, len(zs))
			for i, z := range zs {
				ids[i], _ = z.Member.(string)
				scores[i] = z.Score
			}
			before := len(mv.m.Skipped)
			if err := mv.batch(ctx, lane, st, ids, scores); err != nil {
				return err
			}
			left += len(mv.m.Skipped) - before
			if len(zs) < migrateBatch {
				break
			}
		}
	}
	return mv.unlistIfEmpty(ctx, k)
}

func (mv *migrator) oldSet(k jobstore.Keys, st oldState) string {
	switch st {
	case oldScheduled:
		return k.Scheduled()
	case oldRetry:
		return k.Retry()
	case oldArchived:
		return k.Archived()
	case oldCompleted:
		return k.Completed()
	}
	return ""
}

// unlistIfEmpty removes an old queue from asynq's set of queues once it
// holds nothing. A job a previous-version serve enqueues right after is
// still found: the next run looks at the queue's keys, not only the set.
func (mv *migrator) unlistIfEmpty(ctx context.Context, k jobstore.Keys) error {
	pipe := mv.q.rdb.Pipeline()
	cmds := []*redis.IntCmd{
		pipe.LLen(ctx, k.Pending()), pipe.LLen(ctx, k.Active()),
		pipe.ZCard(ctx, k.Scheduled()), pipe.ZCard(ctx, k.Retry()),
		pipe.ZCard(ctx, k.Archived()), pipe.ZCard(ctx, k.Completed()),
		pipe.Exists(ctx, k.Groups()),
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	for _, c := range cmds {
		if c.Val() > 0 {
			return nil
		}
	}
	n, err := mv.q.rdb.SRem(ctx, jobstore.AllQueues, k.Queue()).Result()
	if err != nil {
		return err
	}
	if n > 0 {
		mv.m.Unlisted = append(mv.m.Unlisted, k.Queue())
	}
	return nil
}

// moving is one job on its way.
type moving struct {
	id    string
	st    oldState
	score float64
	msg   *jobstore.Message
	job   Job
	// secrets is the job's old side key, "" for none; carry says it is
	// copied to the new queue (the job may still be sent).
	secrets string
	carry   bool
	// cancel is the job's old cancel mark, looked for in the archive.
	cancel string
	// done: delete it from the old queue (moved, or already there).
	done bool
}

// batch moves the jobs ids of one state of one old queue (scores are their
// scores in the state's sorted set). Round trips: read the old tasks and
// look for them in the new queue; read the side keys to carry; write them
// under the new queue; write each task; delete the batch from the old
// queue in one transaction.
func (mv *migrator) batch(ctx context.Context, lane string, st oldState, ids []string, scores []float64) error {
	if len(ids) == 0 {
		return nil
	}
	rdb := mv.q.rdb
	oldQ := legacyQueueName(mv.u.Name, lane)
	k := jobstore.AsynqKeys(oldQ)
	pipe := rdb.Pipeline()
	tasks := make([]*redis.SliceCmd, len(ids))
	exists := make([]*redis.IntCmd, len(ids))
	leases := make([]*redis.FloatCmd, len(ids))
	for i, id := range ids {
		tasks[i] = pipe.HMGet(ctx, k.Task(id), "msg", "result")
		exists[i] = pipe.Exists(ctx, mv.space.TaskKey(id))
		if st == oldActive {
			leases[i] = pipe.ZScore(ctx, k.Lease(), id)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	now := time.Now()
	var jobs []*moving
	var gone []string // ids with no task: only removed
	results := map[string][]byte{}
	for i, id := range ids {
		v := tasks[i].Val()
		raw, ok := v[0].(string)
		if !ok {
			gone = append(gone, id)
			mv.m.Dropped++
			continue
		}
		mj := &moving{id: id, st: st, cancel: mv.q.prefix + ":cancelled:{" + oldQ + "}:" + id}
		if scores != nil {
			mj.score = scores[i]
		}
		msg, err := jobstore.Unmarshal([]byte(raw))
		if err == nil {
			mj.job, err = DecodeJob(msg.ID, msg.Payload)
		}
		if err != nil {
			mv.skip(id, oldQ, time.Time{}, fmt.Sprintf("undecodable task: %v", err))
			continue
		}
		mj.msg = msg
		if mj.job.Secrets != "" {
			mj.secrets = mv.q.prefix + ":secrets:{" + oldQ + "}:" + id + ":" + mj.job.Secrets
		}
		if exists[i].Val() == 1 {
			mj.done = true
			mv.m.Existing++
			jobs = append(jobs, mj)
			continue
		}
		if st == oldActive {
			until, err := leases[i].Result()
			if err == nil && jobstore.ScoreTime(until).After(now) {
				mv.skip(id, oldQ, jobstore.ScoreTime(until), "an old worker holds it")
				continue
			}
		}
		if r, ok := v[1].(string); ok {
			results[id] = []byte(r)
		}
		// A finished job will not be sent: its headers are not carried.
		mj.carry = mj.secrets != "" && st != oldArchived && st != oldCompleted &&
			!(st == oldActive && jobstore.Exhausted(msg))
		jobs = append(jobs, mj)
	}
	if err := mv.carrySideKeys(ctx, jobs); err != nil {
		return err
	}
	for _, mj := range jobs {
		if mj.done {
			continue
		}
		created, err := mv.write(ctx, lane, mj, results[mj.id], now)
		if err != nil {
			return fmt.Errorf("move %s: %w", mj.id, err)
		}
		mj.done = true
		if !created {
			// Another process moved it in the meantime; anything carried
			// for it was the same.
			mv.m.Existing++
			continue
		}
		mv.count(mj)
	}
	return mv.deleteOld(ctx, k, st, jobs, gone)
}

func (mv *migrator) skip(id, queue string, until time.Time, why string) {
	mv.m.Skipped = append(mv.m.Skipped, SkippedJob{ID: id, Queue: queue, LeaseUntil: until, Reason: why})
}

func (mv *migrator) count(mj *moving) {
	switch mj.st {
	case oldActive:
		mv.m.Active++
		if jobstore.Exhausted(mj.msg) {
			mv.m.Exhausted++
		}
	case oldPending:
		mv.m.Pending++
	case oldScheduled:
		mv.m.Scheduled++
	case oldRetry:
		mv.m.Retry++
	case oldArchived:
		mv.m.Dead++
	case oldCompleted:
		mv.m.Succeeded++
	}
}

// carrySideKeys copies the sensitive headers and cancel marks of the jobs
// about to be written to their keys under the new queue, with the TTL they
// have left. The old keys are in another slot, so this is GET and PTTL,
// then SET: RENAME cannot cross slots on a cluster. The old keys are
// deleted only with their task, after it is written. A job found already
// moved gets nothing: what it needs was carried before it was written.
func (mv *migrator) carrySideKeys(ctx context.Context, jobs []*moving) error {
	type read struct {
		from, to string
		val      *redis.StringCmd
		ttl      *redis.DurationCmd
	}
	var reads []read
	pipe := mv.q.rdb.Pipeline()
	add := func(from, to string) {
		reads = append(reads, read{from: from, to: to, val: pipe.Get(ctx, from), ttl: pipe.PTTL(ctx, from)})
	}
	for _, mj := range jobs {
		if mj.done {
			continue
		}
		if mj.carry {
			job := mj.job
			job.Upstream = mv.u.Name
			add(mj.secrets, SecretsKey(mv.q.prefix, &job))
		}
		if mj.st == oldArchived {
			add(mj.cancel, mv.q.cancelKey(mj.id))
		}
	}
	if len(reads) == 0 {
		return nil
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("read side keys: %w", err)
	}
	pipe = mv.q.rdb.Pipeline()
	n := 0
	for _, r := range reads {
		val, err := r.val.Result()
		if errors.Is(err, redis.Nil) {
			// Expired: a job without its headers dies when sent, as it
			// would have in the old queue.
			continue
		}
		ttl := r.ttl.Val()
		switch {
		case ttl == -2:
			continue // it expired between GET and PTTL
		case ttl < 0:
			ttl = 0 // no TTL
		}
		pipe.Set(ctx, r.to, val, ttl)
		n++
	}
	if n == 0 {
		return nil
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("write side keys: %w", err)
	}
	return nil
}

// write stores one job in the new queue in the state it had in the old.
func (mv *migrator) write(ctx context.Context, lane string, mj *moving, result []byte, now time.Time) (bool, error) {
	job := mj.job
	fk := jobstore.FairKey(mv.u, job.Tenant, job.Partition)
	msg := *mj.msg
	msg.Queue = mv.space.Queue
	msg.GroupKey = lane + "|" + fk + "|" + job.Partition
	e := jobstore.Entry{ID: mj.id, Lane: lane, FairKey: fk, Partition: job.Partition, Costs: job.Cost}
	at := jobstore.ScoreTime(mj.score)
	switch mj.st {
	case oldActive:
		// The attempt under way was lost with its worker.
		msg.ErrorMsg, msg.LastFailedAt = jobstore.LeaseExpiredError, now.Unix()
		if jobstore.Exhausted(mj.msg) {
			e.Msg = msg.Marshal()
			return mv.space.Place(ctx, mv.q.rdb, e, jobstore.PlaceDead, now, nil)
		}
		msg.Retried++
		e.Msg = msg.Marshal()
		return mv.space.Enqueue(ctx, mv.q.rdb, e)
	case oldPending:
		e.Msg = msg.Marshal()
		return mv.space.Enqueue(ctx, mv.q.rdb, e)
	case oldScheduled:
		// One already due becomes ready at once, as a take would make it.
		e.Msg, e.ProcessAt = msg.Marshal(), at
		return mv.space.Enqueue(ctx, mv.q.rdb, e)
	case oldRetry:
		e.Msg = msg.Marshal()
		return mv.space.Place(ctx, mv.q.rdb, e, jobstore.PlaceRetry, at, nil)
	case oldArchived:
		e.Msg = msg.Marshal()
		return mv.space.Place(ctx, mv.q.rdb, e, jobstore.PlaceDead, at, nil)
	case oldCompleted:
		e.Msg = msg.Marshal()
		return mv.space.Place(ctx, mv.q.rdb, e, jobstore.PlaceSucceeded, at, result)
	}
	return false, fmt.Errorf("unknown state %d", mj.st)
}

// deleteOld removes the moved (or already moved) jobs and the ids without
// a task from the old queue, with their side keys, in one transaction:
// they all share the old queue's slot.
func (mv *migrator) deleteOld(ctx context.Context, k jobstore.Keys, st oldState, jobs []*moving, gone []string) error {
	if len(gone) == 0 && !slices.ContainsFunc(jobs, func(mj *moving) bool { return mj.done }) {
		return nil
	}
	rm := func(p redis.Pipeliner, id string) {
		switch st {
		case oldActive:
			p.LRem(ctx, k.Active(), 0, id)
			p.ZRem(ctx, k.Lease(), id)
		case oldPending:
			p.LRem(ctx, k.Pending(), 0, id)
		default:
			p.ZRem(ctx, mv.oldSet(k, st), id)
		}
	}
	_, err := mv.q.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for _, id := range gone {
			rm(p, id)
		}
		for _, mj := range jobs {
			if !mj.done {
				continue
			}
			rm(p, mj.id)
			p.Del(ctx, k.Task(mj.id), mj.cancel)
			if mj.secrets != "" {
				p.Del(ctx, mj.secrets)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete moved jobs: %w", err)
	}
	return nil
}

func (s SkippedJob) String() string {
	out := s.Queue + " " + s.ID + ": " + s.Reason
	if !s.LeaseUntil.IsZero() {
		out += " until " + s.LeaseUntil.UTC().Format(time.RFC3339)
	}
	return out
}
