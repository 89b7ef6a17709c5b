package jobstore_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/internal/script"
)

// redisCPU is the Redis server's CPU time so far, in seconds.
func redisCPU(t *testing.T) float64 {
	info := srv().Client(t).Info(context.Background(), "cpu").Val()
	var s float64
	for _, l := range strings.Split(info, "\n") {
		l = strings.TrimSpace(l)
		for _, k := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(l, k); ok {
				f, _ := strconv.ParseFloat(v, 64)
				s += f
			}
		}
	}
	return s
}

// TestTakeRedisCPUPerCall measures (it asserts nothing) what Redis spends
// on one take call, beside a trivial script, the take's libraries alone
// (closures built per call), ten redis.call of HGET and a plain HGET: the
// figures BENCHMARKS.md "Where Redis's CPU goes" cites. Run with
// SHAPER_TAKE_CPU=1 go test -run TestTakeRedisCPUPerCall -v ./internal/jobstore/
func TestTakeRedisCPUPerCall(t *testing.T) {
	if os.Getenv("SHAPER_TAKE_CPU") == "" {
		t.Skip("a measurement: set SHAPER_TAKE_CPU=1")
	}
	ctx := context.Background()
	rdb := srv().Client(t)
	const n = 3000
	c0 := redisCPU(t)
	for i := 0; i < n; i++ {
		rdb.Eval(ctx, "return 1", []string{"x"})
	}
	c1 := redisCPU(t)
	src := script.Prelude + strings.Join(jobstore.TakeLibraries(), "")
	libs := redis.NewScript(src + "\nreturn 1")
	libs.Run(ctx, rdb, []string{"x"})
	cl0 := redisCPU(t)
	for i := 0; i < n; i++ {
		libs.Run(ctx, rdb, []string{"x"})
	}
	cl1 := redisCPU(t)
	t.Logf("libs only: %.1f µs", (cl1-cl0)/n*1e6)
	ten := redis.NewScript("for i = 1, 10 do redis.call('HGET', KEYS[1], 'f') end return 1")
	ten.Run(ctx, rdb, []string{"x"})
	ct0 := redisCPU(t)
	for i := 0; i < n; i++ {
		ten.Run(ctx, rdb, []string{"x"})
	}
	ct1 := redisCPU(t)
	t.Logf("10 HGETs: %.1f µs", (ct1-ct0)/n*1e6)
	rdb.HSet(ctx, "y", "f", "1")
	p0 := redisCPU(t)
	for i := 0; i < n; i++ {
		rdb.HGet(ctx, "y", "f")
	}
	p1 := redisCPU(t)
	t.Logf("top-level HGET: %.1f µs", (p1-p0)/n*1e6)
	r := newRig(t, rdb, fast("prof"), 50*time.Millisecond)
	r.take(1)
	c2 := redisCPU(t)
	for i := 0; i < n; i++ {
		r.take(1)
	}
	c3 := redisCPU(t)
	for i := 0; i < n; i++ {
		r.add(job{id: "j" + strconv.Itoa(i)})
	}
	c4 := redisCPU(t)
	for i := 0; i < n; i++ {
		if len(r.takeIDs(1)) != 1 {
			t.Fatal("no job")
		}
	}
	c5 := redisCPU(t)
	t.Logf("per call: trivial eval %.1f µs, empty take %.1f µs, one-job take %.1f µs", (c1-c0)/n*1e6, (c3-c2)/n*1e6, (c5-c4)/n*1e6)
}
