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
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
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
	// once; zero means 2. A caller alone in Allow sends its decision on its
	// own, beside them. A caller who finds shared round trips running
	// waits to send until its batch would hold a MaxInFlight-th of the
	// decisions waiting and running (script.BatchOptions.EvenBatches), so
	// batches stay large when many callers come and go.
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
	// callers counts the calls inside Allow, so that a lone one can skip
	// the batcher.
	callers atomic.Int32
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
		lim.batch = script.NewBatcher(script.BatchOptions{MaxBatch: cfg.MaxBatch, MaxInFlight: cfg.MaxInFlight, EvenBatches: true}, lim.run)
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
	if l.batch == nil {
		return l.one(ctx, req)
	}
	// A caller with nobody else in Allow has nobody to share a round trip
	// with: it skips the batcher's bookkeeping and sends its own decision.
	defer l.callers.Add(-1)
	if l.callers.Add(1) == 1 {
		return l.one(ctx, req)
	}
	return l.batch.Do(ctx, req)
}

// one decides a single request with allowOneScript: one round trip, one
// GET and at most one SET in Redis, and a plain integer back.
func (l *Limiter) one(ctx context.Context, req request) (shaper.Result, error) {
	keys := []string{req.key}
	var v any
	var err error
	if l.now == nil {
		v, err = script.Run(ctx, l.rdb, "token bucket", allowOneScript, keys, l.shape[0], l.shape[1], req.cost)
	} else {
		v, err = script.Run(ctx, l.rdb, "token bucket", allowOneScript, keys, l.shape[0], l.shape[1], req.cost, script.NowArg(l.now))
	}
	if err != nil {
		return shaper.Result{}, err
	}
	level, ok := v.(int64)
	if !ok {
		return shaper.Result{}, fmt.Errorf("token bucket: script reply %v, want an integer", v)
	}
	return l.decode(level, req.cost), nil
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

// hasBrace tells whether key contains '{' or '}', in one pass.
func hasBrace(key string) bool {
	for i := 0; i < len(key); i++ {
		if c := key[i]; c == '{' || c == '}' {
			return true
		}
	}
	return false
}

func checkArgs(l Limit, key string, n int64) error {
	switch {
	case key == "":
		return fmt.Errorf("token bucket: empty key: %w", shaper.ErrInvalid)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("token bucket: key of %d bytes: at most %d: %w", len(key), MaxKeyLen, shaper.ErrInvalid)
	case hasBrace(key):
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
// and those calls into one pipeline. Within a script call each bucket is
// named once, with all of its requests in the order they came, so a hot key
// costs Redis one read and one write per batch rather than per request.
func (l *Limiter) run(ctx context.Context, calls []*script.Call[request, shaper.Result]) {
	if len(calls) == 1 {
		c := calls[0]
		c.Res, c.Err = l.one(ctx, c.Req)
		return
	}
	now := script.NowArg(l.now)
	invs, order := l.plan(calls, now)
	if len(invs) == 1 {
		v, err := script.Run(ctx, l.rdb, "token bucket", allowScript, invs[0].Keys, invs[0].Args...)
		l.deliver(order[0], v, err)
		return
	}
	vals, errs := script.RunPipelined(ctx, l.rdb, "token bucket", allowScript, invs)
	for i, g := range order {
		l.deliver(g, vals[i], errs[i])
	}
}

// plan turns a batch into script invocations: its requests grouped by
// bucket, keeping their order within each bucket, and the buckets into as
// few invocations as the sharding allows. order[i] is invocation i's calls
// in the order of its reply.
func (l *Limiter) plan(calls []*script.Call[request, shaper.Result], now string) (invs []script.Invocation, order [][]*script.Call[request, shaper.Result]) {
	// Number the buckets by first appearance, then lay the calls out bucket
	// by bucket in one slice: bucket b is sorted[first[b]:first[b+1]].
	index := make(map[string]int32, len(calls))
	of := make([]int32, len(calls))
	keys := make([]string, 0, len(calls))
	first := make([]int, 0, len(calls)+1)
	for i, c := range calls {
		b, ok := index[c.Req.key]
		if !ok {
			b = int32(len(keys))
			index[c.Req.key] = b
			keys = append(keys, c.Req.key)
			first = append(first, 0)
		}
		of[i] = b
		first[b]++
	}
	at := 0
	for b, n := range first {
		first[b] = at
		at += n
	}
	first = append(first, at)
	next := slices.Clone(first)
	sorted := make([]*script.Call[request, shaper.Result], len(calls))
	for i, c := range calls {
		sorted[next[of[i]]] = c
		next[of[i]]++
	}

	// groups lists each invocation's buckets.
	var groups [][]int
	switch l.sharding {
	case script.OneNode:
		groups = [][]int{make([]int, len(keys))}
		for b := range keys {
			groups[0][b] = b
		}
	case script.BySlot:
		slotOf := make(map[uint16]int)
		for b, k := range keys {
			s := script.Slot(k)
			g, ok := slotOf[s]
			if !ok {
				g = len(groups)
				slotOf[s] = g
				groups = append(groups, nil)
			}
			groups[g] = append(groups[g], b)
		}
	default:
		for b := range keys {
			groups = append(groups, []int{b})
		}
	}

	// The script passes its keys to MGET through unpack, which Lua bounds
	// by its stack (some 8,000 values), so a group of more buckets goes in
	// several calls.
	for g := 0; g < len(groups); g++ {
		if len(groups[g]) > maxScriptKeys {
			groups = append(groups, groups[g][maxScriptKeys:])
			groups[g] = groups[g][:maxScriptKeys]
		}
	}

	invs = make([]script.Invocation, len(groups))
	order = make([][]*script.Call[request, shaper.Result], len(groups))
	for g, bs := range groups {
		// A bucket with one request of cost 1 (most of them, over many
		// keys) needs no ARGV entry if it comes after every bucket that
		// has one.
		plain := func(b int) bool { return first[b+1]-first[b] == 1 && sorted[first[b]].Req.cost == 1 }
		slices.SortStableFunc(bs, func(a, b int) int {
			switch pa, pb := plain(a), plain(b); {
			case pa == pb:
				return 0
			case pb:
				return -1
			}
			return 1
		})
		inv := script.Invocation{Keys: make([]string, len(bs)), Args: make([]any, 3, 3+len(bs))}
		inv.Args[0], inv.Args[1], inv.Args[2] = l.shape[0], l.shape[1], now
		n := 0
		for _, b := range bs {
			n += first[b+1] - first[b]
		}
		o := make([]*script.Call[request, shaper.Result], 0, n)
		for j, b := range bs {
			inv.Keys[j] = keys[b]
			if !plain(b) {
				inv.Args = append(inv.Args, costs(sorted[first[b]:first[b+1]]))
			}
			o = append(o, sorted[first[b]:first[b+1]]...)
		}
		invs[g] = inv
		order[g] = o
	}
	return invs, order
}

// maxScriptKeys bounds the buckets one script call names.
const maxScriptKeys = 1000

// costs is one bucket's ARGV entry: the cost of its one request, -k for k
// requests of cost 1 (the common case, which the script then decides
// without parsing a list), or else all the costs in order, separated by
// commas.
func costs(calls []*script.Call[request, shaper.Result]) any {
	if len(calls) == 1 {
		return calls[0].Req.cost
	}
	units := true
	for _, c := range calls {
		units = units && c.Req.cost == 1
	}
	if units {
		return -int64(len(calls))
	}
	buf := make([]byte, 0, 2*len(calls))
	for i, c := range calls {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = strconv.AppendInt(buf, c.Req.cost, 10)
	}
	return buf
}

// deliver sets every call's result from the script's reply, which holds one
// value per call in the calls' order, or the error on all of them.
func (l *Limiter) deliver(calls []*script.Call[request, shaper.Result], v any, err error) {
	if err == nil {
		err = l.decodeAll(calls, v)
	}
	if err != nil {
		for _, c := range calls {
			c.Err = err
		}
	}
}

func (l *Limiter) decodeAll(calls []*script.Call[request, shaper.Result], v any) error {
	arr, ok := v.([]any)
	if !ok {
		return fmt.Errorf("token bucket: script reply %T, want an array", v)
	}
	if len(arr) != len(calls) {
		return fmt.Errorf("token bucket: script reply has %d values, want %d", len(arr), len(calls))
	}
	for i, x := range arr {
		level, ok := x.(int64)
		if !ok {
			return fmt.Errorf("token bucket: script reply value %d is %v, want an integer", i, x)
		}
		calls[i].Res = l.decode(level, calls[i].Req.cost)
	}
	return nil
}

// decode turns the script's answer to one request into its result. The
// answer is the bucket's level before the decision (TAT minus now, at
// least 0), negated for a denial; an allowed request leaves the level cost
// intervals higher. Since the GCRA arithmetic only ever compares the TAT
// with now, the level alone gives the same numbers gcra.Allow would.
func (l *Limiter) decode(level, cost int64) shaper.Result {
	if level >= 0 {
		level += cost * l.params.Interval
		return toResult(l.limit, true, gcra.Remaining(level, 0, l.params), 0, level)
	}
	level = -level
	return toResult(l.limit, false, gcra.Remaining(level, 0, l.params), gcra.Earliest(level, 0, l.params, cost), level)
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
