package jobstore

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestReadIndexTies: entries sharing a score are read in order even when
// the cursor's own entry left the set meanwhile.
func TestReadIndexTies(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	keys := AsynqKeys("shaper.x")
	key := keys.Archived()
	var members []string
	for i := range 30 {
		m := fmt.Sprintf("x.default.m%02d", i)
		members = append(members, m)
		score := 100.0
		if i >= 20 {
			score = 50
		}
		rdb.ZAdd(ctx, key, redis.Z{Score: score, Member: m})
	}
	var got []string
	cur := struct{ Score, Member string }{}
	for {
		page, err := keys.ReadIndex(ctx, rdb, IndexArchived, cur.Score, cur.Member, 4)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page {
			got = append(got, e.ID)
			cur.Score, cur.Member = e.Score, e.ID
		}
		if len(page) < 4 {
			break
		}
		// The cursor's entry leaves, as a retried job does.
		rdb.ZRem(ctx, key, cur.Member)
	}
	// ZREVRANGE order: score 100 (m19..m00), then 50 (m29..m20).
	var want []string
	for i := 19; i >= 0; i-- {
		want = append(want, members[i])
	}
	for i := 29; i >= 20; i-- {
		want = append(want, members[i])
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v,\nwant %v", got, want)
	}
}

// TestReadIndexList: a list (asynq's active list, newest pushed on the
// left) is read from the left, and its cursor survives entries leaving
// before it, at it, or after it.
func TestReadIndexList(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	keys := AsynqKeys("shaper.x")
	key := keys.Active()
	var want []string
	for i := range 20 {
		m := fmt.Sprintf("x.default.m%02d", i)
		rdb.LPush(ctx, key, m)
		want = append([]string{m}, want...)
	}
	var got []string
	cur := struct{ Score, Member string }{}
	for round := 0; ; round++ {
		page, err := keys.ReadIndex(ctx, rdb, IndexActive, cur.Score, cur.Member, 3)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page {
			got = append(got, e.ID)
			cur.Score, cur.Member = e.Score, e.ID
		}
		if len(page) < 3 {
			break
		}
		switch round % 3 {
		case 0: // one read long ago leaves (a job finishes)
			rdb.LRem(ctx, key, 1, got[0])
		case 1: // a new one is taken, pushed on the left
			rdb.LPush(ctx, key, fmt.Sprintf("x.default.n%02d", round))
		case 2: // the cursor's own entry leaves
			rdb.LRem(ctx, key, 1, cur.Member)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v,\nwant %v", got, want)
	}
}
