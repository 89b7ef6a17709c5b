package jobstore

import (
	"context"
	"testing"
	"time"
)

// TestRecent: Recent averages over the seconds since the drain began, where
// Last10s averages all ten; RecentFull says the drain filled them.
func TestRecent(t *testing.T) {
	ctx := context.Background()
	base := time.Unix(1_800_000_000, 0)
	for _, tc := range []struct {
		name       string
		perSecond  []int64 // sends in the seconds now-2, now-3, …
		last10s    float64
		recent     float64
		recentFull bool
	}{
		{name: "idle", perSecond: nil, last10s: 0, recent: 0, recentFull: false},
		{name: "began 3s ago", perSecond: []int64{5, 5, 5}, last10s: 1.5, recent: 5, recentFull: false},
		{name: "a gap inside", perSecond: []int64{1, 0, 0, 1}, last10s: 0.2, recent: 0.5, recentFull: false},
		{name: "starting again", perSecond: []int64{0, 0, 0, 3, 3, 3, 3, 3, 3, 3}, last10s: 2.1, recent: 2.1, recentFull: false},
		{name: "ten full seconds", perSecond: []int64{2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 9}, last10s: 2, recent: 2, recentFull: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb := srv.Client(t)
			rdb.FlushAll(ctx)
			rec := NewRecorder(rdb, "")
			for i, n := range tc.perSecond {
				for range n {
					rec.Sent("api", base.Add(-time.Duration(2+i)*time.Second))
				}
			}
			// The second being counted and the one before are left out.
			rec.Sent("api", base)
			rec.Sent("api", base.Add(-time.Second))
			if err := rec.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			r, err := Read(ctx, rdb, "", "api", base)
			if err != nil {
				t.Fatal(err)
			}
			if r.Last10s != tc.last10s || r.Recent != tc.recent || r.RecentFull != tc.recentFull {
				t.Fatalf("got last 10s %v, recent %v (full %v), want %v, %v (%v)",
					r.Last10s, r.Recent, r.RecentFull, tc.last10s, tc.recent, tc.recentFull)
			}
		})
	}
}

// TestHistory: HistoryAt reads History/HistoryStep steps, oldest first,
// each the step's sends per second, the latest the last step whose seconds
// Read would count.
func TestHistory(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	rec := NewRecorder(rdb, "")
	// now is 3 s into a step: the step before it ended 3 s ago and is read;
	// the current one is not.
	now := time.Unix(1_800_000_000+3, 0) // 1_800_000_000 is a multiple of 10
	stepEnd := time.Unix(1_800_000_000, 0)
	for i := range 40 { // 4/s over the latest complete step
		rec.Sent("api", stepEnd.Add(-time.Second*time.Duration(1+i%10)))
	}
	for range 7 { // the oldest step read: 0.7/s
		rec.Sent("api", stepEnd.Add(-History+time.Second))
	}
	for range 9 { // one step older: not read
		rec.Sent("api", stepEnd.Add(-History-time.Second))
	}
	rec.Sent("api", now.Add(-time.Second)) // the current step: not read
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	pts, err := HistoryAt(ctx, rdb, "", "api", now)
	if err != nil {
		t.Fatal(err)
	}
	if want := int(History / HistoryStep); len(pts) != want {
		t.Fatalf("got %d points, want %d", len(pts), want)
	}
	last, first := pts[len(pts)-1], pts[0]
	if !last.At.Equal(stepEnd) || last.Rate != 4 {
		t.Fatalf("latest point %+v, want 4/s ending at %v", last, stepEnd)
	}
	if !first.At.Equal(stepEnd.Add(-History+HistoryStep)) || first.Rate != 0.7 {
		t.Fatalf("oldest point %+v, want 0.7/s ending at %v", first, stepEnd.Add(-History+HistoryStep))
	}
	for _, p := range pts[1 : len(pts)-1] {
		if p.Rate != 0 {
			t.Fatalf("point %+v: want 0, nothing was sent then", p)
		}
	}
	// A step is the latest once Read would count its last second, which
	// is 2 s before now one second after the step ends.
	pts, _ = HistoryAt(ctx, rdb, "", "api", stepEnd.Add(HistoryStep))
	if last := pts[len(pts)-1]; !last.At.Equal(stepEnd) {
		t.Fatalf("as the next step ends: latest point ends at %v, want %v", last.At, stepEnd)
	}
	pts, _ = HistoryAt(ctx, rdb, "", "api", stepEnd.Add(HistoryStep+time.Second))
	if last := pts[len(pts)-1]; !last.At.Equal(stepEnd.Add(HistoryStep)) {
		t.Fatalf("1 s after the next step ends: latest point ends at %v, want %v", last.At, stepEnd.Add(HistoryStep))
	}
}

// TestKeysExpire: per-second counts live Keep; a step's count lives long
// enough for HistoryAt to read it as the oldest point, and not much longer.
func TestKeysExpire(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	rec := NewRecorder(rdb, "")
	now := time.Now()
	rec.Sent("api", now)
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	sec := drainKey("shaper", "api", now.Unix())
	if ttl := rdb.TTL(ctx, sec).Val(); ttl <= Keep-time.Second || ttl > Keep {
		t.Fatalf("per-second key TTL %v, want %v", ttl, Keep)
	}
	step := stepKey("shaper", "api", stepStart(now.Unix()))
	// Written now, anywhere in its step: HistoryAt reads it until History
	// and one step after the step began, at most that long from now.
	need := History + HistoryStep
	if ttl := rdb.TTL(ctx, step).Val(); ttl < need || ttl > historyTTL {
		t.Fatalf("step key TTL %v, want %v to %v", ttl, need, historyTTL)
	}
	keys, _ := rdb.Keys(ctx, "shaper:drain:*").Result()
	if len(keys) != 2 {
		t.Fatalf("keys %v, want one per-second key and one step key", keys)
	}
}
