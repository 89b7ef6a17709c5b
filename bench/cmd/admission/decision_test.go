package main

import (
	"context"
	"strconv"
	"testing"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/bench/internal/redisproc"
	"github.com/shaperhq/shaper/bench/internal/redisstats"
	"github.com/shaperhq/shaper/tokenbucket"
)

// BenchmarkOneCaller is one caller's decisions, one at a time, for each
// limiter: with -benchmem it gives the client's allocations per decision,
// and it reports Redis's commands and CPU per decision.
func BenchmarkOneCaller(b *testing.B) {
	srv, err := redisproc.Start()
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Stop()
	ctx := context.Background()
	for _, keys := range []int{1, 100000} {
		names := make([]string, keys)
		for i := range names {
			names[i] = "k" + strconv.Itoa(i)
		}
		for _, name := range []string{"shaper", "redis_rate"} {
			b.Run(name+"/keys="+strconv.Itoa(keys), func(b *testing.B) {
				rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
				defer rdb.Close()
				var allow decide
				switch name {
				case "shaper":
					lim, err := tokenbucket.New(rdb, tokenbucket.PerSecond(1000, 1000), tokenbucket.Config{})
					if err != nil {
						b.Fatal(err)
					}
					allow = func(ctx context.Context, key string) error { _, err := lim.Allow(ctx, key, 1); return err }
				default:
					lim := redis_rate.NewLimiter(rdb)
					l := redis_rate.Limit{Rate: 1000, Burst: 1000, Period: 1e9}
					allow = func(ctx context.Context, key string) error { _, err := lim.Allow(ctx, key, l); return err }
				}
				if err := allow(ctx, "warm-up"); err != nil {
					b.Fatal(err)
				}
				before, err := redisstats.Take(srv)
				if err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					if err := allow(ctx, names[i%keys]); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				after, err := redisstats.Take(srv)
				if err != nil {
					b.Fatal(err)
				}
				d := after.Since(before)
				n := float64(b.N)
				b.ReportMetric(float64(d.Total())/n, "rediscmds/op")
				b.ReportMetric(float64(d.CPU.Microseconds())/n, "redisµs/op")
				b.Log(d.PerJob(int64(b.N), 0.01))
				st, _ := srv.Info("commandstats")
				b.Log(st["cmdstat_evalsha"])
			})
		}
	}
}

// BenchmarkManyCallers is 64 callers over 100,000 keys on shaper's limiter
// alone, for profiling the client side.
func BenchmarkManyCallers(b *testing.B) {
	srv, err := redisproc.Start()
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Stop()
	ctx := context.Background()
	names := make([]string, 100000)
	for i := range names {
		names[i] = "k" + strconv.Itoa(i)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	lim, err := tokenbucket.New(rdb, tokenbucket.PerSecond(1000, 1000), tokenbucket.Config{})
	if err != nil {
		b.Fatal(err)
	}
	before, _ := redisstats.Take(srv)
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, err := lim.Allow(ctx, names[(i*7919)%len(names)], 1); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
	b.StopTimer()
	after, _ := redisstats.Take(srv)
	d := after.Since(before)
	b.ReportMetric(float64(d.CPU.Microseconds())/float64(b.N), "redisµs/op")
	b.ReportMetric(float64(d.Scripts())/float64(b.N), "scripts/op")
	b.Log(d.PerJob(int64(b.N), 0.0001))
}
