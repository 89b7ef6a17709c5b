package jobstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// TestKeysAreAsynqs has asynq itself (its client, its server, its
// Inspector) write every kind of key a queue has, then checks each is where
// Keys says, and that asynq wrote no queue key Keys does not name.
func TestKeysAreAsynqs(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "kq")
	k := e.k
	release := make(chan struct{})
	running := make(chan struct{}, 1)
	handler := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		switch task.Type() {
		case "slow":
			running <- struct{}{}
			<-release
		case "fail", "die":
			return errors.New("no")
		}
		return nil
	})
	enq := func(typ, id string, opts ...asynq.Option) {
		t.Helper()
		opts = append([]asynq.Option{asynq.TaskID(id), asynq.Queue("kq")}, opts...)
		if _, err := e.client.EnqueueContext(ctx, asynq.NewTask(typ, nil), opts...); err != nil {
			t.Fatal(err)
		}
	}
	enq("ok", "ok", asynq.Retention(time.Hour))
	enq("fail", "fail", asynq.MaxRetry(5))
	enq("die", "die", asynq.MaxRetry(0))
	enq("slow", "slow")

	server := asynq.NewServerFromRedisClient(e.rdb, asynq.Config{
		Queues: map[string]int{"kq": 1}, Concurrency: 4, LogLevel: asynq.FatalLevel,
		RetryDelayFunc:  func(int, error, *asynq.Task) time.Duration { return time.Hour },
		ShutdownTimeout: 2 * time.Second,
	})
	if err := server.Start(handler); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			server.Shutdown()
		}
	}
	defer stop()
	select {
	case <-running:
	case <-time.After(10 * time.Second):
		t.Fatal("asynq's server did not start the task")
	}
	// While it runs, the task is in the active list and holds a lease.
	if err := e.rdb.LPos(ctx, k.Active(), "slow", redis.LPosArgs{}).Err(); err != nil {
		t.Fatalf("%s: %v", k.Active(), err)
	}
	if err := e.rdb.ZScore(ctx, k.Lease(), "slow").Err(); err != nil {
		t.Fatalf("%s: %v", k.Lease(), err)
	}
	close(release)
	waitFor(t, func() bool {
		q, err := e.insp.GetQueueInfo("kq")
		return err == nil && q.Completed == 1 && q.Retry == 1 && q.Archived == 1 && q.Active == 0 && q.Pending == 0
	})
	stop()

	enq("pend", "pend")
	enq("sched", "sched", asynq.ProcessIn(time.Hour))
	enq("grouped", "grouped", asynq.Group("g1"))
	if err := e.insp.PauseQueue("kq"); err != nil {
		t.Fatal(err)
	}

	now := time.Now()
	for _, c := range []struct {
		key string
		cmd redis.Cmder
	}{
		{k.Task("ok"), e.rdb.HGet(ctx, k.Task("ok"), "msg")},
		{k.Pending(), e.rdb.LPos(ctx, k.Pending(), "pend", redis.LPosArgs{})},
		{k.Scheduled(), e.rdb.ZScore(ctx, k.Scheduled(), "sched")},
		{k.Retry(), e.rdb.ZScore(ctx, k.Retry(), "fail")},
		{k.Archived(), e.rdb.ZScore(ctx, k.Archived(), "die")},
		{k.Completed(), e.rdb.ZScore(ctx, k.Completed(), "ok")},
		{k.Group("g1"), e.rdb.ZScore(ctx, k.Group("g1"), "grouped")},
		{k.Paused(), e.rdb.Get(ctx, k.Paused())},
		{k.Processed(now), e.rdb.Get(ctx, k.Processed(now))},
		{k.ProcessedTotal(), e.rdb.Get(ctx, k.ProcessedTotal())},
		{k.Failed(now), e.rdb.Get(ctx, k.Failed(now))},
		{k.FailedTotal(), e.rdb.Get(ctx, k.FailedTotal())},
	} {
		if err := c.cmd.Err(); err != nil {
			t.Errorf("%s: %v", c.key, err)
		}
	}
	if ok, err := e.rdb.SIsMember(ctx, k.Groups(), "g1").Result(); !ok || err != nil {
		t.Errorf("%s: got %v, %v, want g1 in it", k.Groups(), ok, err)
	}
	if ok, err := e.rdb.SIsMember(ctx, AllQueues, "kq").Result(); !ok || err != nil {
		t.Errorf("%s: got %v, %v, want kq in it", AllQueues, ok, err)
	}
	if !strings.HasPrefix(k.Task("x"), k.TaskPrefix()) || k.TaskPrefix()+"x" != k.Task("x") {
		t.Errorf("TaskPrefix %q does not prefix Task(x) %q", k.TaskPrefix(), k.Task("x"))
	}

	// Every queue key asynq wrote is one Keys names.
	named := map[string]bool{}
	for _, key := range []string{k.Pending(), k.Active(), k.Lease(), k.Scheduled(), k.Retry(), k.Archived(),
		k.Completed(), k.Paused(), k.Groups(), k.Group("g1"), k.Processed(now), k.ProcessedTotal(),
		k.Failed(now), k.FailedTotal()} {
		named[key] = true
	}
	all, err := e.rdb.Keys(ctx, "asynq:{kq}:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range all {
		if !named[key] && !strings.HasPrefix(key, k.TaskPrefix()) {
			t.Errorf("asynq wrote %s, which Keys does not name", key)
		}
	}
}

func TestKeysCarryTheHashTag(t *testing.T) {
	k := AsynqKeys("up.stream")
	now := time.Date(2026, 12, 1, 0, 30, 0, 0, time.FixedZone("east", 3600)) // 23:30 UTC the day before
	for _, key := range []string{k.Task("id"), k.TaskPrefix(), k.Pending(), k.Active(), k.Lease(), k.Scheduled(),
		k.Retry(), k.Archived(), k.Completed(), k.Paused(), k.Groups(), k.Group("g"), k.Processed(now),
		k.ProcessedTotal(), k.Failed(now), k.FailedTotal()} {
		if !strings.HasPrefix(key, "asynq:"+k.HashTag()+":") {
			t.Errorf("%s: want it under asynq:%s:", key, k.HashTag())
		}
	}
	// Days are UTC days, as asynq counts them, whatever t's zone.
	if got, want := k.Processed(now), "asynq:{up.stream}:processed:2026-11-30"; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
	if got, want := k.Failed(now.Add(time.Hour)), "asynq:{up.stream}:failed:2026-12-01"; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

// TestPrefixNamesKeysAsTheTake: the take names the queue's keys it uses
// from Prefix (take.lua), by these suffixes: they must be the keys Keys
// names.
func TestPrefixNamesKeysAsTheTake(t *testing.T) {
	k := AsynqKeys("up.stream")
	for suffix, want := range map[string]string{"scheduled": k.Scheduled(), "retry": k.Retry(), "active": k.Active(),
		"lease": k.Lease(), "groups": k.Groups(), "paused": k.Paused(), "g:g": k.Group("g"), "t:id": k.Task("id")} {
		if got := k.Prefix() + suffix; got != want {
			t.Errorf("Prefix() + %q: got %s, want %s", suffix, got, want)
		}
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 15s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
