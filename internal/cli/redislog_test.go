package cli

import (
	"bytes"
	"context"
	"encoding/json"
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
