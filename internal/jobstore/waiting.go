package jobstore

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/script"
)

// Proxied calls waiting for their slot, fleet-wide: a sorted set of
// waiter id -> the end of its wait (µs, Redis's clock). A member counts
// until its wait ends, so a replica that dies mid-wait leaves no waiter
// behind for longer than that wait.

// WaitingKey is the upstream's set of waiting proxied calls.
func (s Space) WaitingKey() string { return s.our + "pw" }

// waitingSlack keeps the set a little past its latest member's end.
const waitingSlack = 5 * time.Second

// Waiting records that call id waits for at most wait from now on Redis's
// clock; longest is the longest any call of the upstream waits, which the
// set is kept for.
func (s Space) Waiting(ctx context.Context, rdb redis.Scripter, id string, wait, longest time.Duration) error {
	_, err := script.Run(ctx, rdb, "proxy waiting", waitingScript, []string{s.WaitingKey()},
		"", id, max(wait, 0).Microseconds(), (max(longest, wait) + waitingSlack).Milliseconds())
	return err
}

// DoneWaiting removes call id from the waiting set.
func (s Space) DoneWaiting(ctx context.Context, rdb redis.Cmdable, id string) error {
	return rdb.ZRem(ctx, s.WaitingKey(), id).Err()
}

// CountWaiting counts the calls waiting at now (Redis's clock).
func (s Space) CountWaiting(ctx context.Context, rdb redis.Cmdable, now time.Time) (int64, error) {
	return rdb.ZCount(ctx, s.WaitingKey(), "("+strconv.FormatInt(now.UnixMicro(), 10), "+inf").Result()
}
