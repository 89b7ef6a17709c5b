package jobstore

import (
	"context"
	"testing"
	"time"
)

// TestFinishWakesSleepersOnRetry: a retry wakes workers that sleep (their
// flag set), once, and clears the flag; a success wakes no one.
func TestFinishWakesSleepersOnRetry(t *testing.T) {
	e := newEnv(t, "wake")
	ctx := context.Background()
	sleepKey := "shaper:" + e.k.HashTag() + ":v"
	ps := e.rdb.Subscribe(ctx, "shaper:wake")
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	must(t, e.rdb.HSet(ctx, sleepKey, "sleep", 1).Err())
	wake := WakeOnRetry(sleepKey, "shaper:wake", "api")
	ok := e.taken("ok", "default", "")
	if _, err := Finish(ctx, e.rdb, e.k, e.counts, e.pbacklog, []Finished{{ID: "ok", Lane: "default", Msg: ok, Outcome: Succeeded}}, wake); err != nil {
		t.Fatal(err)
	}
	if v := e.rdb.HGet(ctx, sleepKey, "sleep").Val(); v != "1" {
		t.Fatalf("a success cleared the sleep flag (%q)", v)
	}
	r := e.taken("r", "default", "")
	if _, err := Finish(ctx, e.rdb, e.k, e.counts, e.pbacklog, []Finished{{ID: "r", Lane: "default", Msg: r, Outcome: Retry, RetryAt: time.Now().Add(time.Second)}}, wake); err != nil {
		t.Fatal(err)
	}
	msg, err := ps.ReceiveTimeout(ctx, 2*time.Second)
	if err != nil {
		t.Fatalf("no wake-up after a retry: %v", err)
	}
	if e.rdb.HExists(ctx, sleepKey, "sleep").Val() {
		t.Errorf("the sleep flag is still set after a retry woke the workers")
	}
	t.Logf("woken by %v", msg)
}
