// Package tokenbucket is shaper's admission limiter: a token bucket per key,
// shared by every process that talks to the same Redis. Capacity (the burst
// an idle key may spend) and refill rate are separate knobs. Each decision
// is one Lua script on Redis's own clock, over the GCRA arithmetic in
// internal/gcra, so a burst across any number of replicas admits exactly the
// capacity; concurrent decisions share round trips. Local is the same
// bucket in process memory, for tests and as the fallback when Redis is down.
package tokenbucket

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/gcra"
	"github.com/shaperhq/shaper/internal/keyspace"
	"github.com/shaperhq/shaper/internal/script"
)

// DefaultPrefix starts every key when Config.Prefix is empty, as in the
// other limiters: a bucket's key is "shaper:tb:{KEY}".
const DefaultPrefix = keyspace.DefaultPrefix

// MaxKeyLen bounds a bucket key, in bytes.
const MaxKeyLen = 512

// Config adjusts a Limiter. The zero value is ready to use.
type Config struct {
	// Prefix starts every key the limiter writes, followed by ":tb:";
	// empty means DefaultPrefix. It must not contain '{' or '}': the
	// bucket key is the hash tag.
	Prefix string
	// Now, when set, replaces Redis TIME as the scripts' clock. It is for
	// tests and for hosts that forbid TIME; every process sharing a bucket
	// must then share the clock.
	Now func() time.Time
	// MaxBatch bounds how many concurrent decisions share one round trip;
	// zero means 128, and 1 sends every decision on its own.
	MaxBatch int
	// MaxInFlight bounds how many round trips of shared decisions run at
	// once; zero means 2.
	MaxInFlight int
}

// Limiter is a Redis-backed token bucket per key. It is safe for concurrent
// use, and concurrent calls to Allow are coalesced: a caller that finds no
// round trip free joins the next one instead of queuing for a connection.
// A Limiter starts no goroutines and needs no Close.
type Limiter struct {
	rdb      redis.UniversalClient
	limit    Limit
	params   gcra.Params
	prefix   string
	now      func() time.Time
	sharding script.Sharding
	batch    *script.Batcher[request, shaper.Result]
	// shape is the scripts' ARGV[1..2], boxed once rather than per call.
	shape [2]any
}

type request struct {
	key  string // the Redis key
	cost int64
}

var _ shaper.Limiter = (*Limiter)(nil)

// New returns a limiter enforcing l on rdb, which may be a Client, a
// ClusterClient, a Ring or a failover client; the caller owns and closes it.
func New(rdb redis.UniversalClient, l Limit, cfg Config) (*Limiter, error) {
	if rdb == nil {
		return nil, errors.New("token bucket: nil redis client")
	}
	if err := l.Validate(); err != nil {
		return nil, fmt.Errorf("token bucket: %w", err)
	}
	prefix := keyspace.Prefix(cfg.Prefix)
	if strings.ContainsAny(prefix, "{}") {
		return nil, fmt.Errorf("token bucket: prefix %q: must not contain '{' or '}'", prefix)
	}
	lim := &Limiter{
		rdb:      rdb,
		limit:    l,
		params:   l.params(),
		prefix:   prefix,
		now:      cfg.Now,
		sharding: script.ShardingOf(rdb),
	}
	lim.shape = [2]any{lim.params.Interval, lim.params.Capacity}
	if cfg.MaxBatch != 1 {
		lim.batch = script.NewBatcher(script.BatchOptions{MaxBatch: cfg.MaxBatch, MaxInFlight: cfg.MaxInFlight}, lim.run)
	}
	return lim, nil
}

// Limit is the limit this limiter enforces.
func (l *Limiter) Limit() Limit { return l.limit }

// Allow takes n tokens from key's bucket if they are all there now. A denied
// request takes nothing and says when the same n would be allowed. A cost
// above the capacity can never be allowed, so it is an error wrapping
// shaper.ErrInvalid rather than a wait, as is n < 1 or a key that is empty
// or longer than MaxKeyLen bytes or contains '{' or '}'. Any other error is Redis's; wrap the limiter in a
// shaper.Fallible to choose what happens then.
func (l *Limiter) Allow(ctx context.Context, key string, n int64) (shaper.Result, error) {
	if err := checkArgs(l.limit, key, n); err != nil {
		return shaper.Result{}, err
	}
	req := request{key: l.key(key), cost: n}
	if l.batch != nil {
		return l.batch.Do(ctx, req)
	}
	c := &script.Call[request, shaper.Result]{Req: req}
	l.run(ctx, []*script.Call[request, shaper.Result]{c})
	return c.Res, c.Err
}

