package jobstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/queue"
)

// finishCase is one kind of finish to measure: a job's end as the
// dispatcher makes it, under the dispatcher's options.
type finishCase struct {
	name string
	k    int // jobs per finish
	// item makes the Finished for a taken job (the message as the
	// dispatcher has it).
	item func(r *rig, id string) jobstore.Finished
	// bound, when set, is the upstream's ResultMaxCount and DeadMaxCount,
	// which the warm-up reaches, so that each measured finish trims.
	bound    int
	callback bool
	idem     bool // IDs made from idempotency keys (records, not tombstones)
	// inFlight more jobs are taken and not yet finished, the oldest
	// finished first, as with a few replicas' workers busy.
	inFlight int
}

func irMsg(r *rig, id string) *jobstore.Message {
	return &jobstore.Message{Type: "http", ID: id, Queue: r.space.Queue, Payload: irPayload, Retry: 8}
}

func keptItem(r *rig, id string) jobstore.Finished {
	return jobstore.Finished{ID: id, Lane: r.lane[id], Msg: irMsg(r, id), Outcome: jobstore.Succeeded,
		Retention: 24 * time.Hour, Result: []byte(`{"status":200}`), Callback: r.cb[id]}
}

// TestFinishInstructions measures (it asserts nothing) the instructions
// Redis executes for the finish script alone, the take before each finish
// not counted, and the commands it runs (INFO commandstats, calls inside
// scripts included), per call and per job. The instructions are those of
// Redis's command path (processInputBuffer: reading the call, the script,
// the commands it runs, Lua's garbage collection), not of its timers or of
// writing the reply, so that a call measures the same on a loaded machine
// (a window's timers vary with its length). Each upstream first finishes
// finishWarmUp jobs its row's way, unmeasured, so that its sets are as
// large as a busy upstream's (Redis stores a small set otherwise, and
// its cost grows with each member) and a bounded one is at its bound,
// with as many tombstones (or records) as it keeps.
// Run it with
//
//	SHAPER_REDIS_CALLGRIND=$(mktemp -d) go test -count=1 -run TestFinishInstructions -v ./internal/jobstore/
//
// (-run 'TestFinishInstructions/kept-1:' for one row; SHAPER_FINISH_WINDOWS=1
// lists each measured call).
func TestFinishInstructions(t *testing.T) {
	if _, err := srv().Instructions(); errors.Is(err, redistest.ErrNotCounted) {
		t.Skip("a measurement: set " + redistest.CallgrindEnv)
	}
	ctx := context.Background()
	rdb := srv().Client(t)
	retryItem := func(failure bool, msg string) func(r *rig, id string) jobstore.Finished {
		return func(r *rig, id string) jobstore.Finished {
			return jobstore.Finished{ID: id, Lane: r.lane[id], Msg: irMsg(r, id), Outcome: jobstore.Retry, Failure: failure,
				RetryAt: time.Now().Add(time.Hour), ErrMsg: msg}
		}
	}
	cases := []finishCase{
		{name: "kept-1: success kept 24 h, 1 job", k: 1, item: keptItem},
		{name: "kept-4: success kept 24 h, 4 jobs", k: 4, item: keptItem},
		{name: "kept-10: success kept 24 h, 10 jobs", k: 10, item: keptItem},
		{name: "busy-1: success kept 24 h, 1 job, 40 others in flight", k: 1, item: keptItem, inFlight: 40},
		{name: "busy-4: success kept 24 h, 4 jobs, 40 others in flight", k: 4, item: keptItem, inFlight: 40},
		{name: "bound-1: success kept, at the bound (trims 1: tombstone), 1 job", k: 1, item: keptItem, bound: finishWarmUp},
		{name: "bound-4: success kept, at the bound (trims 4: tombstones), 4 jobs", k: 4, item: keptItem, bound: finishWarmUp},
		{name: "boundrec-1: success kept, at the bound (trims 1: idempotency record), 1 job", k: 1, item: keptItem,
			bound: finishWarmUp, idem: true},
		{name: "callback-1: success kept, with a callback, 1 job", k: 1, item: keptItem, callback: true},
		{name: "dropped-1: success not kept (idempotency record), 1 job", k: 1, idem: true, item: func(r *rig, id string) jobstore.Finished {
			return jobstore.Finished{ID: id, Lane: r.lane[id], Msg: irMsg(r, id), Outcome: jobstore.Succeeded}
		}},
		{name: "retry-1: a failure's retry, 1 job", k: 1, item: retryItem(true, "upstream answered 500")},
		{name: "defer-1: a deferral (429), 1 job", k: 1, item: retryItem(false, "upstream answered 429")},
		{name: "dead-1: dead, 1 job", k: 1, item: func(r *rig, id string) jobstore.Finished {
			return jobstore.Finished{ID: id, Lane: r.lane[id], Msg: irMsg(r, id), Outcome: jobstore.Dead, ErrMsg: "upstream answered 400"}
		}},
	}
	const n = 30
	if _, err := exec.LookPath("callgrind_annotate"); err != nil {
		t.Skip("a measurement: needs callgrind_annotate")
	}
	var rows []string
	for ci, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			u := fast(fmt.Sprintf("fc%d", ci))
			if c.bound > 0 {
				u.ResultMaxCount, u.DeadMaxCount = c.bound, c.bound
			}
			r := newRig(t, rdb, u, 50*time.Millisecond)
			// A bounded upstream finishes as many again, trimmed: its
			// tombstones, or records, are as many.
			warm := finishWarmUp
			if c.bound > 0 {
				warm += c.bound
			}
			for i := range warm + n*c.k + c.inFlight {
				id := fmt.Sprintf("%s-%d", r.u.Name, i)
				if c.idem {
					id = queue.IdempotentID("", r.u.Name, "default", fmt.Sprint(i))
				}
				e := r.entry(job{id: id})
				e.Msg, e.Callback = irMsg(r, id).Marshal(), c.callback
				if ok, err := r.space.Enqueue(ctx, rdb, e); err != nil || !ok {
					t.Fatalf("enqueue %s: created %v, err %v", id, ok, err)
				}
				r.lane[id], r.cb[id] = e.Lane, c.callback
			}
			held := r.takeIDs(c.inFlight)
			// finish takes k jobs and finishes the k taken first, and
			// returns what the finish alone cost when measured:
			// instructions and commands.
			finish := func(measure bool) (int64, int64) {
				took := r.takeIDs(c.k)
				if len(took) != c.k {
					t.Fatalf("took %d, want %d", len(took), c.k)
				}
				held = append(held, took...)
				ids := held[:c.k:c.k]
				held = held[c.k:]
				items := make([]jobstore.Finished, len(ids))
				for j, id := range ids {
					items[j] = c.item(r, id)
				}
				var s0 int64
				if measure {
					s0 = commandTotal(t, rdb)
					if _, err := srv().Instructions(); err != nil {
						t.Fatal(err)
					}
				}
				errs, err := jobstore.Finish(ctx, rdb, r.store, r.space.CountsKey(), r.space.BacklogKey(), items,
					jobstore.WakeOnRetry(r.space.SleepKey(), jobstore.WakeChannel(""), r.u.Name),
					jobstore.KeepAtMost(r.space.FinishBounds(r.u, queue.IdempotentIDPattern)), jobstore.AnnounceFinal(jobstore.FinalChannel("")),
					jobstore.Callbacks(r.space.CallbacksDueKey()))
				if err != nil {
					t.Fatal(err)
				}
				for j, e := range errs {
					if e != nil {
						t.Fatalf("finish %s: %v", ids[j], e)
					}
				}
				if !measure {
					return 0, 0
				}
				if _, err := srv().Instructions(); err != nil {
					t.Fatal(err)
				}
				// Less the INFO before and the EVALSHA.
				return commandPath(t), commandTotal(t, rdb) - s0 - 2
			}
			for range warm / c.k {
				finish(false)
			}
			var ir, cmds int64
			each := make([]int64, n)
			for i := range n {
				got, c := finish(true)
				ir, cmds, each[i] = ir+got, cmds+c, got
				if os.Getenv("SHAPER_FINISH_WINDOWS") != "" {
					t.Logf("call %d: %dk", i, got/1000)
				}
			}
			// The median leaves out the calls that Lua's garbage
			// collector or Redis's timers happened to run in; the mean
			// has them.
			slices.Sort(each)
			per, mid := float64(ir)/n/1000, float64(each[n/2])/1000
			rows = append(rows, fmt.Sprintf("| %s | %.0f | %.0f | %.0f | %.1f | %.1f |", c.name, mid, per, per/float64(c.k),
				float64(cmds)/n, float64(cmds)/n/float64(c.k)))
		})
	}
	t.Logf("finish alone (thousands of Redis instructions on its command path, callgrind; commands inside the script):\n"+
		"| finish | median call | mean call | mean per job | commands per call | per job |\n| --- | ---: | ---: | ---: | ---: | ---: |\n%s",
		strings.Join(rows, "\n"))
}

