// Drain counts: how many jobs each upstream sends per second, fleet wide,
// so that `shaper status` can show drain rates from Redis alone. Each
// worker replica counts its sends in memory and adds them, about once a
// second, to one key per upstream and second (read for the 10 s and 60 s
// rates, kept for Keep) and to one key per upstream and HistoryStep (read
// for the status page's chart, kept for History and a little more).

package jobstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/keyspace"
	"github.com/shaperhq/shaper/internal/script"
)

// Keep is how long per-second counts live: enough for a 60 s rate.
const Keep = 2 * time.Minute

// History is how far back HistoryAt reads, in steps of HistoryStep: the
// status page's chart.
const (
	History     = 15 * time.Minute
	HistoryStep = 10 * time.Second
)

// historyTTL is how long a step's count lives after its last write.
// HistoryAt reads a step as its oldest point until History and one step
// after the step began; a count written at the step's first second must
// last that long, and one more step spares a replica's late flush and
// clocks a little apart.
const historyTTL = History + 2*HistoryStep

// drainKey is the count of sends to upstream during unix second sec. The hash tag
// keeps an upstream's seconds in one slot, so one MGET reads them.
func drainKey(prefix, upstream string, sec int64) string {
	return prefix + ":drain:{" + upstream + "}:" + strconv.FormatInt(sec, 10)
}

// stepKey is the count of sends to upstream during the HistoryStep that
// begins at unix second start; in the same slot as drainKey.
func stepKey(prefix, upstream string, start int64) string {
	return prefix + ":drain:{" + upstream + "}:step:" + strconv.FormatInt(start, 10)
}

// stepStart is the start of the HistoryStep holding unix second sec.
func stepStart(sec int64) int64 {
	step := int64(HistoryStep / time.Second)
	return sec - ((sec%step)+step)%step
}

// Recorder batches one replica's send counts (see Drain counts above).
// Safe for concurrent use.
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
	// One script call an upstream (its keys share its slot), all in one
	// pipeline.
	var invs []script.Invocation
	keep, hist := int64(Keep/time.Second), int64(historyTTL/time.Second)
	for up, secs := range counts {
		var inv script.Invocation
		steps := map[int64]int64{}
		for sec, n := range secs {
			inv.Keys = append(inv.Keys, drainKey(r.prefix, up, sec))
			inv.Args = append(inv.Args, n, keep)
			steps[stepStart(sec)] += n
		}
		for start, n := range steps {
			inv.Keys = append(inv.Keys, stepKey(r.prefix, up, start))
			inv.Args = append(inv.Args, n, hist)
		}
		invs = append(invs, inv)
	}
	_, errs := script.RunPipelined(ctx, r.rdb, "jobstore.drain_add", drainAddScript, invs)
	if err := errors.Join(errs...); err != nil {
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
	// Recent is the last 10 seconds' sends over the seconds since the
	// first of them that sent anything: a drain that began 3 s ago is not
	// averaged with the 7 idle seconds before it, as Last10s is. 0 when
	// none of them sent anything. Not shown: status reads it to tell a
	// drain that is starting from one that is slow.
	Recent float64 `json:"-"`
	// RecentFull is true when every one of the last 10 seconds sent
	// something: a drain under way all along, not one that is starting
	// or starting again.
	RecentFull bool `json:"-"`
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
	oldest, busy := -1, 0 // the oldest of the last 10 seconds that sent anything; how many did
	for i, v := range vals {
		n := count(v)
		if i < 10 {
			sum10 += n
			if n > 0 {
				oldest, busy = i, busy+1
			}
		}
		sum60 += n
	}
	r := Rates{Last10s: sum10 / 10, Last60s: sum60 / 60, RecentFull: busy == 10}
	if oldest >= 0 {
		r.Recent = sum10 / float64(oldest+1)
	}
	return r, nil
}

// count reads one MGET value: a missing key counts none.
func count(v any) float64 {
	s, ok := v.(string)
	if !ok {
		return 0
	}
	n, _ := strconv.ParseFloat(s, 64)
	return n
}

// Point is the drain rate over one HistoryStep.
type Point struct {
	// At is when the step ended.
	At time.Time `json:"at"`
	// Rate is the step's sends over its length, per second.
	Rate float64 `json:"drain_rate"`
}

// HistoryAt reads the drain rate over the last History, one Point per
// HistoryStep, oldest first: History/HistoryStep steps, the latest the
// last whose seconds Read would count (so the latest flushes are in). A
// step with no sends, or from before anything was recorded, reads 0.
func HistoryAt(ctx context.Context, rdb redis.UniversalClient, prefix, upstream string, now time.Time) ([]Point, error) {
	prefix = keyspace.Prefix(prefix)
	step := int64(HistoryStep / time.Second)
	n := int(History / HistoryStep)
	// The latest step whose last second is at most now-2, the last second
	// Read counts.
	latest := stepStart(now.Unix()-1) - step
	keys := make([]string, n)
	for i := range keys {
		keys[i] = stepKey(prefix, upstream, latest-int64(n-1-i)*step)
	}
	vals, err := rdb.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, fmt.Errorf("read drain history of %s: %w", upstream, err)
	}
	out := make([]Point, n)
	for i, v := range vals {
		start := latest - int64(n-1-i)*step
		out[i] = Point{At: time.Unix(start+step, 0).UTC(), Rate: count(v) / float64(step)}
	}
	return out, nil
}
