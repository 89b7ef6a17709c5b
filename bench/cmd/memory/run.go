package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/bench/internal/machine"
	"github.com/shaperhq/shaper/bench/internal/redisproc"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/tokenbucket"
	"github.com/shaperhq/shaper/window"
)

type options struct {
	keys        int
	workers     int
	logFull     int
	logFullKeys int
}

func parseFlags(args []string) (options, error) {
	fs := flag.NewFlagSet("memory", flag.ContinueOnError)
	var o options
	fs.IntVar(&o.keys, "keys", 100_000, "idle keys created per limiter")
	fs.IntVar(&o.workers, "workers", 64, "goroutines creating keys")
	fs.IntVar(&o.logFull, "log-full", 100, "limit, and so entries, of the full sliding log")
	// Filling 100 entries a key is the slow part of a run, and the figure
	// per key hardly depends on how many keys there are.
	fs.IntVar(&o.logFullKeys, "log-full-keys", 20_000, "keys created for the full sliding log")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.keys < 1000 || o.logFullKeys < 1000:
		// Fewer keys and the fixed costs (a hash table's growth, client
		// buffers) swamp the figure.
		return o, fmt.Errorf("-keys %d, -log-full-keys %d: must be at least 1000", o.keys, o.logFullKeys)
	case o.workers < 1:
		return o, fmt.Errorf("-workers %d: must be at least 1", o.workers)
	case o.logFull < 2:
		return o, fmt.Errorf("-log-full %d: must be at least 2", o.logFull)
	}
	return o, nil
}

// touch makes key (a name such as "k42") exist in Redis as a limiter would
// leave it after one request.
type touch func(ctx context.Context, key string) error

// subject is one limiter under measurement.
type subject struct {
	name string
	// what the key holds after touch, in words
	holds string
	// keys to create; 0 means options.keys
	keys int
	make func(rdb *redis.Client) (touch, error)
}

// slowLimit is what every subject enforces: 100 per hour, so that no key
// expires, and none is near denying, while memory is measured.
const (
	slowRate = 100
	slowPer  = time.Hour
)

func subjects(o options) []subject {
	wl := window.Limit{Rate: slowRate, Per: slowPer}
	return []subject{
		{
			name: "shaper tokenbucket", holds: "one request taken",
			make: func(rdb *redis.Client) (touch, error) {
				lim, err := tokenbucket.New(rdb, tokenbucket.Limit{Capacity: slowRate, Refill: slowRate, Per: slowPer}, tokenbucket.Config{})
				if err != nil {
					return nil, err
				}
				return func(ctx context.Context, key string) error { _, err := lim.Allow(ctx, key, 1); return err }, nil
			},
		},
		{
			name: "shaper fixed window", holds: "one request counted",
			make: func(rdb *redis.Client) (touch, error) {
				lim, err := window.NewFixedWindow(rdb, wl, window.Config{})
				if err != nil {
					return nil, err
				}
				return func(ctx context.Context, key string) error { _, err := lim.Allow(ctx, key, 1); return err }, nil
			},
		},
		{
			name: "shaper sliding window counter", holds: "one request counted",
			make: func(rdb *redis.Client) (touch, error) {
				lim, err := window.NewSlidingWindow(rdb, wl, window.Config{})
				if err != nil {
					return nil, err
				}
				return func(ctx context.Context, key string) error { _, err := lim.Allow(ctx, key, 1); return err }, nil
			},
		},
		{
			name: "shaper sliding log", holds: "1 entry",
			make: func(rdb *redis.Client) (touch, error) {
				lim, err := window.NewSlidingLog(rdb, wl, window.Config{})
				if err != nil {
					return nil, err
				}
				return func(ctx context.Context, key string) error { _, err := lim.Allow(ctx, key, 1); return err }, nil
			},
		},
		{
			// One request of cost logFull writes the same members as
			// logFull requests would, bar their timestamps' digits, in one
			// round trip instead of logFull.
			name: "shaper sliding log, full", holds: fmt.Sprintf("%d entries: at its limit of %d per %v", o.logFull, o.logFull, slowPer),
			keys: o.logFullKeys,
			make: func(rdb *redis.Client) (touch, error) {
				lim, err := window.NewSlidingLog(rdb, window.Limit{Rate: int64(o.logFull), Per: slowPer}, window.Config{})
				if err != nil {
					return nil, err
				}
				return func(ctx context.Context, key string) error {
					_, err := lim.Allow(ctx, key, int64(o.logFull))
					return err
				}, nil
			},
		},
		{
			// A leaky bucket paces one upstream, so there are a handful of
			// them, not one per client; its per-key cost is shown for
			// completeness. Bucket objects are plain Go values: one per
			// name costs Redis nothing until it reserves.
			name: "shaper leaky bucket", holds: "one slot reserved (one limit, no concurrency cap)",
			make: func(rdb *redis.Client) (touch, error) {
				p := leaky.New(rdb, leaky.Config{})
				cfg := leaky.BucketConfig{Limits: []leaky.Limit{{Rate: slowRate, Per: slowPer}}}
				return func(ctx context.Context, key string) error {
					b, err := p.Bucket(key, cfg)
					if err != nil {
						return err
					}
					r, err := b.Reserve(ctx, nil)
					if err == nil && !r.OK {
						err = fmt.Errorf("reservation refused, retry after %v", r.RetryAfter)
					}
					return err
				}, nil
			},
		},
		{
			name: "redis_rate v10", holds: "one request taken",
			make: func(rdb *redis.Client) (touch, error) {
				lim := redis_rate.NewLimiter(rdb)
				return func(ctx context.Context, key string) error {
					_, err := lim.Allow(ctx, key, redis_rate.PerHour(slowRate))
					return err
				}, nil
			},
		},
	}
}

