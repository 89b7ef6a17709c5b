package jobstore

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// BenchmarkFinish ends batches of 200 taken tasks, half kept as completed
// and half retried, with 200 more tasks left in the active list.
func BenchmarkFinish(b *testing.B) {
	ctx := context.Background()
	rdb := srv.Client(b)
	rdb.FlushAll(ctx)
	rdb.ConfigResetStat(ctx)
	k := AsynqKeys("bench")
	counts, pbacklog := "shaper:"+k.HashTag()+":counts", "shaper:"+k.HashTag()+":pbacklog"
	const batch, others = 200, 200
	takeAll := func(prefix string, n int) []Finished {
		items := make([]Finished, n)
		_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := range items {
				id := prefix + strconv.Itoa(i)
				m := &Message{Type: "call", ID: id, Queue: "bench", Retry: 5, Payload: make([]byte, 512)}
				p.HSet(ctx, k.Task(id), "msg", m.Marshal(), "state", "active", "sl", "default", "sp", "acct")
				p.LPush(ctx, k.Active(), id)
				p.ZAdd(ctx, k.Lease(), redis.Z{Score: float64(time.Now().Add(time.Hour).Unix()), Member: id})
				p.HIncrBy(ctx, counts, "active:default", 1)
				p.ZIncrBy(ctx, pbacklog, 1, "acct")
				items[i] = Finished{ID: id, Lane: "default", Partition: "acct", Msg: m, Outcome: Succeeded, Retention: time.Hour}
				if i%2 == 1 {
					items[i] = Finished{ID: id, Lane: "default", Partition: "acct", Msg: m, Outcome: Retry,
						Failure: true, RetryAt: time.Now().Add(time.Minute), ErrMsg: "503"}
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		return items
	}
	takeAll("other-", others)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		items := takeAll("b"+strconv.Itoa(i)+"-", batch)
		b.StartTimer()
		errs, err := Finish(ctx, rdb, k, counts, pbacklog, items)
		if err != nil || errs[0] != nil {
			b.Fatal(err, errs[0])
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*batch), "µs/task")
	// What Redis itself spent, apart from the client and the network.
	if stats, err := rdb.Info(ctx, "commandstats").Result(); err == nil {
		for _, line := range strings.Split(stats, "\n") {
			if strings.HasPrefix(line, "cmdstat_evalsha:") {
				b.Log(strings.TrimSpace(line))
			}
		}
	}
}
