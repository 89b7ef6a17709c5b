package jobstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/script"
)

// Errors of Revive; nothing changed when one is returned.
var (
	// ErrNotArchived: the job is not dead (or cancelled); the error says
	// what it is.
	ErrNotArchived = errors.New("job is not dead")
	// ErrChanged: the job's message is not the one the caller read; read
	// it again.
	ErrChanged = errors.New("job changed meanwhile")
	// ErrNeedMissing: the key the revival needs (a job's sensitive
	// headers) is gone.
	ErrNeedMissing = errors.New("a key the job needs is gone")
)

// Revival is a dead job to put back in its flow.
type Revival struct {
	ID string
	// Was is the task's message as the caller read it: the job is
	// revived only if it is still that (a compare and set, so the caller
	// can rewrite the message in Go).
	Was []byte
	// Msg is the message to store instead (attempts reset and so on).
	Msg []byte
	// Forget, when set, is a key deleted with the revival (the mark that
	// says the job was cancelled). It must carry the queue's hash tag.
	Forget string
	// Needs, when set, is a key that must exist for the job to be sent
	// (its sensitive headers); without it nothing changes. It must carry
	// the queue's hash tag.
	Needs string
}

// Revive moves a dead (archived) job back into its flow at the back, as
// though just enqueued: out of asynq's archive and the dead:LANE counter,
// into pending:LANE and its partition's backlog, with r.Msg as its message
// and its stored result dropped; then it wakes the workers. It returns
// redis.Nil if there is no such job, and ErrNotArchived, ErrChanged or
// ErrNeedMissing (wrapped) when it changes nothing.
func (s Space) Revive(ctx context.Context, rdb redis.Scripter, r Revival) error {
	keys := []string{s.TaskKey(r.ID), s.vKey(), s.fKey(), s.calKey(), s.CountsKey(), s.BacklogKey(),
		s.a.Archived(), s.a.Groups()}
	if r.Forget != "" {
		keys = append(keys, r.Forget)
	}
	if r.Needs != "" {
		keys = append(keys, r.Needs)
	}
	forget, needs := "0", "0"
	if r.Forget != "" {
		forget = "1"
	}
	if r.Needs != "" {
		needs = "1"
	}
	v, err := script.Run(ctx, rdb, "jobstore.revive", reviveScript, keys,
		"", r.ID, r.Was, r.Msg, s.our, s.groupPrefix(), s.taskPrefix(), s.wake, s.Upstream, forget, needs)
	if err != nil {
		return err
	}
	switch st, _ := v.(string); st {
	case "ok":
		return nil
	case "":
		return redis.Nil
	case "changed":
		return ErrChanged
	case "needs":
		return ErrNeedMissing
	default:
		return fmt.Errorf("%w: it is %s", ErrNotArchived, st)
	}
}
