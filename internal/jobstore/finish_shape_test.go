package jobstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// TestFinishInOneCallAsOneByOne: a finish sends only what its items need,
// one value for all items where they share it (kind, score, lane), a
// field per item where they do not. Whatever the mix, ending items in one
// call leaves Redis as ending each in a call of its own does: the same
// keys, fields, members, scores and counts (the callbacks' due times, on
// Redis's clock, aside), and the same items reported not active.
func TestFinishInOneCallAsOneByOne(t *testing.T) {
	for seed := range uint64(40) {
		rnd := rand.New(rand.NewPCG(seed, 7))
		ctx := context.Background()
		batch, single := newEnv(t, "shapeA"), newEnvOn(t, srv.Client(t), "shapeB")
		now := time.Now().Truncate(time.Millisecond)
		n := 1 + rnd.IntN(8)
		plans := make([]finishPlan, n)
		for i := range plans {
			plans[i] = randomPlan(rnd, i)
		}
		// (Tasks not taken are laid out last: a take takes the oldest
		// pending.)
		batchItems, singleItems := make([]Finished, n), make([]Finished, n)
		for _, e := range []*env{batch, single} {
			items := batchItems
			if e == single {
				items = singleItems
			}
			for _, taken := range []bool{true, false} {
				for i, p := range plans {
					if p.NotTaken != taken {
						items[i] = p.setUp(e, now)
					}
				}
			}
		}
		opts := func(e *env) []FinishOption {
			return []FinishOption{
				WakeOnRetry("shaper:"+e.k.HashTag()+":v", "wake", "up"),
				AnnounceFinal("final"),
				Callbacks("shaper:" + e.k.HashTag() + ":cb"),
				KeepAtMost(Bounds{Completed: 3, Archived: 2,
					Gone:         Tombstones{Key: "shaper:" + e.k.HashTag() + ":gone", Max: 100, For: time.Hour},
					SidePrefixes: []string{"shaper:cancelled:" + e.k.HashTag() + ":"}}),
			}
		}
		got, err := finishAt(ctx, batch.rdb, batch.k, batch.counts, batch.pbacklog, batchItems, now, opts(batch)...)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		var want []error
		for _, it := range singleItems {
			errs, err := finishAt(ctx, single.rdb, single.k, single.counts, single.pbacklog, []Finished{it}, now, opts(single)...)
			if err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			want = append(want, errs...)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("seed %d, plans %+v: one call says %v, one by one %v", seed, plans, got, want)
		}
		a, b := dumpQueue(t, batch.rdb, "shapeA"), dumpQueue(t, single.rdb, "shapeB")
		if !slices.Equal(a, b) {
			t.Fatalf("seed %d, plans %+v: one call left\n%s\none by one\n%s", seed, plans, strings.Join(a, "\n"), strings.Join(b, "\n"))
		}
	}
}

// finishPlan is one item of TestFinishInOneCallAsOneByOne: how its task is
// laid out and how it ends.
type finishPlan struct {
	ID                string
	Lane, Partition   string
	UnknownLane       bool // the caller knows no lane: the task's is read
	Outcome           Outcome
	Failure           bool
	Retention         time.Duration
	RetryIn           time.Duration
	Result            []byte
	Callback, Unique  bool
	NotTaken, Recover bool // the task is not active; a recovery's item
	LeaseRanOut       bool // (recovery) its lease is up by then
	WaitsFor          string
}

