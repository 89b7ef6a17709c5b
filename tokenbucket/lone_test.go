package tokenbucket

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/shaperhq/shaper/internal/script"
)

// commandCalls is how many times each command ran since the last CONFIG
// RESETSTAT, commands inside scripts included.
func commandCalls(t *testing.T, info string) map[string]int {
	t.Helper()
	calls := map[string]int{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
		if err != nil {
			t.Fatalf("commandstats line %q: %v", line, err)
		}
		calls[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return calls
}

// TestLoneCallerCommands: a caller alone in Allow costs Redis one script
// call that reads its bucket with GET, asks TIME, and writes with one SET
// when allowed (and no SET when denied): nothing shared with a batch.
func TestLoneCallerCommands(t *testing.T) {
	noLeaks(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	lim := newLimiter(t, rdb, hourly(1), Config{})
	if _, err := lim.Allow(ctx, "warm-up", 1); err != nil { // loads the script
		t.Fatal(err)
	}
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		res, err := lim.Allow(ctx, "k", 1)
		if err != nil || res.Allowed != want {
			t.Fatalf("Allow %d: got %+v, %v; want allowed=%v", i, res, err, want)
		}
	}
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	got := commandCalls(t, info)
	delete(got, "config|resetstat")
	want := map[string]int{"evalsha": 2, "get": 2, "time": 2, "set": 1}
	if len(got) != len(want) {
		t.Fatalf("commands for two lone decisions: got %v, want %v", got, want)
	}
	for cmd, n := range want {
		if got[cmd] != n {
			t.Fatalf("commands for two lone decisions: got %v, want %v", got, want)
		}
	}
}

// TestFullBucketAnswersZero: both scripts answer an allowed request with
// the bucket's level before it, so a full bucket (an absent key, nearly
// every decision over many keys) answers 0, which go-redis boxes without
// allocating; a denial answers the negated level, which is never 0.
func TestFullBucketAnswersZero(t *testing.T) {
	noLeaks(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	lim := newLimiter(t, rdb, hourly(1), Config{})
	p := lim.params
	v, err := allowOneScript.Run(ctx, rdb, []string{lim.key("one")}, p.Interval, p.Capacity, 1).Result()
	if err != nil || v != int64(0) {
		t.Fatalf("lone script on a full bucket: got %v, %v; want 0", v, err)
	}
	v, err = allowOneScript.Run(ctx, rdb, []string{lim.key("one")}, p.Interval, p.Capacity, 1).Result()
	if n, ok := v.(int64); err != nil || !ok || n >= 0 {
		t.Fatalf("lone script on an empty bucket: got %v, %v; want a negative level", v, err)
	}
	v, err = allowScript.Run(ctx, rdb, []string{lim.key("a"), lim.key("b")}, p.Interval, p.Capacity, "", "-2").Result()
	got, err2 := script.Ints(v, 3)
	if err != nil || err2 != nil || got[0] != 0 || got[1] >= 0 || got[2] != 0 {
		t.Fatalf("batch script, two requests on a and one on b: got %v, %v, %v; want [0 <0 0]", v, err, err2)
	}
}
