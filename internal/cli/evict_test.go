package cli

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
)

// TestServeWarnsOfEviction: serve warns at start when Redis may evict
// keys, and says nothing under noeviction.
func TestServeWarnsOfEviction(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	defer rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction")
	for _, tc := range []struct {
		policy string
		warn   bool
	}{{"allkeys-lru", true}, {"volatile-ttl", true}, {"noeviction", false}} {
		if err := rdb.ConfigSet(ctx, "maxmemory-policy", tc.policy).Err(); err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		warnIfEvicting(ctx, rdb, slog.New(slog.NewTextHandler(&buf, nil)))
		if got := strings.Contains(buf.String(), "level=WARN") && strings.Contains(buf.String(), "maxmemory-policy="+tc.policy); got != tc.warn {
			t.Errorf("maxmemory-policy %s: logged %q, want a warning %v", tc.policy, buf.String(), tc.warn)
		}
	}
}
