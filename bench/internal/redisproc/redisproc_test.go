package redisproc

import (
	"context"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestCrashTruncateRestart writes keys, notes the AOF's size, writes more,
// crashes the server, cuts the AOF back to the noted size and restarts it:
// the first keys must be back and the later ones gone, as after a power
// loss that took the writes since the note.
func TestCrashTruncateRestart(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not in PATH")
	}
	s, err := StartWith(Options{AppendFsync: "everysec"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer rdb.Close()
	set := func(prefix string) {
		for i := range 100 {
			if err := rdb.Set(ctx, fmt.Sprintf("%s:%d", prefix, i), "v", 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	set("kept")
	file, size, err := s.AOFTail()
	if err != nil {
		t.Fatal(err)
	}
	set("lost")
	s.Crash()
	dropped, err := s.TruncateAOF(file, size)
	if err != nil {
		t.Fatal(err)
	}
	if dropped <= 0 {
		t.Errorf("dropped %d bytes, want the second hundred keys' worth", dropped)
	}
	if err := s.Restart(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	for prefix, want := range map[string]int64{"kept": 100, "lost": 0} {
		keys, err := rdb.Keys(ctx, prefix+":*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := int64(len(keys)); got != want {
			t.Errorf("%s keys after the restart: got %d, want %d", prefix, got, want)
		}
	}
}

// TestCrashKeepsWrittenData is the plain process crash: what Redis wrote
// to its AOF before answering survives a SIGKILL.
func TestCrashKeepsWrittenData(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not in PATH")
	}
	s, err := StartWith(Options{AppendFsync: "everysec"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer rdb.Close()
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Crash()
	if err := s.Restart(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	got, err := rdb.Get(ctx, "k").Result()
	if err != nil || got != "v" {
		t.Errorf("k after the crash: got %q (%v), want v", got, err)
	}
}