func randomPlan(rnd *rand.Rand, i int) finishPlan {
	pick := func(s ...string) string { return s[rnd.IntN(len(s))] }
	p := finishPlan{ID: fmt.Sprintf("t%d", i), Lane: pick("default", "default", "bulk"), Partition: pick("", "", "p1", "p2"),
		UnknownLane: rnd.IntN(6) == 0, Outcome: Outcome(1 + rnd.IntN(3)), Callback: rnd.IntN(3) == 0,
		NotTaken: rnd.IntN(8) == 0, Recover: rnd.IntN(6) == 0, LeaseRanOut: rnd.IntN(2) == 0}
	switch rnd.IntN(3) {
	case 1:
		p.Result = []byte("result of " + p.ID)
	case 2:
		p.Result = []byte{}
	}
	switch p.Outcome {
	case Succeeded:
		p.Retention = []time.Duration{0, time.Hour, time.Hour, 2 * time.Hour}[rnd.IntN(4)]
		p.Unique = rnd.IntN(3) == 0
	case Retry:
		p.Failure = rnd.IntN(2) == 0
		p.RetryIn = []time.Duration{0, time.Minute, time.Minute, time.Hour}[rnd.IntN(4)]
		if !p.Failure {
			p.WaitsFor = pick("", "", "quota")
		}
	}
	return p
}

// setUp lays the task out in e and returns its item, its times from now.
func (p finishPlan) setUp(e *env, now time.Time) Finished {
	e.t.Helper()
	ctx := context.Background()
	var opts []asynq.Option
	if p.Unique {
		opts = append(opts, asynq.Unique(time.Hour))
	}
	e.enqueue(p.ID, p.Lane, p.Partition, opts...)
	var m *Message
	if p.NotTaken {
		raw, err := e.rdb.HGet(ctx, e.k.Task(p.ID), "msg").Bytes()
		must(e.t, err)
		m, err = Unmarshal(raw)
		must(e.t, err)
	} else {
		lease := now.Add(time.Minute)
		if p.Recover && p.LeaseRanOut {
			lease = now.Add(-time.Second)
		}
		m = e.take(p.ID, lease)
	}
	if p.Callback {
		must(e.t, e.rdb.HSet(ctx, e.k.Task(p.ID), "cb", "shaper:"+e.k.HashTag()+":cb").Err())
	}
	it := Finished{ID: p.ID, Lane: p.Lane, Partition: p.Partition, Msg: m, Outcome: p.Outcome, Result: p.Result,
		Retention: p.Retention, Failure: p.Failure, ErrMsg: "error of " + p.ID, WaitsFor: p.WaitsFor, Callback: p.Callback}
	if p.UnknownLane {
		it.Lane, it.Partition = "", ""
	}
	if p.Outcome == Retry {
		it.RetryAt = now.Add(p.RetryIn)
	}
	if p.Recover {
		it.LeaseLapsedBy = now
	}
	return it
}

// dumpQueue lists every key of the queue named q (its name taken out) with
// its value, sorted. The callbacks' due set is listed without its scores,
// which are Redis's clock's, and a task without the time it was enqueued.
func dumpQueue(t *testing.T, rdb redis.UniversalClient, q string) []string {
	t.Helper()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, "*"+q+"*").Result()
	must(t, err)
	var out []string
	for _, key := range keys {
		var v any
		switch typ := rdb.Type(ctx, key).Val(); typ {
		case "string":
			v = rdb.Get(ctx, key).Val()
		case "hash":
			h := rdb.HGetAll(ctx, key).Val()
			var fs []string
			for f, x := range h {
				if f != "pending_since" { // asynq's enqueue's clock
					fs = append(fs, f+"="+x)
				}
			}
			slices.Sort(fs)
			v = fs
		case "list":
			v = rdb.LRange(ctx, key, 0, -1).Val()
		case "zset":
			if strings.HasSuffix(key, ":cb") {
				v = rdb.ZRange(ctx, key, 0, -1).Val()
			} else {
				v = rdb.ZRangeWithScores(ctx, key, 0, -1).Val()
			}
		case "set":
			m := rdb.SMembers(ctx, key).Val()
			slices.Sort(m)
			v = m
		default:
			t.Fatalf("key %s of type %s", key, typ)
		}
		ttl := rdb.TTL(ctx, key).Val() > 0
		out = append(out, strings.ReplaceAll(fmt.Sprintf("%s (ttl %v): %v", key, ttl, v), q, "Q"))
	}
	slices.Sort(out)
	return out
}
