package cli

import (
	stdlog "log"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
)

// asynq's Client and Inspector, all this process uses of asynq, log
// nothing through asynq's logger (its internal/log serves only its Server
// and Scheduler, which shaper does not run). One call of the standard
// library's log package is reachable from them: asynq's internal/errors.E
// reports a bad argument with log.Printf. net/http's servers write their
// own errors (a failed TLS handshake, a panicking handler) there too when
// given no ErrorLog. Those lines would go raw to stderr and break
// --log-format json, so the package's output is pointed once at stdLog,
// which hands each line to the slog logger the process built last.
var (
	stdLogOnce   sync.Once
	stdLogTarget atomic.Pointer[slog.Logger]
)

type stdLog struct{}

func (stdLog) Write(p []byte) (int, error) {
	if l := stdLogTarget.Load(); l != nil {
		l.Warn(strings.TrimSpace(string(p)), "component", "log")
	}
	return len(p), nil
}

// routeStdLogs sends the standard library log package's lines to log.
func routeStdLogs(log *slog.Logger) {
	stdLogTarget.Store(log)
	stdLogOnce.Do(func() {
		stdlog.SetFlags(0)
		stdlog.SetOutput(stdLog{})
	})
}
