package jobstore

import "time"

// AllQueues is asynq's global set of queue names. It has no hash tag: it is
// the one key of the layout outside every queue's slot.
const AllQueues = "asynq:queues"

// Keys names the Redis keys of one asynq queue, in asynq v0.26.0's layout
// (internal/base and internal/rdb) to the letter. Beside asynq's own state,
// every transition of a task (Finish, Recover, DeleteExpired) also keeps
// shaper's per-lane counters and partition backlog, whose keys the caller
// passes in (Space.CountsKey, Space.BacklogKey). Every key carries the queue's
// hash tag {queue}, so on Redis Cluster a script may use them all at once.
// Build it with AsynqKeys; the zero value names nothing.
type Keys struct {
	queue  string
	prefix string // asynq:{queue}:
}

// For returns the keys of the named queue.
func AsynqKeys(queue string) Keys {
	return Keys{queue: queue, prefix: "asynq:{" + queue + "}:"}
}

// Prefix starts every key of the queue's: asynq:{queue}:. The take script
// names the keys it needs from it, as these functions do.
func (k Keys) Prefix() string { return k.prefix }

// Queue is the queue's name.
func (k Keys) Queue() string { return k.queue }

// HashTag is the queue's hash tag, "{queue}". Keys the caller passes beside
// these (counters, partition backlog) must carry the same tag to share the
// queue's slot on Redis Cluster.
func (k Keys) HashTag() string { return "{" + k.queue + "}" }

// Task is the hash holding one task: fields msg (the encoded Message), state,
// result, and shaper's sl (lane) and sp (partition key).
func (k Keys) Task(id string) string { return k.prefix + "t:" + id }

// TaskPrefix is Task(id) without the id.
func (k Keys) TaskPrefix() string { return k.prefix + "t:" }

// Pending is the list of task ids ready to run; asynq pushes on the left and
// takes from the right.
func (k Keys) Pending() string { return k.prefix + "pending" }

// Active is the list of task ids being worked on.
func (k Keys) Active() string { return k.prefix + "active" }

// Lease is the sorted set of active task ids scored by when their lease ends
// (Unix seconds).
func (k Keys) Lease() string { return k.prefix + "lease" }

// Scheduled is the sorted set of tasks waiting for their first run, scored by
// when it is due (Unix seconds).
func (k Keys) Scheduled() string { return k.prefix + "scheduled" }

// Retry is the sorted set of tasks waiting for another attempt, scored by
// when it is due (Unix seconds).
func (k Keys) Retry() string { return k.prefix + "retry" }

// Archived is the sorted set of dead tasks, scored by when they died.
func (k Keys) Archived() string { return k.prefix + "archived" }

// Completed is the sorted set of succeeded tasks kept for their retention,
// scored by when they may be deleted.
func (k Keys) Completed() string { return k.prefix + "completed" }

// Paused exists while the queue is paused.
func (k Keys) Paused() string { return k.prefix + "paused" }

// Groups is the set of the queue's aggregation group names.
func (k Keys) Groups() string { return k.prefix + "groups" }

// Group is the sorted set of one aggregation group's tasks.
func (k Keys) Group(name string) string { return k.prefix + "g:" + name }

// Processed counts the tasks processed on t's day (UTC).
func (k Keys) Processed(t time.Time) string {
	return k.prefix + "processed:" + t.UTC().Format(time.DateOnly)
}

// ProcessedTotal counts the tasks processed since the queue began.
func (k Keys) ProcessedTotal() string { return k.prefix + "processed" }

// Failed counts the failed attempts on t's day (UTC).
func (k Keys) Failed(t time.Time) string {
	return k.prefix + "failed:" + t.UTC().Format(time.DateOnly)
}

// FailedTotal counts the failed attempts since the queue began.
func (k Keys) FailedTotal() string { return k.prefix + "failed" }