// commandPath is what Redis's command path (processInputBuffer, inclusive)
// cost in the window of the server's newest callgrind dump.
func commandPath(t *testing.T) int64 {
	t.Helper()
	dumps, _ := filepath.Glob(filepath.Join(os.Getenv(redistest.CallgrindEnv), "redis.*.out.*"))
	if len(dumps) == 0 {
		t.Fatal("no callgrind dump")
	}
	newest := dumps[0]
	for _, d := range dumps {
		if dumpSeq(d) > dumpSeq(newest) {
			newest = d
		}
	}
	out, err := exec.Command("callgrind_annotate", "--inclusive=yes", "--threshold=100", newest).Output()
	if err != nil {
		t.Fatalf("callgrind_annotate %s: %v", newest, err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) >= 3 && strings.HasSuffix(f[2], ":processInputBuffer") {
			n, err := strconv.ParseInt(strings.ReplaceAll(f[0], ",", ""), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	return 0 // no command in the window
}

// dumpSeq is a callgrind dump's number (redis.PID.out.N).
func dumpSeq(path string) int {
	n, _ := strconv.Atoi(path[strings.LastIndexByte(path, '.')+1:])
	return n
}

// finishWarmUp is how many jobs TestFinishInstructions finishes on each
// upstream before it measures: more than Redis keeps in a small set's
// compact encoding (zset-max-listpack-entries, 128).
const finishWarmUp = 200

// commandTotal is how many commands Redis has run in all, by INFO
// commandstats, a script's calls counted one by one.
func commandTotal(t *testing.T, rdb redis.Cmdable) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, line := range strings.Split(info, "\n") {
		_, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		v, _, _ := strings.Cut(rest, ",")
		var c int64
		fmt.Sscan(v, &c)
		sum += c
	}
	return sum
}
