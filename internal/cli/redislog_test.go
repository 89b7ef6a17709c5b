package cli

import (
	"bytes"
	"context"
	"encoding/json"
	stdlog "log"
	"log/slog"
	"testing"
)

// TestRedisLogsAreJSON: a go-redis log line comes out through the
// process's slog logger, one JSON object, not a raw line.
func TestRedisLogsAreJSON(t *testing.T) {
	var buf bytes.Buffer
	routeRedisLogs(slog.New(slog.NewJSONHandler(&buf, nil)))
	redisLog{}.Printf(context.Background(), "redis: %s failed: %v\n", "dial", "connection refused")
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("got %q, want one JSON record: %v", buf.String(), err)
	}
	if rec["msg"] != "redis: dial failed: connection refused" || rec["component"] != "go-redis" || rec["level"] != "WARN" {
		t.Errorf("got %v, want the line as a WARN from component go-redis", rec)
	}
}

// TestStdLogsAreJSON: a line of the standard library's log package (asynq's
// errors.E, net/http's server errors) comes out through the process's slog
// logger as one JSON object.
func TestStdLogsAreJSON(t *testing.T) {
	var buf bytes.Buffer
	routeStdLogs(slog.New(slog.NewJSONHandler(&buf, nil)))
	stdlog.Printf("errors.E: bad call from %s:%d: %v", "rdb.go", 42, []any{1.5})
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("got %q, want one JSON record: %v", buf.String(), err)
	}
	if rec["msg"] != "errors.E: bad call from rdb.go:42: [1.5]" || rec["component"] != "log" || rec["level"] != "WARN" {
		t.Errorf("got %v, want the line as a WARN from component log", rec)
	}
}
