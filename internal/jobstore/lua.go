package jobstore

import (
	"embed"
	"fmt"

	"github.com/shaperhq/shaper/internal/gcra"
	"github.com/shaperhq/shaper/internal/script"
	"github.com/shaperhq/shaper/leaky"
)

// The ready structure of one upstream. Every key shares the hash tag of the
// upstream's asynq queue, {shaper.NAME}, so each script touches one
// Redis Cluster slot. Keys the scripts build at run time (a lane's zset, a
// flow's group, a partition's TAT) are made from prefixes passed in ARGV
// and carry the same tag.
//
//	P:s:{Q}:v          hash: seq (FIFO counter), sleep (a worker sleeps); the
//	                   virtual times are the lowest scores of f and l:FK
//	P:s:{Q}:f          zset: fairness key FK -> virtual start, FKs with work
//	P:s:{Q}:l:FK       zset: lane -> virtual start within FK, lanes with work
//	P:s:{Q}:r:LANE|FK  zset: partition PK -> µs when it can next send
//	P:s:{Q}:cal        zset: LANE|FK -> µs when its earliest partition can send,
//	                   for lanes whose every partition is parked
//	P:s:{Q}:c          hash: STATE:LANE -> jobs (pending scheduled retry
//	                   deferred active dead succeeded); retry counts jobs
//	                   waiting after a failed attempt, deferred those handed
//	                   back to wait (a 429) without spending one
//	P:s:{Q}:pb         zset: PK -> jobs not yet finished
//	P:s:{Q}:pk         zset: LANE|FK|PK -> µs until which the flow's partition
//	                   is parked for its limits (members whose time passed
//	                   are stale: status counts only later ones)
//	asynq:{Q}:g:LANE|FK|PK  a flow: asynq's group zset, job id -> FIFO seq
//	P:leaky:{Q}:p:PK:LIMIT  a partition's TAT per partition limit
//
// A job waiting in a flow is, to asynq's Inspector, an aggregating task of
// group LANE|FK|PK; the task hash also carries shaper's fields sl (lane), sf
// (fairness key), sp (partition), sc (costs "name=n,..."), sq (FIFO seq),
// and sd (set when the job is handed back to wait, not failed: what it
// waits for, "1" for nothing named; it stays until an attempt fails, the job
// dies or is retried, so the last error reads as a hand-back's; a cancel
// keeps it for a retry to read; see Finish).

// Every script is a file of lua/, whose opening comment is its contract
// (KEYS, ARGV, what it returns); the files that are libraries of local
// functions (calls, count, flow, forward, optional, remember, trim) say
// what they define and which other library they need before them.
// script.New puts its prelude first.

//go:embed lua/*.lua
var luaFiles embed.FS

// lua is the source of one file of lua/.
func lua(name string) string {
	b, err := luaFiles.ReadFile("lua/" + name)
	if err != nil {
		panic("jobstore: no script " + name)
	}
	return string(b)
}

// The ready structure's scripts: enqueue, take, and the ways a waiting job
// moves (requeue, cancel, run now, revive) or is read (job hold,
// holds).
var (
	enqueueScript = script.New(lua("remember.lua"), lua("optional.lua"), lua("count.lua"), lua("flow.lua"), lua("enqueue.lua"))
	takeScript    = script.New(append(takeLibraries(), fmt.Sprintf("local PAUSED_POLL = %d\n", PausedPoll.Microseconds()), lua("take.lua"))...)
	requeueScript = script.New(lua("count.lua"), lua("flow.lua"), lua("requeue.lua"))
	cancelScript  = script.New(lua("callback.lua"), lua("cancel.lua"))
	runNowScript  = script.New(lua("count.lua"), lua("flow.lua"), lua("run_now.lua"))
	reviveScript  = script.New(lua("count.lua"), lua("flow.lua"), lua("revive.lua"))
	jobHoldScript = script.New(lua("job_hold.lua"))
	holdsScript   = script.New(lua("holds.lua"))
)

// takeLibraries are the libraries take.lua needs before it. The take builds
// those of its rarer paths (moving due jobs, yielding to proxied calls) only
// on those paths (script.Lazy).
func takeLibraries() []string {
	return []string{gcra.LuaFunctions, leaky.BookingLua(), lua("count.lua"),
		script.Lazy("take_forward", []string{"space", "forward_due", "due_firsts", "first_score"}, lua("flow.lua"), lua("forward.lua")),
		script.Lazy("take_calls", []string{"call_keys", "call_ahead", "call_lane_first", "CALL_YIELD", "CALL_MARK",
			"part_mark", "part_marks", "part_lapse"},
			fmt.Sprintf("local CALL_MARK = %d", CallMark.Microseconds()), lua("calls.lua"), lua("partmarks.lua"))}
}

// The scripts of a taken task's end (finish, with the lease's extension and
// the recovery's list of expired ones), of retention (delete expired) and of
// idempotency records (recall).
var (
	finishScript        = script.New(lua("remember.lua"), lua("trim.lua"), lua("callback.lua"), lua("finish.lua"))
	drainAddScript      = script.New(lua("drain_add.lua"))
	extendScript        = script.New(lua("extend.lua"))
	waitingScript       = script.New(lua("waiting.lua"))
	expiredScript       = script.New(lua("expired.lua"))
	deleteExpiredScript = script.New(lua("remember.lua"), lua("trim.lua"), lua("delete_expired.lua"))
	recallScript        = script.New(lua("remember.lua"), lua("recall.lua"))
)

// pageScript reads a page of an index for a listing (ReadIndex).
var pageScript = script.New(lua("page.lua"))

// The scripts of callback deliveries (callback.go): claim the due ones
// under a lease, record an attempt's outcome, queue a failed one again.
var (
	callbackClaimScript = script.New(lua("callback_claim.lua"))
	callbackDoneScript  = script.New(lua("callback_done.lua"))
	callbackRetryScript = script.New(lua("callback_retry.lua"))
)