// result is one row of the table.
type result struct {
	subject    subject
	keys       int     // names touched
	perKey     float64 // used_memory growth / keys
	keysPer    float64 // Redis keys per name touched
	sample     string  // one of the keys
	kind       string  // its type and encoding
	usage      int64   // MEMORY USAGE of the sample
	ttl        time.Duration
	createTime time.Duration
}

func run(ctx context.Context, args []string, out, progress io.Writer) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	loadBefore := machine.Load()
	srv, err := redisproc.Start()
	if err != nil {
		return err
	}
	defer srv.Stop()

	began := time.Now()
	var rows []result
	for _, s := range subjects(o) {
		r, err := measure(ctx, srv, s, o)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		fmt.Fprintf(progress, "%s: %.1f B per key (%d keys in %v)\n", s.name, r.perKey, r.keys, r.createTime.Round(time.Millisecond))
		rows = append(rows, r)
	}

	fmt.Fprintf(out, "Redis memory per idle key: the growth of INFO used_memory while `keys` keys are created by one request each, divided by `keys`. Every limit is %d per %v, so no key expires or fills while it is measured.\n\n",
		slowRate, slowPer)
	fmt.Fprintf(out, "| limiter | each key holds | keys | used_memory per key | MEMORY USAGE of one key | Redis type (encoding) | example key | TTL |\n")
	fmt.Fprintf(out, "| :--- | :--- | ---: | ---: | ---: | :--- | :--- | ---: |\n")
	for _, r := range rows {
		per := fmt.Sprintf("%.0f B", r.perKey)
		if r.keysPer != 1 {
			per += fmt.Sprintf(" (%.2f keys per name)", r.keysPer)
		}
		fmt.Fprintf(out, "| %s | %s | %d | %s | %d B | %s | `%s` | %v |\n",
			r.subject.name, r.subject.holds, r.keys, per, r.usage, r.kind, r.sample, r.ttl.Round(time.Second))
	}
	fmt.Fprintf(out, `
- used_memory per key is what such keys cost the server, each: the value, the key's name and Redis's own bookkeeping for a key with a TTL (its entries and hash-table slots in the keyspace and in the expires table, about %.0f B of slots per key at %d keys). MEMORY USAGE counts one key's name, value and entry only.
- Key names are as each limiter builds them for the names "k0", "k1", … "k%d"; shaper's carry a prefix and a {hash tag}, so they are longer than redis_rate's.
- A sorted set of up to 128 members is stored as a compact listpack; a sliding log whose limit is above 128 becomes a skiplist, which costs several times more per entry.
`, slotBytes(o.keys), o.keys, o.keys-1)
	fmt.Fprintf(out, "\nMachine: %s. Load average (1, 5, 15 min) %s before, %s after. Total time %v.\n",
		machine.Describe(srv.Version), loadBefore, machine.Load(), time.Since(began).Round(time.Second))
	cmd := "go run ./cmd/memory"
	if len(args) > 0 {
		cmd += " " + strings.Join(args, " ")
	}
	fmt.Fprintf(out, "Command: `cd bench && %s`\n", cmd)
	return nil
}

