package jobstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/script"
)

// statsTTL is how long a daily processed or failed count lives, as in
// asynq (90 days), so its Inspector's history reads the same.
const statsTTL = 90 * 24 * time.Hour

// ErrNotActive is a Finish item's error when its task no longer holds a
// lease in the active state: the lease ran out and the task was recovered,
// or another caller finished it first. Nothing changed for that item.
var ErrNotActive = errors.New("task is not active")

// Outcome is how a taken task ends.
type Outcome uint8

const (
	// Succeeded: kept in the completed set for its retention, or deleted
	// at once without one. It leaves the partition backlog.
	Succeeded Outcome = iota + 1
	// Retry: waits in the retry set for RetryAt. It stays in the
	// partition backlog.
	Retry
	// Dead: archived, as asynq does when retries run out. It leaves the
	// partition backlog.
	Dead
)

func (o Outcome) String() string {
	switch o {
	case Succeeded:
		return "succeeded"
	case Retry:
		return "retry"
	case Dead:
		return "dead"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// handedBackMark is the sd field of a task handed back to wait for
// nothing named (Finished.WaitsFor "").
const handedBackMark = "1"

// WaitsFor reads a task hash's sd field: whether the task's last end was
// a hand-back, and what it waits for ("" for nothing named).
func WaitsFor(sd string) (what string, handedBack bool) {
	if sd == "" {
		return "", false
	}
	if sd == handedBackMark {
		return "", true
	}
	return sd, true
}

// Finished is one taken task to end, and how.
type Finished struct {
	ID        string
	Lane      string // the lane whose counters the task moves between
	Partition string // the task's partition backlog member, "" for none
	// Msg is the task's message as it was taken. Finish stores a changed
	// copy (Retried, ErrorMsg, LastFailedAt, CompletedAt, Retention) and
	// leaves Msg alone. Its ID and Queue must be the item's and the queue's.
	Msg     *Message
	Outcome Outcome
	// Result, when not nil, goes into the task hash's "result" field,
	// where asynq's ResultWriter puts it and its Inspector reads it.
	Result []byte
	// Retention (Succeeded) keeps the task in the completed set that long,
	// with CompletedAt set; zero deletes the task at once.
	Retention time.Duration
	// RetryAt (Retry) is when the task may run again; zero means now.
	RetryAt time.Time
	// LeaseLapsedBy, when set, ends the task only if its lease runs out
	// by then: a recovery's guard against a task that was recovered by
	// another caller and taken again since, under a fresh lease.
	LeaseLapsedBy time.Time
	// ErrMsg (Retry, Dead) becomes the task's last error.
	ErrMsg string
	// Failure (Retry) spends an attempt: Retried grows by one and the
	// queue's failed counts with it, as asynq's Retry does when isFailure.
	// A Retry without Failure is a deferral: the error is recorded but
	// Retried, LastFailedAt and the processed and failed counts stay as
	// they were, and it is counted deferred, not retry.
	Failure bool
	// WaitsFor (a Retry without Failure) is what the handed-back task
	// waits for, kept in the task hash's sd field ("" keeps "1": a wait
	// of shaper's own). The mark stays until an attempt fails or the task
	// dies, so a reader can tell the last error a hand-back's, not a
	// failure's (see JobHold.Deferred).
	WaitsFor string
	// Callback: the job has a callback_url (Entry.Callback), whose
	// delivery a Succeeded (kept) or Dead end records (see Callbacks).
	// Without it the task's cb field is not read, and no delivery is
	// recorded, unless Lane is "" (a job the caller could not decode),
	// whose task says.
	Callback bool
}

// Finish ends taken tasks of one queue in a single script call, and
// returns one error per item: nil, or ErrNotActive when the task no longer
// holds its lease in the active state (then nothing changed for it). The
// second result is an error for the whole call, with no per-item errors:
// an invalid item (nothing was sent), or Redis failing (the script may
// have run, or, since Redis does not roll a script back, part of it).
//
// Every item leaves the active list and the lease set, and its lane's
// active:<lane> counter; Succeeded moves it to succeeded:<lane> (when
// kept), a failing Retry to retry:<lane>, a deferring one to
// deferred:<lane> (marking the task hash's sd field, so whoever moves it
// out of the retry set counts it out of the right one), Dead to
// dead:<lane>. A Succeeded or Dead
// task leaves its partition in pbacklog (the member goes when its count
// reaches zero); a Retry stays. The queue's processed and failed stats
// move as asynq's would: each Succeeded and Dead item counts as processed,
// each Dead and each failing Retry as processed and failed, a deferring
// Retry as neither. A kept Succeeded task releases the task's uniqueness
// lock as asynq does, when the lock is still its own.
//
// counts and pbacklog are shaper's keys and must carry k.HashTag(), so
// the script's keys share the queue's slot on Redis Cluster. A batch holds
// Redis for as long as it runs and each item does an LREM on the active
// list, so keep batches to a few hundred items.
//
// The time written (the archived score, LastFailedAt, CompletedAt, the
// completed score and the day of the stats) comes from this process's
// clock, as asynq's does; lease and retry times are the caller's.
func Finish(ctx context.Context, rdb redis.Scripter, k Keys, counts, pbacklog string, items []Finished, opts ...FinishOption) ([]error, error) {
	return finishAt(ctx, rdb, k, counts, pbacklog, items, time.Now(), opts...)
}

// FinishOption adjusts a Finish.
type FinishOption func(*finishOpts)

type finishOpts struct {
	sleepKey, channel, message string
	bounds                     Bounds
	final                      string // AnnounceFinal's channel
	callbacks                  string // Callbacks' due set
}

// Callbacks names the upstream's due set of callback deliveries
// (Space.CallbacksDueKey), where a Finish records those of its items with a
// Callback: the script declares it among its keys. Without it a delivery
// goes to the set the task's cb field names, undeclared.
func Callbacks(dueKey string) FinishOption {
	return func(o *finishOpts) { o.callbacks = dueKey }
}

// TrimMargin is how many tasks past its bound a Finish deletes from each of
// the completed and archived sets beyond the number of its items: enough
// that an excess (say after a bound was lowered) goes within a few calls,
// few enough that no call holds Redis for long.
const TrimMargin = 100

// Bounds caps how many finished tasks a queue keeps, beside their
// retention (see KeepAtMost).
type Bounds struct {
	// Completed and Archived are the most tasks the completed and the
	// archived set keep; 0 is no bound.
	Completed, Archived int
	// Gone remembers the tasks deleted; its zero value remembers none.
	Gone Tombstones
	// SidePrefixes name keys of a task beside its hash, each a prefix the
	// task id completes (carrying the queue's hash tag), deleted with it.
	SidePrefixes []string
	// Remember keeps a record of each deleted task whose ID is an
	// idempotency key's, in place of its tombstone; its zero value keeps
	// none.
	Remember Remembered
}

// Tombstones are a compact record of finished tasks that were deleted (past
// a count bound, or their retention), so that a read can tell a task that
// finished and is no longer kept from one that never was. Key is a sorted
// set of task id -> when it went (Unix seconds), in the queue's slot; it
// keeps at most Max members, none older than For, and expires For after
// its last write, so it stays bounded too. A tombstone costs about 100
// bytes against a kept task's kilobyte and more.
type Tombstones struct {
	Key string
	Max int           // 0 = keep none
	For time.Duration // at least a second
}

func (t Tombstones) args() (int, int64) {
	if t.Key == "" || t.Max <= 0 {
		return 0, 0
	}
	return t.Max, max(int64(math.Ceil(t.For.Seconds())), 1)
}

// WasDeleted reports whether id has a tombstone in t: it finished, was
// kept, and has been deleted since.
func (t Tombstones) WasDeleted(ctx context.Context, rdb redis.Cmdable, id string) (bool, error) {
	if t.Key == "" {
		return false, nil
	}
	_, err := rdb.ZScore(ctx, t.Key, id).Result()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	return err == nil, err
}

// KeepAtMost makes a Finish keep at most b.Completed tasks in the completed
// set and b.Archived in the archived set, deleting the lowest-scored (the
// oldest) past that, with their hashes and side keys, and counting them out
// of succeeded:<lane> and dead:<lane>, as DeleteExpired does: those counters
// count the tasks kept. One Finish deletes at most its number of items plus
// TrimMargin from each set. Deleted tasks get tombstones in b.Gone.
func KeepAtMost(b Bounds) FinishOption {
	return func(o *finishOpts) { o.bounds = b }
}

// WakeOnRetry makes a Finish that sends a task to retry also clear the
// field "sleep" of the hash sleepKey (which must carry the queue's hash
// tag) and, if it was set, publish message on channel: workers that went
// to sleep knowing of no retry learn of it. (shaper's ready structure
// keeps that flag; see the take script.)
func WakeOnRetry(sleepKey, channel, message string) FinishOption {
	return func(o *finishOpts) { o.sleepKey, o.channel, o.message = sleepKey, channel, message }
}

func finishAt(ctx context.Context, rdb redis.Scripter, k Keys, counts, pbacklog string, items []Finished, now time.Time, opts ...FinishOption) ([]error, error) {
	var o finishOpts
	for _, opt := range opts {
		opt(&o)
	}
	if len(items) == 0 {
		return nil, nil
	}
	keys, args, err := finishCall(k, counts, pbacklog, items, now, &o)
	if err != nil {
		return nil, err
	}
	v, err := script.Run(ctx, rdb, "finish", finishScript, keys, args...)
	if err != nil {
		return nil, err
	}
	missed, err := script.Ints(v, -1)
	if err != nil {
		return nil, fmt.Errorf("script finish: %w", err)
	}
	errs := make([]error, len(items))
	for _, n := range missed {
		if n < 1 || n > int64(len(items)) {
			return nil, fmt.Errorf("script finish: item %d of %d", n, len(items))
		}
		errs[n-1] = ErrNotActive
	}
	return errs, nil
}

// The finish script's shape (its ARGV[1]), a sum of flags: the fields each
// item carries beside its id and message, and the keys and arguments the
// call has beside those every call has. A call sends only what its items
// need, and a value its items share once, since Redis spends about 1,500
// instructions on each key and argument of a script call.
const (
	finScore     = 1 << iota // items carry a score (else one for all of them)
	finResult                // items carry a result
	finLane                  // items carry a lane (else one for all of them)
	finPartition             // items carry a partition
	finUnique                // items carry a uniqueness lock's index in KEYS
	finLapsed                // items carry a lease score (a recovery's check)
	finWaits                 // items carry a deferral's sd mark
	finKind                  // items carry a kind (else one for all of them)
	finKept                  // the completed set, and the most it keeps
	finRetry                 // the retry set
	finWake                  // WakeOnRetry's hash, channel and message
	finDead                  // the archived set, the most it keeps, and now
	finFailed                // the failed counts
	finBacklog               // the partition backlog
	finGone                  // the tombstone set
	finDue                   // the callbacks' due set
	finFinal                 // AnnounceFinal's channel
)

// finishItem is an item as the finish script takes it.
type finishItem struct {
	kind                            byte
	msg, result                     []byte
	score, partition, lapsed, waits string
	unique                          string // the lock key, "" for none
}

// finishCall is the finish script's KEYS and ARGV for items (see
// finish.lua).
func finishCall(k Keys, counts, pbacklog string, items []Finished, now time.Time, o *finishOpts) ([]string, []any, error) {
	b := o.bounds
	goneMax, goneFor := b.Gone.args()
	fi := make([]finishItem, len(items))
	shape := 0
	uniques := 0
	for i := range items {
		it, f := &items[i], &fi[i]
		if err := it.check(k); err != nil {
			return nil, nil, fmt.Errorf("finish %s: %w", it.ID, err)
		}
		msg := *it.Msg
		var outcome byte
		switch it.Outcome {
		case Succeeded:
			if it.Retention > 0 {
				msg.CompletedAt = now.Unix()
				msg.Retention = int64(math.Ceil(it.Retention.Seconds()))
				f.score = Score(now.Add(it.Retention))
				shape |= finKept
			}
			if msg.UniqueKey != "" && strings.HasPrefix(msg.UniqueKey, k.prefix) {
				f.unique = msg.UniqueKey
				uniques++
				shape |= finUnique
			}
		case Retry:
			outcome = 1
			if it.Failure {
				outcome = 2
				msg.Retried++
				// A deferral is no failure: LastFailedAt stays the
				// last real one's.
				msg.LastFailedAt = now.Unix()
				shape |= finFailed
			} else {
				f.waits = cmp.Or(it.WaitsFor, handedBackMark)
				shape |= finWaits
			}
			msg.ErrorMsg = it.ErrMsg
			at := it.RetryAt
			if at.IsZero() {
				at = now
			}
			f.score = Score(at)
			shape |= finRetry
			if o.sleepKey != "" {
				shape |= finWake
			}
		case Dead:
			outcome = 3
			msg.ErrorMsg = it.ErrMsg
			msg.LastFailedAt = now.Unix()
			shape |= finDead | finFailed
		}
		f.kind = 'a' + outcome
		f.msg = msg.Marshal()
		if it.Result != nil {
			f.kind += 4
			f.result = it.Result
			shape |= finResult
		}
		if it.Callback {
			f.kind += 8
		}
		if it.Partition != "" {
			f.partition = it.Partition
			shape |= finPartition | finBacklog
		}
		if it.Lane == "" {
			// Read from the task, with its partition and callback.
			shape |= finBacklog
		}
		if it.Lane != items[0].Lane {
			shape |= finLane
		}
		if f.kind != fi[0].kind {
			shape |= finKind
		}
		if f.score != fi[0].score {
			shape |= finScore
		}
		if !it.LeaseLapsedBy.IsZero() {
			f.lapsed = Score(it.LeaseLapsedBy)
			shape |= finLapsed
		}
		if o.callbacks != "" && (it.Callback || it.Lane == "") {
			shape |= finDue
		}
	}
	if goneMax > 0 && shape&(finKept|finDead) != 0 {
		shape |= finGone
	}
	if o.final != "" {
		shape |= finFinal
	}

	keys := make([]string, 0, 13+len(items)+uniques)
	keys = append(keys, k.Active(), k.Lease(), counts, k.Processed(now), k.ProcessedTotal())
	for _, opt := range []struct {
		flag int
		keys []string
	}{
		{finKept, []string{k.Completed()}},
		{finRetry, []string{k.Retry()}},
		{finDead, []string{k.Archived()}},
		{finFailed, []string{k.Failed(now), k.FailedTotal()}},
		{finBacklog, []string{pbacklog}},
		{finGone, []string{b.Gone.Key}},
		{finDue, []string{o.callbacks}},
	} {
		if shape&opt.flag != 0 {
			keys = append(keys, opt.keys...)
		}
	}
	for _, it := range items {
		keys = append(keys, k.Task(it.ID))
	}

	// What only a new day's stats key or a deletion needs, in one
	// argument, read only then: one value a line (as side prefixes
	// already were, no prefix or pattern holds a newline).
	rem := b.Remember.args()
	var settings strings.Builder
	for _, v := range []any{now.Add(statsTTL).Unix(), TrimMargin, goneMax, goneFor, Score(now),
		"(" + Score(now.Add(-time.Duration(goneFor)*time.Second)), k.TaskPrefix(), rem[0], rem[1], rem[2], rem[3], rem[4]} {
		settings.WriteString(fmt.Sprint(v))
		settings.WriteByte('\n')
	}
	settings.WriteString(strings.Join(b.SidePrefixes, "\n"))

	args := make([]any, 0, 12+len(items)*(2+bits.OnesCount(uint(shape&(finKind<<1-1)))))
	args = append(args, shape, settings.String())
	if shape&finKind == 0 {
		args = append(args, string(fi[0].kind))
	}
	if shape&finScore == 0 && shape&(finKept|finRetry) != 0 {
		args = append(args, fi[0].score)
	}
	if shape&finLane == 0 {
		args = append(args, items[0].Lane)
	}
	if shape&finFinal != 0 {
		args = append(args, o.final)
	}
	if shape&finKept != 0 {
		args = append(args, max(b.Completed, 0))
	}
	if shape&finDead != 0 {
		args = append(args, max(b.Archived, 0), Score(now))
	}
	if shape&finWake != 0 {
		args = append(args, o.sleepKey, o.channel, o.message)
	}
	for i := range items {
		it, f := &items[i], &fi[i]
		args = append(args, it.ID, f.msg)
		if shape&finKind != 0 {
			args = append(args, string(f.kind))
		}
		if shape&finScore != 0 {
			args = append(args, f.score)
		}
		if shape&finResult != 0 {
			args = append(args, f.result)
		}
		if shape&finLane != 0 {
			args = append(args, it.Lane)
		}
		if shape&finPartition != 0 {
			args = append(args, f.partition)
		}
		if shape&finUnique != 0 {
			if f.unique == "" {
				args = append(args, "")
			} else {
				keys = append(keys, f.unique)
				args = append(args, len(keys)) // a Lua index, from 1
			}
		}
		if shape&finLapsed != 0 {
			args = append(args, f.lapsed)
		}
		if shape&finWaits != 0 {
			args = append(args, f.waits)
		}
	}
	return keys, args, nil
}

func (it *Finished) check(k Keys) error {
	switch {
	case it.ID == "":
		return errors.New("no task id")
	case it.Msg == nil:
		return errors.New("no message")
	case it.Msg.ID != it.ID:
		return fmt.Errorf("message of task %q", it.Msg.ID)
	case it.Msg.Queue != k.queue:
		return fmt.Errorf("message of queue %q, not %q", it.Msg.Queue, k.queue)
	case it.Outcome < Succeeded || it.Outcome > Dead:
		return fmt.Errorf("unknown outcome %v", it.Outcome)
	}
	return nil
}

// Score is t as a sorted-set score in asynq's unit, Unix seconds, with
// milliseconds after the point ("1764500000.250"): asynq reads the whole
// seconds (its Inspector's NextProcessAt, its forwarder's "due by now"),
// and shaper keeps the milliseconds.
func Score(t time.Time) string {
	return strconv.FormatFloat(float64(t.UnixMilli())/1000, 'f', 3, 64)
}

// ScoreTime is the time a score written by Score (or by asynq, in whole
// seconds) stands for.
func ScoreTime(score float64) time.Time {
	return time.UnixMilli(int64(math.Round(score * 1000)))
}

// ExtendLeases moves the lease of each task that still holds one to until.
// A task whose lease already went (recovered, or finished) stays without
// one: an extension never brings a lease back.
func ExtendLeases(ctx context.Context, rdb redis.Scripter, k Keys, ids []string, until time.Time) error {
	if len(ids) == 0 {
		return nil
	}
	args := make([]any, 0, 1+len(ids))
	args = append(args, Score(until))
	for _, id := range ids {
		args = append(args, id)
	}
	_, err := script.Run(ctx, rdb, "extend leases", extendScript, []string{k.Lease()}, args...)
	return err
}

// Expired is a taken task whose lease ran out.
type Expired struct {
	ID        string
	Msg       *Message
	Lane      string // the task hash's sl field
	Partition string // the task hash's sp field
	Callback  bool   // the task hash has a cb field: the job has a callback
}

// ExpiredLeases returns up to limit tasks whose lease ended at or before
// now, earliest first. A lease whose task hash is gone is dropped from the
// lease set and the active list on the way, since nothing could finish it.
func ExpiredLeases(ctx context.Context, rdb redis.Scripter, k Keys, now time.Time, limit int) ([]Expired, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("expired leases: limit %d, want more than 0", limit)
	}
	v, err := script.Run(ctx, rdb, "expired leases", expiredScript, []string{k.Lease(), k.Active()},
		Score(now), limit, k.TaskPrefix())
	if err != nil {
		return nil, err
	}
	rows, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("script expired leases: reply %T, want an array", v)
	}
	out := make([]Expired, 0, len(rows))
	for _, r := range rows {
		f, ok := r.([]any)
		if !ok || len(f) != 5 {
			return nil, fmt.Errorf("script expired leases: row %v, want 5 values", r)
		}
		var s [5]string
		for i := range s {
			if s[i], ok = f[i].(string); !ok {
				return nil, fmt.Errorf("script expired leases: row value %T, want a string", f[i])
			}
		}
		msg, err := Unmarshal([]byte(s[1]))
		if err != nil {
			// Recovered all the same, as dead: a message nobody can read
			// must not hold the lease set (and its recovery) for ever.
			msg = &Message{ID: s[0], Queue: k.Queue(), Payload: []byte(s[1]), ErrorMsg: "undecodable task message: " + err.Error()}
		}
		out = append(out, Expired{ID: s[0], Msg: msg, Lane: s[2], Partition: s[3], Callback: s[4] == "1"})
	}
	return out, nil
}

