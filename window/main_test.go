package window

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/testsupport/childproc"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

// srv is the package's one Redis, started in TestMain.
var srv *redistest.Server

func TestMain(m *testing.M) {
	if role := childproc.Role(); role != "" {
		os.Exit(runChild(role))
	}
	redistest.Main(m, &srv)
}

// noLeaks fails t if it leaves goroutines behind. Call it first, so its
// cleanup runs after every other (cleanups run last in, first out).
func noLeaks(t *testing.T) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
}

// clock is a test's hand-moved time, in µs since the Unix epoch.
type clock struct{ now int64 }

func (c *clock) Now() time.Time { return time.UnixMicro(c.now) }

// testNow is a realistic start time: the scripts should see the magnitudes
// Redis TIME gives.
const testNow = int64(1_900_000_000_000_000)

// subject is what the tests need of each limiter.
type subject interface {
	shaper.Limiter
	Reset(ctx context.Context, key string) error
	Limit() Limit
}

// model holds a pure-Go model's state per key.
type model interface {
	allow(key string, now, n int64) decision
}

type algorithm struct {
	name    string
	kind    string // key infix
	windows int64  // how many windows a key's state matters for
	new     func(redis.Scripter, Limit, Config) (subject, error)
	model   func(Limit) model
}

func algorithms() []algorithm {
	return []algorithm{
		{
			name: "fixed window", kind: "fw", windows: 1,
			new: func(r redis.Scripter, l Limit, c Config) (subject, error) { return NewFixedWindow(r, l, c) },
			model: func(l Limit) model {
				return &counterModel{per: l.per(), rate: l.Rate, decide: fixedWindowModel, keys: map[string]counterState{}}
			},
		},
		{
			name: "sliding log", kind: "sl", windows: 1,
			new: func(r redis.Scripter, l Limit, c Config) (subject, error) { return NewSlidingLog(r, l, c) },
			model: func(l Limit) model {
				return &logModel{per: l.per(), rate: l.Rate, keys: map[string][]int64{}}
			},
		},
		{
			name: "sliding window", kind: "sw", windows: 2,
			new: func(r redis.Scripter, l Limit, c Config) (subject, error) { return NewSlidingWindow(r, l, c) },
			model: func(l Limit) model {
				return &counterModel{per: l.per(), rate: l.Rate, decide: slidingWindowModel, keys: map[string]counterState{}}
			},
		},
	}
}

type counterModel struct {
	per, rate int64
	decide    func(st counterState, now, per, rate, n int64) (decision, counterState)
	keys      map[string]counterState
}

func (m *counterModel) allow(key string, now, n int64) decision {
	d, st := m.decide(m.keys[key], now, m.per, m.rate, n)
	m.keys[key] = st
	return d
}

type logModel struct {
	per, rate int64
	keys      map[string][]int64
}

func (m *logModel) allow(key string, now, n int64) decision {
	d, log := slidingLogModel(m.keys[key], now, m.per, m.rate, n)
	m.keys[key] = log
	return d
}

// result is the shaper.Result a script's reply d becomes.
func result(d decision, rate int64) shaper.Result {
	return shaper.Result{
		Allowed:    d.allowed,
		Limit:      rate,
		Remaining:  d.remaining,
		RetryAfter: time.Duration(d.retryAfter) * time.Microsecond,
		ResetAfter: time.Duration(d.resetAfter) * time.Microsecond,
	}
}

// uniquePrefix keeps a test's keys apart from earlier runs against the
// same server (go test -count=N).
func uniquePrefix(name string) string {
	return name + "-" + time.Now().Format("150405.000000000")
}
