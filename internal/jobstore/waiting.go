package jobstore

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Proxied calls waiting for their slot, fleet-wide: a sorted set of
// waiter id -> the end of its wait (µs, the waiting replica's clock). A
// member counts until its wait ends, so a replica that dies mid-wait
// leaves no waiter behind for longer than that wait.

// WaitingKey is the upstream's set of waiting proxied calls.
func (s Space) WaitingKey() string { return s.our + "pw" }

// waitingSlack keeps the set a little past its latest member's end.
const waitingSlack = 5 * time.Second

// Waiting records that call id waits until at most until; longest is the
// longest any call of the upstream waits, which the set is kept for.
func (s Space) Waiting(ctx context.Context, rdb redis.Cmdable, id string, until time.Time, longest time.Duration) error {
	now := time.Now().UnixMicro()
	_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRemRangeByScore(ctx, s.WaitingKey(), "-inf", strconv.FormatInt(now, 10))
		p.ZAdd(ctx, s.WaitingKey(), redis.Z{Score: float64(until.UnixMicro()), Member: id})
		p.PExpire(ctx, s.WaitingKey(), longest+waitingSlack)
		return nil
	})
	return err
}

// DoneWaiting removes call id from the waiting set.
func (s Space) DoneWaiting(ctx context.Context, rdb redis.Cmdable, id string) error {
	return rdb.ZRem(ctx, s.WaitingKey(), id).Err()
}

// CountWaiting counts the calls waiting at now.
func (s Space) CountWaiting(ctx context.Context, rdb redis.Cmdable, now time.Time) (int64, error) {
	return rdb.ZCount(ctx, s.WaitingKey(), "("+strconv.FormatInt(now.UnixMicro(), 10), "+inf").Result()
}