// LeaseExpiredError is the last error Recover gives a task.
const LeaseExpiredError = "lease expired: the worker holding it stopped"

// Exhausted reports whether the attempt a taken task is making is its
// last. shaper stores a job's max_attempts in asynq's retry field (see
// package queue), and the attempt under way is number Retried+1, so it is
// the last when Retried+1 >= Retry. That is asynq's own recoverer's rule,
// "archive when the lost attempt was the last one allowed", in shaper's
// count: asynq archives when Retried >= Retry because its retry field
// counts retries after a first attempt, allowing Retry+1 attempts in all.
func Exhausted(m *Message) bool {
	return int64(m.Retried)+1 >= int64(m.Retry)
}

// Recover ends up to limit tasks whose lease ran out by now: their worker
// stopped, so the attempt is spent. A task with attempts left goes to
// retry, due at once, with Retried one more; one whose attempt was its last
// (Exhausted) goes dead. Both get LeaseExpiredError as their last error. It
// returns how many tasks it ended; one finished by its worker between the
// listing and the ending is left to that worker. counts and pbacklog are as
// for Finish.
//
// Options are Finish's: AnnounceFinal announces the tasks that go dead.
func Recover(ctx context.Context, rdb redis.Scripter, k Keys, counts, pbacklog string, now time.Time, limit int, opts ...FinishOption) (int, error) {
	exp, err := ExpiredLeases(ctx, rdb, k, now, limit)
	if err != nil || len(exp) == 0 {
		return 0, err
	}
	items := make([]Finished, len(exp))
	for i, e := range exp {
		items[i] = Finished{ID: e.ID, Lane: e.Lane, Partition: e.Partition, Msg: e.Msg, Callback: e.Callback,
			Outcome: Retry, Failure: true, RetryAt: now, ErrMsg: LeaseExpiredError, LeaseLapsedBy: now}
		if Exhausted(e.Msg) {
			items[i].Outcome = Dead
		}
	}
	errs, err := finishAt(ctx, rdb, k, counts, pbacklog, items, now, opts...)
	if err != nil {
		return 0, fmt.Errorf("recover: %w", err)
	}
	n := 0
	for _, e := range errs {
		if e == nil {
			n++
		}
	}
	return n, nil
}

