package tokenbucket

import (
	"context"
	"strconv"
	"strings"
	"testing"
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
