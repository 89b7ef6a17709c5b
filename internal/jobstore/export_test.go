package jobstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

// RedisServer is the Redis server TestMain started, for the external tests.
func RedisServer() *redistest.Server { return srv }

// Keys the tests inspect directly.
func (s Space) VKey() string                    { return s.vKey() }
func (s Space) FairKeysKey() string             { return s.fKey() }
func (s Space) CalendarKey() string             { return s.calKey() }
func (s Space) ParkedKey() string               { return s.parkedKey() }
func (s Space) LanesKey(fk string) string       { return s.our + "l:" + fk }
func (s Space) ReadyKey(lane, fk string) string { return s.our + "r:" + lane + "|" + fk }
func (s Space) GroupKey(lane, fk, pk string) string {
	return s.groupPrefix() + lane + "|" + fk + "|" + pk
}

// Check recomputes, from the task hashes of ids (every job the upstream
// ever had) and asynq's own keys, what the scripts' bookkeeping must say,
// and reports every difference:
//
//   - each job is where its state says, and nowhere else: a waiting
//     (aggregating) job in its group, the group in the groups set, its
//     partition in its lane's ready set, the lane either in its fairness
//     key's lane set (and the key in the fairness set) or on the calendar,
//     so that a take can reach it; a scheduled or retrying job in asynq's
//     zset; an active one in the active list and the lease set;
//   - asynq's scheduled, retry, active and lease keys and the groups hold
//     no other job;
//   - the counts hash equals the jobs per state:lane (pending, scheduled,
//     retry, deferred, active, dead, succeeded), with no other field; a
//     retrying job with the deferral mark (sd) is deferred (the mark stays
//     after it leaves the retry set, until an attempt fails: it tells the
//     job's last error a hand-back's);
//   - the partition backlog equals the unfinished jobs per partition.
//
// Stale entries that only cost a take a step (a lane whose partitions all
// left, a partition whose flow is empty) are allowed: the take script
// cleans them when it meets them.
func (s Space) Check(ctx context.Context, rdb redis.Cmdable, ids []string) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	has := func(cmd *redis.FloatCmd) bool {
		if err := cmd.Err(); err != nil {
			if !errors.Is(err, redis.Nil) {
				bad("%v", err)
			}
			return false
		}
		return true
	}
	schedK, retryK, activeK, leaseK := s.a.Scheduled(), s.a.Retry(), s.a.Active(), s.a.Lease()
	archK, compK, groupsK := s.a.Archived(), s.a.Completed(), s.a.Groups()

	active, err := rdb.LRange(ctx, activeK, 0, -1).Result()
	if err != nil {
		return err
	}
	inActive := map[string]int{}
	for _, id := range active {
		inActive[id]++
	}

	want := map[string]int64{} // state:lane
	wantPB := map[string]int64{}
	byState := map[string]int{}
	groups := map[string]bool{}
	for _, id := range ids {
		v, err := rdb.HMGet(ctx, s.TaskKey(id), "state", "group", "sl", "sf", "sp", "sd").Result()
		if err != nil {
			return err
		}
		str := func(i int) string { x, _ := v[i].(string); return x }
		state, group, lane, fk, pk, sd := str(0), str(1), str(2), str(3), str(4), str(5)
		if v[0] == nil {
			// Gone (finished without retention): in no structure.
			if has(rdb.ZScore(ctx, schedK, id)) || has(rdb.ZScore(ctx, retryK, id)) || has(rdb.ZScore(ctx, leaseK, id)) || inActive[id] > 0 {
				bad("job %s has no task hash but is still listed", id)
			}
			continue
		}
		byState[state]++
		unfinished := true
		switch state {
		case "aggregating":
			g := lane + "|" + fk + "|" + pk
			if group != g {
				bad("job %s: group field %q, want %q", id, group, g)
			}
			groups[g] = true
			if !has(rdb.ZScore(ctx, s.groupPrefix()+g, id)) {
				bad("job %s: waiting but not in its flow %s", id, g)
			}
			if ok, _ := rdb.SIsMember(ctx, groupsK, g).Result(); !ok {
				bad("job %s: its group %s is not in asynq's groups set", id, g)
			}
			if !has(rdb.ZScore(ctx, s.ReadyKey(lane, fk), pk)) {
				bad("job %s: partition %q not in ready set of %s|%s: no take can reach it", id, pk, lane, fk)
			}
			inLane := has(rdb.ZScore(ctx, s.LanesKey(fk), lane))
			onCal := has(rdb.ZScore(ctx, s.calKey(), lane+"|"+fk))
			switch {
			case !inLane && !onCal:
				bad("job %s: lane %s of key %q neither active nor on the calendar: no take can reach it", id, lane, fk)
			case inLane && onCal:
				bad("job %s: lane %s of key %q both active and on the calendar", id, lane, fk)
			case inLane && !has(rdb.ZScore(ctx, s.fKey(), fk)):
				bad("job %s: fairness key %q has an active lane but is not in the fairness set", id, fk)
			}
			want["pending:"+lane]++
		case "scheduled":
			if !has(rdb.ZScore(ctx, schedK, id)) {
				bad("job %s: scheduled but not in asynq's scheduled set", id)
			}
			want["scheduled:"+lane]++
		case "retry":
			if !has(rdb.ZScore(ctx, retryK, id)) {
				bad("job %s: retrying but not in asynq's retry set", id)
			}
			if sd == "1" {
				want["deferred:"+lane]++
			} else {
				want["retry:"+lane]++
			}
		case "active":
			if inActive[id] != 1 {
				bad("job %s: active, in the active list %d times, want once", id, inActive[id])
			}
			if !has(rdb.ZScore(ctx, leaseK, id)) {
				bad("job %s: active without a lease", id)
			}
			want["active:"+lane]++
		case "archived":
			if !has(rdb.ZScore(ctx, archK, id)) {
				bad("job %s: archived but not in asynq's archived set", id)
			}
			want["dead:"+lane]++
			unfinished = false
		case "completed":
			if !has(rdb.ZScore(ctx, compK, id)) {
				bad("job %s: completed but not in asynq's completed set", id)
			}
			want["succeeded:"+lane]++
			unfinished = false
		default:
			bad("job %s: unknown state %q", id, state)
		}
		if state != "aggregating" && group != "" {
			bad("job %s: %s with a group field %q", id, state, group)
		}
		if unfinished && pk != "" {
			wantPB[pk]++
		}
	}

	sizes := []struct {
		what string
		n    *redis.IntCmd
		want int
	}{
		{"asynq's scheduled set", rdb.ZCard(ctx, schedK), byState["scheduled"]},
		{"asynq's retry set", rdb.ZCard(ctx, retryK), byState["retry"]},
		{"asynq's active list", rdb.LLen(ctx, activeK), byState["active"]},
		{"asynq's lease set", rdb.ZCard(ctx, leaseK), byState["active"]},
	}
	for _, sz := range sizes {
		if n, err := sz.n.Result(); err != nil || int(n) != sz.want {
			bad("%s holds %d (%v), want %d", sz.what, n, err, sz.want)
		}
	}
	members, err := rdb.SMembers(ctx, groupsK).Result()
	if err != nil {
		return err
	}
	waiting := 0
	for _, g := range members {
		n, err := rdb.ZCard(ctx, s.groupPrefix()+g).Result()
		if err != nil {
			return err
		}
		if n == 0 {
			bad("asynq's groups set names %s, which is empty", g)
		}
		waiting += int(n)
	}
	if waiting != byState["aggregating"] {
		bad("flows hold %d jobs, want %d", waiting, byState["aggregating"])
	}

	got := map[string]int64{}
	m, err := rdb.HGetAll(ctx, s.CountsKey()).Result()
	if err != nil {
		return err
	}
	for f, v := range m {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			bad("counts field %s = %q", f, v)
		}
		got[f] = n
	}
	if !maps.Equal(got, want) {
		bad("counts %v, want %v", sortedMap(got), sortedMap(want))
	}
	pb, err := rdb.ZRangeWithScores(ctx, s.BacklogKey(), 0, -1).Result()
	if err != nil {
		return err
	}
	gotPB := map[string]int64{}
	for _, z := range pb {
		gotPB[z.Member.(string)] = int64(z.Score)
	}
	if !maps.Equal(gotPB, wantPB) {
		bad("partition backlog %v, want %v", sortedMap(gotPB), sortedMap(wantPB))
	}
	return errors.Join(errs...)
}

func sortedMap(m map[string]int64) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(&b, "%s=%d ", k, m[k])
	}
	return strings.TrimSpace(b.String())
}

// TakeLibraries are the libraries the take script is built from.
func TakeLibraries() []string { return takeLibraries() }

// SetLookEvery sets how often a take looks at everything while takes come
// back full (fullLookEvery), the period under way ending at once; not while
// the Taker is in use.
func (t *Taker) SetLookEvery(d time.Duration) { t.lookEvery = d; t.lookAt.Store(0) }

// BookCallsTogether books calls in one script call, in order, as a
// CallBooker's batch does.
func (s Space) BookCallsTogether(ctx context.Context, rdb redis.Scripter, calls []Call) ([]Turn, error) {
	reqs := make([]callReq, len(calls))
	for i, c := range calls {
		reqs[i] = callReq{c, c.Bucket.Plan(c.LeaseAfterSlot)}
	}
	out, err := s.runCalls(ctx, rdb, reqs)
	if err != nil {
		return nil, err
	}
	turns := make([]Turn, len(out))
	for i, r := range out {
		if r.err != nil {
			return nil, r.err
		}
		turns[i] = r.turn
	}
	return turns, nil
}
