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

// Waiter is one proxied call that waits: its id and how long from now
// (Redis's clock) it waits at most.
type Waiter struct {
	ID   string
	Wait time.Duration
}

// Waiting records that call id waits for at most wait from now on Redis's
// clock; longest is the longest any call of the upstream waits, which the
// set is kept for.
func (s Space) Waiting(ctx context.Context, rdb redis.Scripter, id string, wait, longest time.Duration) error {
	return s.WaitingAll(ctx, rdb, []Waiter{{ID: id, Wait: wait}}, longest)
}

// WaitingAll is Waiting for several calls in one round trip.
func (s Space) WaitingAll(ctx context.Context, rdb redis.Scripter, ws []Waiter, longest time.Duration) error {
	args := make([]any, 0, 2+2*len(ws))
	keep := longest
	for _, w := range ws {
		keep = max(keep, w.Wait)
	}
	args = append(args, "", (keep + waitingSlack).Milliseconds())
	for _, w := range ws {
		args = append(args, w.ID, max(w.Wait, 0).Microseconds())
	}
	_, err := script.Run(ctx, rdb, "proxy waiting", waitingScript, []string{s.WaitingKey()}, args...)
	return err
}

// DoneWaiting removes calls from the waiting set.
func (s Space) DoneWaiting(ctx context.Context, rdb redis.Cmdable, ids ...string) error {
	if len(ids) == 0 {
		return nil
	}
	members := make([]any, len(ids))
	for i, id := range ids {
		members[i] = id
	}
	return rdb.ZRem(ctx, s.WaitingKey(), members...).Err()
}

// CountWaiting counts the calls waiting at now (Redis's clock).
func (s Space) CountWaiting(ctx context.Context, rdb redis.Cmdable, now time.Time) (int64, error) {
	return rdb.ZCount(ctx, s.WaitingKey(), "("+strconv.FormatInt(now.UnixMicro(), 10), "+inf").Result()
}
