package shaper

// Costs are what one record of each kind costs in Redis beyond the bytes
// it carries, as measured on Redis 7 (queue.TestMemoryEstimateCoversAJob
// and jobstore.TestRememberCompact hold the estimate to them): a queued
// job beyond its body, a finished job beyond what it keeps (a succeeded
// one its response, a dead one its request body and any response),
// a compact idempotency record, and the tombstone of a dropped job.
type Costs struct {
	QueuedJob, FinishedJob, IdempotencyRecord, Tombstone int64
}

// MemoryCosts are the per-record costs the memory estimate uses.
func MemoryCosts() Costs {
	return Costs{QueuedJob: 1150, FinishedJob: 1220, IdempotencyRecord: 120, Tombstone: 100}
}
