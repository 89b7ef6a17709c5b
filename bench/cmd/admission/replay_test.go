package main

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/bench/internal/redisproc"
	"github.com/shaperhq/shaper/bench/internal/redisstats"
	"github.com/shaperhq/shaper/tokenbucket"
)

// recorder is a go-redis hook that keeps the last command's arguments.
type recorder struct{ last []any }

func (r *recorder) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *recorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.last = slices.Clone(cmd.Args())
		return next(ctx, cmd)
	}
}
func (r *recorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// BenchmarkScriptReplay is what one lone decision's script costs Redis
// with the round trip taken out: each limiter's own EVALSHA for one
// decision, recorded from a real call, is sent again in pipelines of 100
// with the key changed, and Redis's CPU time is divided by the decisions.
func BenchmarkScriptReplay(b *testing.B) {
	srv, err := redisproc.Start()
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Stop()
	ctx := context.Background()
	for _, keys := range []int{1, 100000} {
		for _, name := range []string{"shaper", "redis_rate"} {
			b.Run(name+"/keys="+strconv.Itoa(keys), func(b *testing.B) {
				rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
				defer rdb.Close()
				if err := rdb.FlushAll(ctx).Err(); err != nil {
					b.Fatal(err)
				}
				rec := &recorder{}
				rdb.AddHook(rec)
				key := func(i int) string { return "rate:k" + strconv.Itoa(i) }
				switch name {
				case "shaper":
					lim, err := tokenbucket.New(rdb, tokenbucket.PerSecond(1000, 1000), tokenbucket.Config{})
					if err != nil {
						b.Fatal(err)
					}
					for range 2 { // the first loads the script by EVAL
						if _, err := lim.Allow(ctx, "k", 1); err != nil {
							b.Fatal(err)
						}
					}
					key = func(i int) string { return "shaper:tb:{k" + strconv.Itoa(i) + "}" }
				default:
					for range 2 {
						if _, err := redis_rate.NewLimiter(rdb).Allow(ctx, "k", redis_rate.Limit{Rate: 1000, Burst: 1000, Period: time.Second}); err != nil {
							b.Fatal(err)
						}
					}
				}
				args := rec.last // evalsha, sha, 1, key, args...
				if len(args) < 4 || args[0] != "evalsha" {
					b.Fatalf("recorded %q, want an evalsha", args)
				}
				before, err := redisstats.Take(srv)
				if err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for n := 0; n < b.N; {
					p := rdb.Pipeline()
					for j := 0; j < 100 && n < b.N; j++ {
						a := slices.Clone(args)
						a[3] = key(n % keys)
						p.Do(ctx, a...)
						n++
					}
					if _, err := p.Exec(ctx); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				after, err := redisstats.Take(srv)
				if err != nil {
					b.Fatal(err)
				}
				d := after.Since(before)
				b.ReportMetric(float64(d.CPU.Nanoseconds())/1000/float64(b.N), "redisµs/op")
				b.ReportMetric(float64(d.Total())/float64(b.N), "rediscmds/op")
			})
		}
	}
}
