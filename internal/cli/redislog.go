package cli

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// go-redis logs its own events (a pool that could not reconnect, a
// cluster slot refresh that failed) through a process-wide logger that
// writes raw lines to stderr, which would break --log-format json. It is
// pointed once at redisLog, which hands each line to the slog logger the
// process built last.
var (
	redisLogOnce   sync.Once
	redisLogTarget atomic.Pointer[slog.Logger]
)

type redisLog struct{}

func (redisLog) Printf(ctx context.Context, format string, v ...any) {
	l := redisLogTarget.Load()
	if l == nil {
		return
	}
	l.WarnContext(ctx, strings.TrimSpace(fmt.Sprintf(format, v...)), "component", "go-redis")
}

// routeRedisLogs sends go-redis's log lines to log.
func routeRedisLogs(log *slog.Logger) {
	redisLogTarget.Store(log)
	redisLogOnce.Do(func() { redis.SetLogger(redisLog{}) })
}
