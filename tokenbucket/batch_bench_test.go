package tokenbucket

import (
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/script"
)

// redisCPU is the test server's CPU time so far, in µs.
func redisCPU(b *testing.B, rdb *redis.Client) float64 {
	b.Helper()
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		for _, f := range []string{"used_cpu_user:", "used_cpu_sys:"} {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), f); ok {
				s, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatal(err)
				}
				total += s * 1e6
			}
		}
	}
	return total
}

// BenchmarkBatchScript is what the batch script costs Redis per decision
// with the client taken out: batches of one request of cost 1 per bucket
// (as over a large key space), on fresh buckets (space=0) or drawn from
// 100,000, two script calls per pipeline as two batches in flight send
// them. Redis's CPU time is divided by the decisions (redisµs/op).
//
//	go test ./tokenbucket -run '^$' -bench BatchScript -benchtime 200000x -count 3
func BenchmarkBatchScript(b *testing.B) {
	for _, space := range []int{0, 100000} {
		for _, per := range []int{20, 80} {
			b.Run("space="+strconv.Itoa(space)+"/keys/batch="+strconv.Itoa(per), func(b *testing.B) {
				rdb := srv.Client(b)
				ctx := context.Background()
				lim, err := New(rdb, PerSecond(1000, 1000), Config{})
				if err != nil {
					b.Fatal(err)
				}
				if err := allowScript.Load(ctx, rdb).Err(); err != nil {
					b.Fatal(err)
				}
				k := 0
				rng := rand.New(rand.NewPCG(1, 2))
				if err := rdb.FlushAll(ctx).Err(); err != nil {
					b.Fatal(err)
				}
				batch := func() script.Invocation {
					calls := make([]*script.Call[request, shaper.Result], per)
					for i := range calls {
						name := k
						if space > 0 {
							name = rng.IntN(space)
						}
						calls[i] = &script.Call[request, shaper.Result]{Req: request{key: lim.key("b" + strconv.Itoa(name)), cost: 1}}
						k++
					}
					invs, _ := lim.plan(calls, "")
					return invs[0]
				}
				before := redisCPU(b, rdb)
				b.ResetTimer()
				for n := 0; n < b.N; n += 2 * per {
					_, errs := script.RunPipelined(ctx, rdb, "token bucket", allowScript, []script.Invocation{batch(), batch()})
					for _, err := range errs {
						if err != nil {
							b.Fatal(err)
						}
					}
				}
				b.StopTimer()
				b.ReportMetric((redisCPU(b, rdb)-before)/float64(k), "redisµs/op")
			})
		}
	}
}
