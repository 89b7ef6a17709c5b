// Package jobstore owns shaper's job store in Redis: every key and every
// script that reads or writes a job. Jobs live in asynq v0.26.0's layout (an
// upstream is one asynq queue, "shaper.NAME", so asynq's Inspector reads
// them truthfully; a test checks the layout against asynq's own client), and
// what asynq's server would do is done here instead by Lua scripts: enqueue
// into per-lane, per-partition flows; take the next jobs in fair-share order
// while booking their send slots on the upstream's leaky bucket, in one round
// trip; finish, retry, recover and trim them; and keep shaper's own records
// beside asynq's (per-lane counters, partition backlogs, tombstones and
// idempotency records of dropped jobs, sensitive headers, cancel marks, drain
// counts). Every key of an upstream carries the hash tag {Q} of its queue Q,
// so each script touches one Redis Cluster slot; P is the key prefix
// (keyspace.Prefix, "shaper" by default):
//
//	asynq:{Q}:t:ID          hash: a job (msg, state, result; shaper's sl, sf,
//	                        sp, sc, sq, sd: see lua.go)
//	asynq:{Q}:scheduled     zset, and retry, archived, completed, lease;
//	asynq:{Q}:active        list; paused; groups; g:LANE|FK|PK (a flow);
//	asynq:{Q}:processed...  asynq's daily and total counters
//	asynq:queues            asynq's set of queues (the one untagged key)
//	P:s:{Q}:v, f, l:FK,     the ready structure: virtual times, fairness
//	  r:LANE|FK, cal, pk    keys, lanes, partitions, calendar, parks
//	P:s:{Q}:c               hash: STATE:LANE -> jobs
//	P:s:{Q}:pb              zset: partition -> jobs not yet finished
//	P:s:{Q}:gone            zset: tombstones of dropped jobs (Tombstones)
//	P:s:{Q}:ik[:SPAN]       idempotency records of dropped jobs (Remembered)
//	P:secrets:{Q}:ID:NONCE  a job's sensitive headers
//	P:cancelled:{Q}:ID      a cancelled job's mark
//	P:drain:{U}:SEC         sends to upstream U in one second (Recorder)
//	P:wake                  channel: an upstream has work (WakeChannel)
//	P:final                 channel: jobs made final (FinalChannel, Finals)
//
// The leaky bucket's own keys (P:leaky:{Q}:...) belong to package leaky; the
// take books them through the library leaky gives it.
package jobstore
