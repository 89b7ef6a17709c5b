package server

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
)

// commandLog records every command a client sends, pipelines included.
type commandLog struct {
	mu   sync.Mutex
	cmds []string
}

func (l *commandLog) DialHook(next redis.DialHook) redis.DialHook { return next }

func (l *commandLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		l.add(cmd)
		return next(ctx, cmd)
	}
}

func (l *commandLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			l.add(c)
		}
		return next(ctx, cmds)
	}
}

func (l *commandLog) add(c redis.Cmder) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cmds = append(l.cmds, fmt.Sprint(c.Args()...))
}

// touching are the logged commands that name key.
func (l *commandLog) touching(key string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, c := range l.cmds {
		if strings.Contains(c, key) {
			out = append(out, c)
		}
	}
	return out
}

// TestProxyMarksOnlyWaitingCalls: a call that has room books its slot and
// goes without being shown as waiting (no write to the waiting set); a
// call that waits for its slot is shown as waiting while it waits, and
// not after it is answered. The guard is wide: on a loaded machine the
// first call's reply (its script loaded first) can come back later than
// the default guard allows, and a late slot is rightly spent and booked
// again, a period on, which is a wait.
func TestProxyMarksOnlyWaitingCalls(t *testing.T) {
	rdb := srv.Client(t)
	rdb.FlushAll(context.Background())
	log := &commandLog{}
	rdb.AddHook(log)
	const period = time.Second
	f := newProxyFixtureOn(t, rdb, &recorder{}, func(u *shaper.Upstream) {
		slow(period)(u)
		u.Guard = 100 * time.Millisecond // the most it may be: a tenth of the period
	})
	key := f.s.proxies["api"].space.WaitingKey()
	if resp, body := f.call("GET", "/proxy/api/v1/first", ""); resp.StatusCode != 200 {
		t.Fatalf("first call: got %d %s, want 200", resp.StatusCode, body)
	}
	if got := log.touching(key); len(got) != 0 {
		t.Errorf("a call with room wrote the waiting set: %q", got)
	}

	// The next slot is a period away: this call waits for it.
	done := make(chan int, 1)
	go func() {
		resp, _ := f.call("GET", "/proxy/api/v1/second", "", "Shaper-Max-Wait", "5")
		done <- resp.StatusCode
	}()
	st := f.s.proxies["api"].space
	seen := false
	for !seen {
		select {
		case code := <-done:
			t.Fatalf("the second call was answered %d before it was seen waiting", code)
		case <-time.After(5 * time.Millisecond):
		}
		n, _ := st.CountWaiting(context.Background(), f.rdb, time.Now())
		seen = n == 1
	}
	if code := <-done; code != 200 {
		t.Fatalf("second call: got %d, want 200", code)
	}
	// The mark goes as the handler ends, just after the answer.
	for end := time.Now().Add(time.Second); ; time.Sleep(5 * time.Millisecond) {
		n, _ := st.CountWaiting(context.Background(), f.rdb, time.Now())
		if n == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("got %d calls waiting a second after the call was answered, want 0", n)
		}
	}
	var marks, unmarks int
	for _, c := range log.touching(key) {
		switch {
		case strings.HasPrefix(c, "evalsha"):
			marks++
		case strings.HasPrefix(c, "zrem"):
			unmarks++
		}
	}
	if marks != 1 || unmarks != 1 {
		t.Errorf("the waiting call was marked %d times and unmarked %d, want once each", marks, unmarks)
	}
}
