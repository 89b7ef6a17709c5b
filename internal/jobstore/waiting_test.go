package jobstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/shaperhq/shaper/internal/jobstore"
)

// TestWaitingAll: calls that begin to wait together are recorded in one
// round trip, each until the end of its own wait; DoneWaiting takes any
// number of them off; the set outlives its longest wait.
func TestWaitingAll(t *testing.T) {
	ctx := context.Background()
	rdb := srv().Client(t)
	s := jobstore.For("", "waiting-all")
	rdb.Del(ctx, s.WaitingKey())
	if err := s.WaitingAll(ctx, rdb, []jobstore.Waiter{{ID: "a", Wait: time.Minute}, {ID: "b", Wait: 2 * time.Second}, {ID: "c", Wait: 3 * time.Minute}}, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if n, err := s.CountWaiting(ctx, rdb, now); err != nil || n != 3 {
		t.Fatalf("got %d waiting (%v), want 3", n, err)
	}
	// b's wait ends after 2 s; a's and c's go on.
	if n, _ := s.CountWaiting(ctx, rdb, now.Add(10*time.Second)); n != 2 {
		t.Errorf("10 s on: got %d waiting, want 2", n)
	}
	if ttl := rdb.PTTL(ctx, s.WaitingKey()).Val(); ttl < 3*time.Minute {
		t.Errorf("the set is kept for %v, want past the longest wait (3m)", ttl)
	}
	if err := s.DoneWaiting(ctx, rdb, "a", "c"); err != nil {
		t.Fatal(err)
	}
	if got := rdb.ZRange(ctx, s.WaitingKey(), 0, -1).Val(); len(got) != 1 || got[0] != "b" {
		t.Errorf("after a and c are done: got %v, want [b]", got)
	}
	// One waiter alone, as before.
	if err := s.Waiting(ctx, rdb, "d", time.Minute, time.Minute); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.CountWaiting(ctx, rdb, time.Now()); n != 2 {
		t.Errorf("got %d waiting, want 2 (b, d)", n)
	}
	if err := s.DoneWaiting(ctx, rdb); err != nil {
		t.Errorf("done with nobody: %v", err)
	}
}
