package jobstore

import (
	"context"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// subscribed is a subscription to FinalChannel, confirmed.
func subscribed(t *testing.T, rdb redis.UniversalClient) *redis.PubSub {
	t.Helper()
	ps := rdb.Subscribe(context.Background(), FinalChannel(""))
	t.Cleanup(func() { ps.Close() })
	if _, err := ps.Receive(context.Background()); err != nil {
		t.Fatal(err)
	}
	return ps
}

// announced is the next message on ps, "" when none comes within a while.
func announced(t *testing.T, ps *redis.PubSub, within time.Duration) string {
	t.Helper()
	m, err := ps.ReceiveTimeout(context.Background(), within)
	if err != nil {
		return ""
	}
	msg, ok := m.(*redis.Message)
	if !ok {
		t.Fatalf("got %T on the final channel, want a message", m)
	}
	return msg.Payload
}

// TestFinishAnnouncesFinal: one Finish publishes the ids it made final,
// succeeded (kept or not) and dead, in one message; a retry, an item no
// longer active and a Finish without the option announce nothing.
func TestFinishAnnouncesFinal(t *testing.T) {
	e := newEnv(t, "final")
	ctx := context.Background()
	ps := subscribed(t, e.rdb)
	ann := AnnounceFinal(FinalChannel(""))
	items := []Finished{
		{ID: "kept", Lane: "default", Msg: e.taken("kept", "default", ""), Outcome: Succeeded, Retention: time.Hour},
		{ID: "gone", Lane: "default", Msg: e.taken("gone", "default", ""), Outcome: Succeeded},
		{ID: "retry", Lane: "default", Msg: e.taken("retry", "default", ""), Outcome: Retry, Failure: true},
		{ID: "dead", Lane: "default", Msg: e.taken("dead", "default", "p"), Outcome: Dead, ErrMsg: "400"},
	}
	if _, err := Finish(ctx, e.rdb, e.k, e.counts, e.pbacklog, items, ann); err != nil {
		t.Fatal(err)
	}
	if got, want := announced(t, ps, 2*time.Second), "kept\ngone\ndead"; got != want {
		t.Fatalf("announced %q, want %q", got, want)
	}
	// Finished again: not active, so not final now; nothing is announced.
	if _, err := Finish(ctx, e.rdb, e.k, e.counts, e.pbacklog, items[:1], ann); err != nil {
		t.Fatal(err)
	}
	quiet := Finished{ID: "quiet", Lane: "default", Msg: e.taken("quiet", "default", ""), Outcome: Succeeded, Retention: time.Hour}
	if _, err := Finish(ctx, e.rdb, e.k, e.counts, e.pbacklog, []Finished{quiet}); err != nil {
		t.Fatal(err)
	}
	if got := announced(t, ps, 200*time.Millisecond); got != "" {
		t.Fatalf("announced %q for items made final by no one or without AnnounceFinal", got)
	}
}

// TestRecoverAnnouncesDead: a lease that ran out on a task's last attempt
// makes it dead, and that is announced; one with attempts left is not.
func TestRecoverAnnouncesDead(t *testing.T) {
	e := newEnv(t, "final")
	ctx := context.Background()
	ps := subscribed(t, e.rdb)
	e.enqueue("last", "default", "")
	last := e.take("last", time.Now().Add(-time.Second))
	last.Retry = 1
	must(t, e.rdb.HSet(ctx, e.k.Task("last"), "msg", last.Marshal()).Err())
	e.enqueue("again", "default", "")
	e.take("again", time.Now().Add(-time.Second))
	n, err := Recover(ctx, e.rdb, e.k, e.counts, e.pbacklog, time.Now(), 10, AnnounceFinal(FinalChannel("")))
	if err != nil || n != 2 {
		t.Fatalf("Recover: got %d, %v; want 2", n, err)
	}
	if got := announced(t, ps, 2*time.Second); got != "last" {
		t.Fatalf("announced %q, want %q", got, "last")
	}
}

// TestCancelAnnounces: a cancelled job is final and announced; a job that
// cannot be cancelled is not.
func TestCancelAnnounces(t *testing.T) {
	e := newEnv(t, QueueName("api"))
	rdb := e.rdb
	ctx := context.Background()
	ps := subscribed(t, rdb)
	s := For("", "api")
	e.enqueue("j1", "default", "", asynq.ProcessIn(time.Hour))
	if err := s.Cancel(ctx, rdb, "j1"); err != nil {
		t.Fatal(err)
	}
	if got := announced(t, ps, 2*time.Second); got != "j1" {
		t.Fatalf("announced %q, want j1", got)
	}
	if err := s.Cancel(ctx, rdb, "j1"); err == nil {
		t.Fatal("a second cancel succeeded")
	}
	if got := announced(t, ps, 200*time.Millisecond); got != "" {
		t.Fatalf("a refused cancel announced %q", got)
	}
}

// woken gathers w's wake-ups until want says they are enough or within
// passes: the ids announced and whether every job was to be read again. (A
// wake-up may say nothing new: one that came while the last was read.)
func woken(w *Watch, within time.Duration, want func(ids []string, all bool) bool) ([]string, bool) {
	var ids []string
	all := false
	deadline := time.After(within)
	for !want(ids, all) {
		select {
		case <-w.C():
			got, a := w.Woken()
			ids, all = append(ids, got...), all || a
		case <-deadline:
			return ids, all
		}
	}
	return ids, all
}

func readAgain(_ []string, all bool) bool { return all }

// TestFinalsWakesItsWaiters: a watch is woken for every watched job that
// is announced, not for others; every watch is woken to read again when
// the subscription is made anew (messages may have been lost meanwhile);
// Close stops the subscriber and closes Closed.
func TestFinalsWakesItsWaiters(t *testing.T) {
	e := newEnv(t, "final")
	ctx := context.Background()
	before := runtime.NumGoroutine()
	f := NewFinals(e.rdb, "")
	a := f.Watch("a", "b")
	other := f.Watch("c")
	// The first subscription wakes every watch: they may predate it.
	for _, w := range []*Watch{a, other} {
		if _, all := woken(w, 2*time.Second, readAgain); !all {
			t.Fatal("the first subscription woke no watch to read again; want every watch")
		}
	}
	if n := f.Waiters(); n != 2 {
		t.Fatalf("Waiters: got %d, want 2", n)
	}
	items := []Finished{
		{ID: "b", Lane: "default", Msg: e.taken("b", "default", ""), Outcome: Succeeded, Retention: time.Hour},
		{ID: "x", Lane: "default", Msg: e.taken("x", "default", ""), Outcome: Dead},
	}
	start := time.Now()
	if _, err := Finish(ctx, e.rdb, e.k, e.counts, e.pbacklog, items, AnnounceFinal(FinalChannel(""))); err != nil {
		t.Fatal(err)
	}
	ids, _ := woken(a, 2*time.Second, func(ids []string, _ bool) bool { return len(ids) > 0 })
	if !slices.Equal(ids, []string{"b"}) {
		t.Fatalf("after b finished: woken for %v, want [b]", ids)
	}
	t.Logf("woken %v after the finish", time.Since(start))
	if ids, all := woken(other, 100*time.Millisecond, func([]string, bool) bool { return false }); len(ids) > 0 || all {
		t.Fatalf("a watch of c was woken for %v (all %v) by b and x", ids, all)
	}

	// The subscription's connection is killed: go-redis subscribes again,
	// and every watch reads again.
	if err := e.rdb.ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	for _, w := range []*Watch{a, other} {
		if _, all := woken(w, 10*time.Second, readAgain); !all {
			t.Fatal("after a reconnect no watch was woken to read again; want every watch")
		}
	}
	a.Stop()
	a.Stop()
	other.Stop()
	if n := f.Waiters(); n != 0 || len(f.by) != 0 {
		t.Fatalf("after Stop: %d waiters, %d ids; want none", n, len(f.by))
	}
	f.Close()
	select {
	case <-f.Closed():
	default:
		t.Fatal("Closed is open after Close")
	}
	f.Close()
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after Close, %d before NewFinals", n, before)
	}
}

// TestFinalsNeverStarted: a hub closed before any watch never subscribes,
// and a watch made after Close sees Closed at once.
func TestFinalsNeverStarted(t *testing.T) {
	f := NewFinals(srv.Client(t), "")
	f.Close()
	w := f.Watch("a")
	defer w.Stop()
	select {
	case <-f.Closed():
	default:
		t.Fatal("Closed is open after Close")
	}
	f.Close()
}
