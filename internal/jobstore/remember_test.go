package jobstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

// idemPattern is the Lua pattern of this file's idempotency-key IDs
// ("q.default.i" and hex digits); others ("q.default.j...") are random.
const idemPattern = `%.i%x+$`

func remembering(e *env, window, span time.Duration) Remembered {
	return Remembered{Key: "shaper:s:" + e.k.HashTag() + ":ik", Window: window, Span: span, Pattern: idemPattern,
		CancelPrefix: "shaper:cancelled:" + e.k.HashTag() + ":"}
}

// finishIDs seeds and finishes ids as outcome, batch at a time, under b.
func (e *env) finishIDs(ids []string, batch int, outcome Outcome, b Bounds) {
	e.t.Helper()
	ctx := context.Background()
	for lo := 0; lo < len(ids); lo += batch {
		part := ids[lo:min(lo+batch, len(ids))]
		msgs := e.seedTaken(part, "default")
		items := make([]Finished, len(part))
		for i, id := range part {
			items[i] = Finished{ID: id, Lane: "default", Msg: msgs[i], Outcome: outcome,
				Result: []byte(`{"status":200}`), Retention: 24 * time.Hour, ErrMsg: "gave up"}
		}
		errs, err := Finish(ctx, e.rdb, e.k, e.counts, e.pbacklog, items, KeepAtMost(b))
		if err != nil {
			e.t.Fatal(err)
		}
		for i, err := range errs {
			if err != nil {
				e.t.Fatalf("finish %s: %v", part[i], err)
			}
		}
	}
}

func idemID(i int) string   { return fmt.Sprintf("q.default.i%030x", i) }
func randomID(i int) string { return fmt.Sprintf("q.default.j%07d", i) }

// TestRememberPastCountBound: a trimmed task whose ID is an idempotency
// key's leaves a record of its final state and no tombstone; a random
// ID's leaves a tombstone and no record; a kept task has neither.
func TestRememberPastCountBound(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "q")
	b := Bounds{Completed: 10, Archived: 10,
		Gone:     Tombstones{Key: "shaper:s:" + e.k.HashTag() + ":gone", Max: 100, For: time.Hour},
		Remember: remembering(e, time.Hour, 0)}
	var ids []string
	for i := range 40 {
		ids = append(ids, idemID(i), randomID(i))
	}
	e.finishIDs(ids, 8, Succeeded, b)
	if n := e.rdb.ZCard(ctx, e.k.Completed()).Val(); n != 10 {
		t.Fatalf("kept: got %d, want 10", n)
	}
	for _, id := range ids {
		// (Tasks finished in the same millisecond tie; the trim takes
		// them by ID, so which are kept is read back.)
		kept := e.rdb.Exists(ctx, e.k.Task(id)).Val() == 1
		state, err := b.Remember.Recall(ctx, e.rdb, id)
		must(t, err)
		gone, err := b.Gone.WasDeleted(ctx, e.rdb, id)
		must(t, err)
		idem := strings.Contains(id, ".i")
		switch {
		case kept && (state != 0 || gone):
			t.Errorf("%s is kept: got record %q, tombstone %v, want neither", id, state, gone)
		case !kept && idem && (state != 's' || gone):
			t.Errorf("%s trimmed: got record %q, tombstone %v, want record s and no tombstone", id, state, gone)
		case !kept && !idem && (state != 0 || !gone):
			t.Errorf("%s trimmed: got record %q, tombstone %v, want a tombstone and no record", id, state, gone)
		}
	}
	if st, _ := b.Remember.Recall(ctx, e.rdb, idemID(1000)); st != 0 {
		t.Errorf("an ID never used: got record %q, want none", st)
	}
}

