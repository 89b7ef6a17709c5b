package jobstore

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/keyspace"
)

// Keep is how long per-second counts live: enough for a 60 s rate.
const Keep = 2 * time.Minute

// drainKey is the count of sends to upstream during unix second sec. The hash tag
// keeps an upstream's seconds in one slot, so one MGET reads them.
func drainKey(prefix, upstream string, sec int64) string {
	return prefix + ":drain:{" + upstream + "}:" + strconv.FormatInt(sec, 10)
}

// Recorder batches one replica's send counts, so that `shaper status` can
// show drain rates fleet wide from Redis alone: each worker replica counts
// its sends in memory and adds them to one key per upstream and second about
// once a second; the keys expire after Keep. Safe for concurrent use.
type Recorder struct {
	rdb    redis.UniversalClient
	prefix string

	mu     sync.Mutex
	counts map[string]map[int64]int64 // upstream -> second -> sends
}

// NewRecorder returns a Recorder writing under prefix (default
// keyspace.DefaultPrefix).
func NewRecorder(rdb redis.UniversalClient, prefix string) *Recorder {
	return &Recorder{rdb: rdb, prefix: keyspace.Prefix(prefix), counts: map[string]map[int64]int64{}}
}

// Sent counts one send to upstream at time t.
func (r *Recorder) Sent(upstream string, t time.Time) {
	r.mu.Lock()
	m := r.counts[upstream]
	if m == nil {
		m = map[int64]int64{}
		r.counts[upstream] = m
	}
	m[t.Unix()]++
	r.mu.Unlock()
}

// Flush adds the counts gathered so far to Redis. On failure the counts are
// kept for the next flush.
func (r *Recorder) Flush(ctx context.Context) error {
	r.mu.Lock()
	counts := r.counts
	r.counts = map[string]map[int64]int64{}
	r.mu.Unlock()
	if len(counts) == 0 {
		return nil
	}
	pipe := r.rdb.Pipeline()
	for up, secs := range counts {
		for sec, n := range secs {
			k := drainKey(r.prefix, up, sec)
			pipe.IncrBy(ctx, k, n)
			pipe.Expire(ctx, k, Keep)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		r.mu.Lock()
		for up, secs := range counts {
			m := r.counts[up]
			if m == nil {
				m = map[int64]int64{}
				r.counts[up] = m
			}
			for sec, n := range secs {
				if time.Since(time.Unix(sec, 0)) < Keep {
					m[sec] += n
				}
			}
		}
		r.mu.Unlock()
		return fmt.Errorf("record drain counts: %w", err)
	}
	return nil
}

// Run flushes every interval until ctx ends, then once more.
func (r *Recorder) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			r.Flush(fctx)
			cancel()
			return
		case <-t.C:
			r.Flush(ctx)
		}
	}
}

// Rates are an upstream's sends per second, averaged over recent seconds.
type Rates struct {
	Last10s float64 `json:"last_10s"`
	Last60s float64 `json:"last_60s"`
}

// Read averages the complete seconds before now: the current second is still
// being counted, and the one before may still be on its way from replicas
// that flush once a second, so both are left out.
func Read(ctx context.Context, rdb redis.UniversalClient, prefix, upstream string, now time.Time) (Rates, error) {
	prefix = keyspace.Prefix(prefix)
	last := now.Unix() - 2
	keys := make([]string, 60)
	for i := range keys {
		keys[i] = drainKey(prefix, upstream, last-int64(i))
	}
	vals, err := rdb.MGet(ctx, keys...).Result()
	if err != nil {
		return Rates{}, fmt.Errorf("read drain counts of %s: %w", upstream, err)
	}
	var sum10, sum60 float64
	for i, v := range vals {
		s, ok := v.(string)
		if !ok {
			continue
		}
		n, _ := strconv.ParseFloat(s, 64)
		if i < 10 {
			sum10 += n
		}
		sum60 += n
	}
	return Rates{Last10s: sum10 / 10, Last60s: sum60 / 60}, nil
}
