package tokenbucket

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/script"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

// TestRedisInstructions measures (it asserts nothing) the instructions
// Redis executes per admission decision: a lone caller's on a new bucket
// and on a hot one, and batches of new buckets (as over a large key space)
// and of one hot bucket, at the batch sizes 64 callers make. Instructions
// do not move with the machine's load, as CPU time does. Run it with
//
//	SHAPER_REDIS_CALLGRIND=$(mktemp -d) go test -count=1 -run TestRedisInstructions -v ./tokenbucket/
func TestRedisInstructions(t *testing.T) {
	if _, err := srv.Instructions(); errors.Is(err, redistest.ErrNotCounted) {
		t.Skip("a measurement: set " + redistest.CallgrindEnv)
	}
	ctx := context.Background()
	rdb := srv.Client(t)
	lim := newLimiter(t, rdb, PerSecond(1000, 1000), Config{})
	if _, err := lim.Allow(ctx, "warm-up", 1); err != nil {
		t.Fatal(err)
	}
	if err := allowScript.Load(ctx, rdb).Err(); err != nil {
		t.Fatal(err)
	}
	measure := func(decisions int, op func()) float64 {
		t.Helper()
		if _, err := srv.Instructions(); err != nil {
			t.Fatal(err)
		}
		op()
		ir, err := srv.Instructions()
		if err != nil {
			t.Fatal(err)
		}
		return float64(ir) / float64(decisions)
	}
	var rows []string
	row := func(name string, perDecision float64) {
		rows = append(rows, fmt.Sprintf("| %s | %.1f |", name, perDecision/1000))
	}
	fresh := 0
	newKey := func() string { fresh++; return "n" + strconv.Itoa(fresh) }

	const lone = 400
	row("lone caller, new bucket", measure(lone, func() {
		for range lone {
			if _, err := lim.Allow(ctx, newKey(), 1); err != nil {
				t.Fatal(err)
			}
		}
	}))
	row("lone caller, one hot bucket", measure(lone, func() {
		for range lone {
			if _, err := lim.Allow(ctx, "hot", 1); err != nil {
				t.Fatal(err)
			}
		}
	}))
	for _, per := range []int{1, 8, 20, 32, 64, 128} {
		const batches = 40
		batch := func(key func() string) []*script.Call[request, shaper.Result] {
			calls := make([]*script.Call[request, shaper.Result], per)
			for i := range calls {
				calls[i] = &script.Call[request, shaper.Result]{Req: request{key: lim.key(key()), cost: 1}}
			}
			return calls
		}
		run := func(key func() string) {
			for range batches {
				calls := batch(key)
				lim.run(ctx, calls)
				for _, c := range calls {
					if c.Err != nil {
						t.Fatal(c.Err)
					}
				}
			}
		}
		row(fmt.Sprintf("batch of %d, new buckets", per), measure(batches*per, func() { run(newKey) }))
		row(fmt.Sprintf("batch of %d, one hot bucket", per), measure(batches*per, func() { run(func() string { return "hot" }) }))
	}
	t.Logf("Redis instructions per decision (thousands; callgrind):\n| decisions | per decision |\n| --- | ---: |\n%s", strings.Join(rows, "\n"))
}