// Zset names a set of finished tasks that DeleteExpired trims.
type Zset uint8

const (
	Completed Zset = iota + 1 // succeeded tasks, counted as succeeded:<lane>
	Archived                  // dead tasks, counted as dead:<lane>
)

func (z Zset) String() string {
	switch z {
	case Completed:
		return "completed"
	case Archived:
		return "archived"
	}
	return "Zset(" + strconv.Itoa(int(z)) + ")"
}

// DeleteExpired deletes up to limit tasks of the completed or archived set
// whose score is at or before cutoff, with their task hashes, and counts
// each out of succeeded:<lane> or dead:<lane> in counts by its hash's sl
// field (a task without one, say enqueued by asynq's own client, touches no
// counter). It returns how many it deleted; fewer than limit means none is
// left before cutoff. For the completed set the score is the end of the
// retention, so cutoff is now; for the archived set it is when the task
// died, so cutoff is now minus the dead retention. counts must carry
// k.HashTag().
//
// With bounds (only the first is used), a deleted task gets a tombstone
// and its side keys go with it, and once none is left before cutoff, tasks
// past the set's count bound (Completed or Archived) go too, oldest first,
// all within limit: the sweep that brings an upstream that finishes
// nothing more down to a lowered bound.
func DeleteExpired(ctx context.Context, rdb redis.Scripter, k Keys, counts string, which Zset, cutoff time.Time, limit int, bounds ...Bounds) (int, error) {
	var b Bounds
	if len(bounds) > 0 {
		b = bounds[0]
	}
	var set, state string
	most := 0
	switch which {
	case Completed:
		set, state, most = k.Completed(), "succeeded", b.Completed
	case Archived:
		set, state, most = k.Archived(), "dead", b.Archived
	default:
		return 0, fmt.Errorf("delete expired: unknown set %v", which)
	}
	if limit <= 0 {
		return 0, fmt.Errorf("delete expired: limit %d, want more than 0", limit)
	}
	keys := []string{set, counts}
	goneMax, goneFor := b.Gone.args()
	if goneMax > 0 {
		keys = append(keys, b.Gone.Key)
	}
	args := []any{Score(cutoff), limit, k.TaskPrefix(), state, Score(time.Now()), goneMax, goneFor,
		strings.Join(b.SidePrefixes, "\n"), max(most, 0)}
	v, err := script.Run(ctx, rdb, "delete expired", deleteExpiredScript, keys, append(args, b.Remember.args()...)...)
	if err != nil {
		return 0, err
	}
	n, ok := v.(int64)
	if !ok {
		return 0, fmt.Errorf("script delete expired: reply %T, want an integer", v)
	}
	return int(n), nil
}
