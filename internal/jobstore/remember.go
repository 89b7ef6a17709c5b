package jobstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/script"
)

// Remembered are the compact records of finished tasks whose ID is an
// idempotency key's, kept once the task itself is deleted (past a count
// bound or its retention) for Window more, so that a repeat of the key
// finds what became of it instead of making the task again.
//
// Layout, all in the queue's slot: buckets Key+":"+NAME, hashes of a
// 20-hex-digit digest of the task ID -> one letter, its final state ("s"
// succeeded, "d" dead, "c" cancelled); a record goes into the bucket of
// the Span it was made in. Key itself is a sorted set of bucket NAME ->
// when the bucket's records are up (its span's end plus Window), Unix
// seconds. A record is thus kept at least Window and at most Window plus
// a Span after it was made. The scripts that make records drop buckets
// whose time is up (UNLINK: a large one is freed off Redis's main thread),
// and every key also carries a TTL a span later as a backstop. Bucket names carry
// their span, so a changed Window (and so Span) still finds the records
// made before.
//
// A record costs about 80 bytes of Redis memory (a hash field of 20 bytes
// and a one-byte value); in all about drop rate × Window × 80 bytes.
type Remembered struct {
	// Key is the index of buckets; "" remembers nothing.
	Key string
	// Window is how long a record is kept at least.
	Window time.Duration
	// Span is how much time one bucket covers; default Window/24 (at
	// least a second).
	Span time.Duration
	// Pattern is a Lua pattern a task ID matches when it is an
	// idempotency key's; only those are remembered.
	Pattern string
	// CancelPrefix, when set, is a side key prefix the task ID completes
	// (in the queue's slot) whose key marks an archived task cancelled.
	CancelPrefix string
}

func (r Remembered) on() bool { return r.Key != "" && r.Window > 0 && r.Pattern != "" }

// args are the scripts' five values: key, window and span in seconds,
// pattern, cancel prefix; a key of "" when off.
func (r Remembered) args() []any {
	if !r.on() {
		return []any{"", 0, 0, "", ""}
	}
	w := max(int64(math.Ceil(r.Window.Seconds())), 1)
	span := int64(math.Ceil(r.Span.Seconds()))
	if span <= 0 {
		span = max((w+23)/24, 1)
	}
	return []any{r.Key, w, span, r.Pattern, r.CancelPrefix}
}

// RecallArg is what a script that recalls a record (remember.lua's recall)
// is given for the task's ID: "" when r is off.
func (r Remembered) RecallArg() string {
	if !r.on() {
		return ""
	}
	return r.Key
}

// Recall returns the final state recorded for id ('s', 'd' or 'c'), or 0
// when there is no record (never was, not an idempotency key's, still
// kept as a task, or its window is over).
func (r Remembered) Recall(ctx context.Context, rdb redis.Scripter, id string) (byte, error) {
	if !r.on() {
		return 0, nil
	}
	v, err := script.Run(ctx, rdb, "recall", recallScript, []string{r.Key}, id)
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("recall %s: %w", id, err)
	}
	s, _ := v.(string)
	if len(s) != 1 {
		return 0, nil
	}
	return s[0], nil
}