// measure creates s.keys (or o.keys) keys with s on an empty server and reports what
// they cost. Memory is read with no client connected but the reader's own,
// so that client buffers, which grow and shrink with traffic, do not count
// as keys.
func measure(ctx context.Context, srv *redisproc.Server, s subject, o options) (result, error) {
	// Load the scripts before the baseline: the script cache is no key's.
	warm := make([]string, o.workers)
	for i := range warm {
		warm[i] = "warm-" + strconv.Itoa(i)
	}
	err := withClient(ctx, srv, o.workers, func(rdb *redis.Client) error {
		if err := rdb.FlushAll(ctx).Err(); err != nil {
			return err
		}
		touch, err := s.make(rdb)
		if err != nil {
			return err
		}
		if err := touchAll(ctx, touch, warm, o.workers); err != nil {
			return fmt.Errorf("warm up: %w", err)
		}
		return nil
	})
	if err != nil {
		return result{}, err
	}
	before, keysBefore, err := idleMemory(srv)
	if err != nil {
		return result{}, err
	}

	n := o.keys
	if s.keys > 0 {
		n = s.keys
	}
	names := make([]string, n)
	for i := range names {
		names[i] = "k" + strconv.Itoa(i)
	}
	t0 := time.Now()
	err = withClient(ctx, srv, o.workers, func(rdb *redis.Client) error {
		touch, err := s.make(rdb)
		if err != nil {
			return err
		}
		return touchAll(ctx, touch, names, o.workers)
	})
	if err != nil {
		return result{}, err
	}
	created := time.Since(t0)
	after, keysAfter, err := idleMemory(srv)
	if err != nil {
		return result{}, err
	}
	if keysAfter-keysBefore < int64(n) {
		return result{}, fmt.Errorf("got %d new keys for %d names, want at least one each: did some expire?", keysAfter-keysBefore, n)
	}

	r := result{
		subject:    s,
		keys:       n,
		perKey:     float64(after-before) / float64(n),
		keysPer:    float64(keysAfter-keysBefore) / float64(n),
		createTime: created,
	}
	err = withClient(ctx, srv, 1, func(rdb *redis.Client) error { return describeSample(ctx, rdb, names[n/2], &r) })
	return r, err
}

// withClient runs f with a client of up to pool connections, and closes it.
func withClient(ctx context.Context, srv *redisproc.Server, pool int, f func(*redis.Client) error) error {
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: pool})
	defer rdb.Close()
	return f(rdb)
}

// touchAll touches every name, spread over workers goroutines.
func touchAll(ctx context.Context, touch touch, names []string, workers int) error {
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < len(names); i += workers {
				if err := touch(ctx, names[i]); err != nil {
					errs[w] = fmt.Errorf("touch %s: %w", names[i], err)
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// idleMemory reads used_memory and the number of keys once the server is
// idle: every other client has gone (the server notices a closed
// connection only when it next polls it) and used_memory has stopped
// moving, since Redis grows its keyspace's hash tables a step at a time
// and keeps both the old and the new one until it is done.
func idleMemory(srv *redisproc.Server) (used, keys int64, err error) {
	deadline := time.Now().Add(5 * time.Second)
	var prev int64 = -1
	for {
		clients, err := srv.Info("clients")
		if err != nil {
			return 0, 0, err
		}
		used, err := srv.UsedMemory()
		if err != nil {
			return 0, 0, err
		}
		// The one client is the connection that asked.
		if clients["connected_clients"] == "1" && used == prev {
			break
		}
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("redis did not settle in 5s: %s clients connected, used_memory %d after %d", clients["connected_clients"], used, prev)
		}
		prev = used
		time.Sleep(50 * time.Millisecond)
	}
	space, err := srv.Info("keyspace")
	if err != nil {
		return 0, 0, err
	}
	// db0:keys=100064,expires=100064,avg_ttl=...
	if db, ok := space["db0"]; ok {
		for _, f := range strings.Split(db, ",") {
			if v, ok := strings.CutPrefix(f, "keys="); ok {
				keys, err = strconv.ParseInt(v, 10, 64)
			}
		}
	}
	return prev, keys, err
}

// describeSample finds the key the limiter made for name and reads its
// shape.
func describeSample(ctx context.Context, rdb *redis.Client, name string, r *result) error {
	it := rdb.Scan(ctx, 0, "*"+name+"*", 1000).Iterator()
	for it.Next(ctx) {
		// "k5" also starts "k50"; the name ends the key or is followed by
		// the hash tag's brace.
		if k := it.Val(); strings.HasSuffix(k, name) || strings.Contains(k, name+"}") {
			r.sample = k
			break
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	if r.sample == "" {
		return fmt.Errorf("no key for the name %s", name)
	}
	typ, err := rdb.Type(ctx, r.sample).Result()
	if err != nil {
		return err
	}
	enc, err := rdb.ObjectEncoding(ctx, r.sample).Result()
	if err != nil {
		return err
	}
	r.kind = fmt.Sprintf("%s (%s)", typ, enc)
	switch typ {
	case "zset":
		n, err := rdb.ZCard(ctx, r.sample).Result()
		if err != nil {
			return err
		}
		r.kind += fmt.Sprintf(", %d members", n)
	case "hash":
		n, err := rdb.HLen(ctx, r.sample).Result()
		if err != nil {
			return err
		}
		r.kind += fmt.Sprintf(", %d fields", n)
	}
	if r.usage, err = rdb.MemoryUsage(ctx, r.sample, 0).Result(); err != nil {
		return err
	}
	if r.ttl, err = rdb.PTTL(ctx, r.sample).Result(); err != nil {
		return err
	}
	return nil
}

// slotBytes is what the keyspace's and the expires table's bucket arrays
// cost per key once they have grown to hold n keys: Redis doubles a table
// to the next power of two, one 8-byte pointer per slot.
func slotBytes(n int) float64 {
	slots := 1
	for slots <= n {
		slots *= 2
	}
	return 2 * 8 * float64(slots) / float64(n)
}