// TestRememberDeadAndCancelled: the age sweep and the count trim of the
// archived set record dead, or cancelled when the task has its mark.
func TestRememberDeadAndCancelled(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "q")
	b := Bounds{Archived: 2, Remember: remembering(e, time.Hour, 0), SidePrefixes: []string{remembering(e, 0, 0).CancelPrefix}}
	ids := []string{idemID(1), idemID(2), idemID(3), idemID(4)}
	must(t, e.rdb.Set(ctx, b.Remember.CancelPrefix+idemID(2), "1", time.Hour).Err())
	must(t, e.rdb.Set(ctx, b.Remember.CancelPrefix+idemID(4), "1", time.Hour).Err())
	e.finishIDs(ids, 4, Dead, b)
	// 1 and 2 went past the bound; 3 and 4 go by age.
	n, err := DeleteExpired(ctx, e.rdb, e.k, e.counts, Archived, time.Now().Add(time.Second), 10, b)
	if err != nil || n != 2 {
		t.Fatalf("sweep: got %d, %v, want 2", n, err)
	}
	for id, want := range map[string]byte{idemID(1): 'd', idemID(2): 'c', idemID(3): 'd', idemID(4): 'c'} {
		if got, err := b.Remember.Recall(ctx, e.rdb, id); err != nil || got != want {
			t.Errorf("%s: got %q, %v, want %q", id, got, err, want)
		}
		if e.rdb.Exists(ctx, b.Remember.CancelPrefix+id, e.k.Task(id)).Val() != 0 {
			t.Errorf("%s: its hash or cancel mark is left", id)
		}
	}
}

// TestRememberCompact is issue 12's bound: a record costs at most 120 B of
// Redis memory, by MEMORY USAGE of its keys and by used_memory.
func TestRememberCompact(t *testing.T) {
	if testing.Short() {
		t.Skip("thousands of remembered keys: runs in make test")
	}
	ctx := context.Background()
	e := newEnv(t, "q")
	b := Bounds{Completed: 1, Remember: remembering(e, time.Hour, 0)}
	e.finishIDs([]string{idemID(0)}, 1, Succeeded, b) // scripts loaded, keys made
	before := redistest.UsedMemory(e.t, e.rdb)
	const n = 20000
	ids := make([]string, n)
	for i := range ids {
		ids[i] = idemID(i + 1)
	}
	e.finishIDs(ids, 200, Succeeded, b)
	after := redistest.UsedMemory(e.t, e.rdb)
	keys := e.rdb.Keys(ctx, b.Remember.Key+"*").Val()
	var usage, records int64
	for _, k := range keys {
		usage += e.rdb.MemoryUsage(ctx, k, 0).Val()
		if k != b.Remember.Key {
			records += e.rdb.HLen(ctx, k).Val()
		}
	}
	if records != n {
		t.Fatalf("records: got %d, want %d", records, n)
	}
	perKey, perUsed := usage/records, (after-before)/n
	t.Logf("per record: MEMORY USAGE %d B, used_memory %d B (%d keys)", perKey, perUsed, len(keys))
	if perKey > 120 || perUsed > 120 {
		t.Errorf("per record: got MEMORY USAGE %d B, used_memory %d B, want at most 120 B", perKey, perUsed)
	}
}

// TestRememberWindow: records go once their window (and span) is over,
// their buckets unlinked by the next record, and every key has a TTL.
func TestRememberWindow(t *testing.T) {
	if testing.Short() {
		t.Skip("seconds of windows: runs in make test")
	}
	ctx := context.Background()
	e := newEnv(t, "q")
	b := Bounds{Completed: 1, Remember: remembering(e, 2*time.Second, time.Second)}
	e.finishIDs([]string{idemID(1), idemID(2)}, 2, Succeeded, b)
	if got, _ := b.Remember.Recall(ctx, e.rdb, idemID(1)); got != 's' {
		t.Fatalf("at once: got %q, want s", got)
	}
	for _, k := range e.rdb.Keys(ctx, b.Remember.Key+"*").Val() {
		if ttl := e.rdb.TTL(ctx, k).Val(); ttl <= 0 || ttl > 4*time.Second {
			t.Errorf("%s: TTL %v, want up to window + 2 spans", k, ttl)
		}
	}
	time.Sleep(1500 * time.Millisecond)
	if got, _ := b.Remember.Recall(ctx, e.rdb, idemID(1)); got != 's' {
		t.Fatalf("within the window: got %q, want s", got)
	}
	time.Sleep(2 * time.Second) // past window + span
	if got, _ := b.Remember.Recall(ctx, e.rdb, idemID(1)); got != 0 {
		t.Fatalf("after the window: got %q, want none", got)
	}
	e.finishIDs([]string{idemID(3)}, 1, Succeeded, b)
	buckets := e.rdb.ZCard(ctx, b.Remember.Key).Val()
	keys := e.rdb.Keys(ctx, b.Remember.Key+":*").Val()
	if buckets != 1 || len(keys) != 1 {
		t.Fatalf("after a new record: got %d buckets indexed, %d bucket keys %v, want 1 and 1", buckets, len(keys), keys)
	}
}
