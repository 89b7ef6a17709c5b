package jobstore

import (
	"context"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/script"
)

// Index is one of asynq's per-state indexes of a queue, as ReadIndex pages
// through it.
type Index uint8

const (
	IndexActive Index = iota + 1
	IndexScheduled
	IndexRetry
	IndexArchived
	IndexCompleted
)

func (i Index) String() string {
	switch i {
	case IndexActive:
		return "active"
	case IndexScheduled:
		return "scheduled"
	case IndexRetry:
		return "retry"
	case IndexArchived:
		return "archived"
	case IndexCompleted:
		return "completed"
	}
	return "Index(" + strconv.Itoa(int(i)) + ")"
}

// IndexEntry is one entry of an index page, with the task hash's fields a
// listing filters on.
type IndexEntry struct {
	ID string
	// Score is the entry's score in a sorted set, its position in the
	// active list: with ID, the cursor to read on after it.
	Score string
	// State and Partition are the task hash's state and sp fields, ""
	// when unset.
	State, Partition string
}

// ReadIndex reads up to n entries of index idx, newest first, after the
// cursor (score, member) of the last entry read ("", "" from the top), in
// one atomic step: entries joining or leaving meanwhile shift nothing under
// the cursor (see page.lua).
func (k Keys) ReadIndex(ctx context.Context, rdb redis.Scripter, idx Index, score, member string, n int) ([]IndexEntry, error) {
	key, kind := k.Completed(), "z"
	switch idx {
	case IndexActive:
		key, kind = k.Active(), "l"
	case IndexScheduled:
		key = k.Scheduled()
	case IndexRetry:
		key = k.Retry()
	case IndexArchived:
		key = k.Archived()
	}
	v, err := script.Run(ctx, rdb, "jobstore.page", pageScript, []string{key}, kind, score, member, n, k.TaskPrefix())
	if err != nil {
		return nil, err
	}
	rows, _ := v.([]any)
	out := make([]IndexEntry, 0, len(rows)/4)
	for i := 0; i+3 < len(rows); i += 4 {
		s := func(j int) string { x, _ := rows[i+j].(string); return x }
		out = append(out, IndexEntry{ID: s(0), Score: s(1), State: s(2), Partition: s(3)})
	}
	return out, nil
}