// Reset forgets what key has spent, refilling its bucket at once, e.g. to
// unblock a customer.
func (l *Limiter) Reset(ctx context.Context, key string) error {
	if err := checkArgs(l.limit, key, 1); err != nil {
		return err
	}
	if err := l.rdb.Del(ctx, l.key(key)).Err(); err != nil {
		return fmt.Errorf("token bucket: reset: %w", err)
	}
	return nil
}

// key is the Redis key of a bucket. The bucket key is the hash tag, so a
// Redis Cluster can put buckets on any node while one batch of a bucket's
// own requests stays in one slot.
func (l *Limiter) key(k string) string {
	return l.prefix + ":tb:{" + k + "}"
}

func checkArgs(l Limit, key string, n int64) error {
	switch {
	case key == "":
		return fmt.Errorf("token bucket: empty key: %w", shaper.ErrInvalid)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("token bucket: key of %d bytes: at most %d: %w", len(key), MaxKeyLen, shaper.ErrInvalid)
	case strings.ContainsAny(key, "{}"):
		return fmt.Errorf("token bucket: key %q contains '{' or '}': %w", key, shaper.ErrInvalid)
	case n < 1:
		return fmt.Errorf("token bucket: cost %d: must be at least 1: %w", n, shaper.ErrInvalid)
	case n > l.Capacity:
		return fmt.Errorf("token bucket: cost %d exceeds capacity %d: %w", n, l.Capacity, shaper.ErrInvalid)
	}
	return nil
}

// run decides a batch. Requests go into as few script calls as the client's
// sharding allows (one for a single server, one per hash slot on a cluster),
// and those calls into one pipeline.
func (l *Limiter) run(ctx context.Context, calls []*script.Call[request, shaper.Result]) {
	now := script.NowArg(l.now)
	if len(calls) == 1 {
		// A lone caller is the common case at low load: keep it as lean as
		// a plain script call.
		c := calls[0]
		v, err := script.Run(ctx, l.rdb, "token bucket", allowScript, []string{c.Req.key}, l.shape[0], l.shape[1], now, c.Req.cost)
		l.deliver(calls, v, err)
		return
	}
	groups := l.group(calls)
	invs := make([]script.Invocation, len(groups))
	for i, g := range groups {
		keys := make([]string, len(g))
		args := make([]any, 3, 3+len(g))
		args[0], args[1], args[2] = l.shape[0], l.shape[1], now
		for j, c := range g {
			keys[j] = c.Req.key
			args = append(args, c.Req.cost)
		}
		invs[i] = script.Invocation{Keys: keys, Args: args}
	}

	var vals []any
	var errs []error
	if len(invs) == 1 {
		v, err := script.Run(ctx, l.rdb, "token bucket", allowScript, invs[0].Keys, invs[0].Args...)
		vals, errs = []any{v}, []error{err}
	} else {
		vals, errs = script.RunPipelined(ctx, l.rdb, "token bucket", allowScript, invs)
	}
	for i, g := range groups {
		l.deliver(g, vals[i], errs[i])
	}
}

func (l *Limiter) deliver(g []*script.Call[request, shaper.Result], v any, err error) {
	var ints []int64
	if err == nil {
		ints, err = script.Ints(v, 4*len(g))
	}
	if err != nil {
		for _, c := range g {
			c.Err = err
		}
		return
	}
	for j, c := range g {
		r := ints[4*j : 4*j+4]
		c.Res = toResult(l.limit, r[0] == 1, r[1], r[2], r[3])
	}
}

func (l *Limiter) group(calls []*script.Call[request, shaper.Result]) [][]*script.Call[request, shaper.Result] {
	if l.sharding == script.OneNode {
		return [][]*script.Call[request, shaper.Result]{calls}
	}
	var groups [][]*script.Call[request, shaper.Result]
	slotOf := make(map[uint16]int)
	keyOf := make(map[string]int)
	for _, c := range calls {
		var i int
		var ok bool
		if l.sharding == script.BySlot {
			s := script.Slot(c.Req.key)
			if i, ok = slotOf[s]; !ok {
				i = len(groups)
				slotOf[s] = i
			}
		} else if i, ok = keyOf[c.Req.key]; !ok {
			i = len(groups)
			keyOf[c.Req.key] = i
		}
		if !ok {
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], c)
	}
	return groups
}

func toResult(l Limit, allowed bool, remaining, retryAfter, resetAfter int64) shaper.Result {
	return shaper.Result{
		Allowed:    allowed,
		Limit:      l.Capacity,
		Remaining:  remaining,
		RetryAfter: time.Duration(retryAfter) * time.Microsecond,
		ResetAfter: time.Duration(resetAfter) * time.Microsecond,
	}
}
