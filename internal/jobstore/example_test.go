package jobstore

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

func ExampleAsynqKeys() {
	k := AsynqKeys("stripe")
	fmt.Println(k.Task("job-1"))
	fmt.Println(k.Lease())
	fmt.Println(k.Processed(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)))
	// Output:
	// asynq:{stripe}:t:job-1
	// asynq:{stripe}:lease
	// asynq:{stripe}:processed:2026-11-30
}

func ExampleUnmarshal() {
	m := &Message{Type: "call", ID: "job-1", Queue: "stripe", Retry: 3, Retried: 1, ErrorMsg: "HTTP 503"}
	got, err := Unmarshal(m.Marshal())
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s in %s: %d of %d, last error %q\n", got.ID, got.Queue, got.Retried, got.Retry, got.ErrorMsg)
	// Output: job-1 in stripe: 1 of 3, last error "HTTP 503"
}

func ExampleScore() {
	at := time.UnixMilli(1764500000250)
	fmt.Println(Score(at))
	fmt.Println(ScoreTime(1764500000.25).Equal(at))
	// Output:
	// 1764500000.250
	// true
}

// A worker ends the tasks it ran in one call: here one succeeded, and one
// whose lease had already run out, so another replica recovered it.
func ExampleFinish() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	rdb.FlushAll(ctx)
	k := AsynqKeys("stripe")
	counts, pbacklog := "shaper:"+k.HashTag()+":counts", "shaper:"+k.HashTag()+":pbacklog"

	// What the enqueue and take scripts would have left: one task taken.
	m := &Message{Type: "call", ID: "job-1", Queue: "stripe", Retry: 3}
	rdb.HSet(ctx, k.Task("job-1"), "msg", m.Marshal(), "state", "active", "sl", "default", "sp", "acct-9")
	rdb.LPush(ctx, k.Active(), "job-1")
	rdb.ZAdd(ctx, k.Lease(), redis.Z{Score: float64(time.Now().Add(time.Minute).Unix()), Member: "job-1"})
	rdb.HSet(ctx, counts, "active:default", 1)
	rdb.ZAdd(ctx, pbacklog, redis.Z{Score: 1, Member: "acct-9"})

	errs, err := Finish(ctx, rdb, k, counts, pbacklog, []Finished{
		{ID: "job-1", Lane: "default", Partition: "acct-9", Msg: m, Outcome: Succeeded,
			Result: []byte(`{"id":"ch_1"}`), Retention: time.Hour},
		{ID: "job-2", Lane: "default", Msg: &Message{ID: "job-2", Queue: "stripe"}, Outcome: Retry},
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(errs)
	fmt.Println(rdb.HMGet(ctx, k.Task("job-1"), "state", "result").Val())
	fmt.Println(rdb.HGetAll(ctx, counts).Val())
	fmt.Println(rdb.ZCard(ctx, pbacklog).Val())
	// Output:
	// [<nil> task is not active]
	// [completed {"id":"ch_1"}]
	// map[succeeded:default:1]
	// 0
}

// A queue that keeps at most two succeeded tasks: finishing a third drops
// the oldest, which leaves a tombstone, so a read can tell it finished.
func ExampleKeepAtMost() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	rdb.FlushAll(ctx)
	k := AsynqKeys("stripe")
	counts, pbacklog := "shaper:"+k.HashTag()+":counts", "shaper:"+k.HashTag()+":pbacklog"
	b := Bounds{Completed: 2, Gone: Tombstones{Key: "shaper:" + k.HashTag() + ":gone", Max: 100, For: time.Hour}}

	for i, id := range []string{"job-1", "job-2", "job-3"} {
		m := &Message{Type: "call", ID: id, Queue: "stripe", Retry: 3}
		rdb.HSet(ctx, k.Task(id), "msg", m.Marshal(), "state", "active", "sl", "default")
		rdb.LPush(ctx, k.Active(), id)
		rdb.ZAdd(ctx, k.Lease(), redis.Z{Score: float64(time.Now().Add(time.Minute).Unix()), Member: id})
		rdb.HIncrBy(ctx, counts, "active:default", 1)
		_, err := Finish(ctx, rdb, k, counts, pbacklog, []Finished{
			{ID: id, Lane: "default", Msg: m, Outcome: Succeeded, Retention: time.Hour + time.Duration(i)*time.Second}},
			KeepAtMost(b))
		if err != nil {
			panic(err)
		}
	}
	fmt.Println(rdb.ZRange(ctx, k.Completed(), 0, -1).Val())
	fmt.Println(rdb.HGetAll(ctx, counts).Val())
	gone, _ := b.Gone.WasDeleted(ctx, rdb, "job-1")
	never, _ := b.Gone.WasDeleted(ctx, rdb, "job-9")
	fmt.Println(gone, never)
	// Output:
	// [job-2 job-3]
	// map[succeeded:default:2]
	// true false
}
