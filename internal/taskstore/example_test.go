package taskstore

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

func ExampleFor() {
	k := For("stripe")
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
	k := For("stripe")
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
