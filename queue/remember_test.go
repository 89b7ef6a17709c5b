package queue

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/leaky"
)

// rememberRig enqueues, takes and finishes jobs of upstream stripe, which
// keeps one succeeded and one dead job.
type rememberRig struct {
	t     *testing.T
	rdb   redis.UniversalClient
	q     *Queue
	taker *jobstore.Taker
	space jobstore.Space
}

func newRememberRig(t *testing.T, window time.Duration) *rememberRig {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	ups := upstreams(1000)
	ups[0].ResultMaxCount, ups[0].DeadMaxCount, ups[0].IdempotencyWindow = 1, 1, window
	q := newQueue(t, rdb, ups)
	u, _ := q.Upstream("stripe")
	bucket, err := leaky.New(rdb, leaky.Config{}).Bucket(jobstore.QueueName("stripe"), leaky.BucketConfig{Limits: []leaky.Limit{leaky.PerSecond(1000)}})
	if err != nil {
		t.Fatal(err)
	}
	space := jobstore.For("", "stripe")
	taker, err := jobstore.NewTaker(rdb, space, jobstore.TakerConfig{Upstream: u, Bucket: bucket,
		Lookahead: time.Second, Lease: 30 * time.Second, ConcurrencyLease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return &rememberRig{t: t, rdb: rdb, q: q, taker: taker, space: space}
}

// run enqueues job, takes it and finishes it as outcome, then returns its
// ID; the job is then the one kept, its predecessor dropped.
func (r *rememberRig) run(job *Job, outcome jobstore.Outcome) string {
	r.t.Helper()
	ctx := context.Background()
	info, created, err := r.q.Enqueue(ctx, job)
	if err != nil || !created {
		r.t.Fatalf("enqueue: %+v, %v, %v", info, created, err)
	}
	tk, err := r.taker.Take(ctx, 1)
	if err != nil || len(tk.Jobs) != 1 || tk.Jobs[0].ID != info.ID {
		r.t.Fatalf("took %+v, %v; want %s", tk.Jobs, err, info.ID)
	}
	r.finish(info.ID, tk.Jobs[0].Msg, outcome)
	return info.ID
}

func (r *rememberRig) finish(id string, raw []byte, outcome jobstore.Outcome) {
	r.t.Helper()
	msg, err := jobstore.Unmarshal(raw)
	if err != nil {
		r.t.Fatal(err)
	}
	u, _ := r.q.Upstream("stripe")
	f := jobstore.Finished{ID: id, Lane: "default", Msg: msg, Outcome: outcome,
		Retention: time.Hour, Result: []byte(`{"v":2,"s":200,"b":"ok"}`), ErrMsg: "upstream said 400"}
	errs, err := jobstore.Finish(context.Background(), r.rdb, jobstore.AsynqKeys(jobstore.QueueName("stripe")), r.space.CountsKey(),
		r.space.BacklogKey(), []jobstore.Finished{f}, jobstore.KeepAtMost(finishBounds("", u)))
	if err != nil || errs[0] != nil {
		r.t.Fatalf("finish: %v, %v", errs, err)
	}
	time.Sleep(2 * time.Millisecond) // so "oldest" is well defined
}

// nothingNew fails unless no job of id is stored and nothing waits.
func (r *rememberRig) nothingNew(id string) {
	r.t.Helper()
	ctx := context.Background()
	if n := r.rdb.Exists(ctx, r.space.TaskKey(id)).Val(); n != 0 {
		r.t.Errorf("%s: its task is stored again", id)
	}
	c, err := r.q.Counts(ctx, "stripe")
	if err != nil {
		r.t.Fatal(err)
	}
	if b := c["default"].Backlog(); b != 0 {
		r.t.Errorf("backlog: got %d, want 0 (nothing to send)", b)
	}
	tk, err := r.taker.Take(ctx, 1)
	if err != nil || len(tk.Jobs) != 0 {
		r.t.Errorf("take: got %d jobs, %v, want none", len(tk.Jobs), err)
	}
}

// TestRepeatAfterTheJobWasDropped is issue 12's "idempotency outlives
// results": a job past result_max_count or dead_max_count is dropped, and
// a repeat of its idempotency key answers its id and final state,
// storing and sending nothing; reading it says it is no longer kept.
func TestRepeatAfterTheJobWasDropped(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		outcome jobstore.Outcome
		cancel  bool
		want    State
	}{
		{"succeeded", jobstore.Succeeded, false, StateSucceeded},
		{"dead", jobstore.Dead, false, StateDead},
		{"cancelled", jobstore.Dead, true, StateCancelled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRememberRig(t, time.Hour)
			job := func() *Job {
				return &Job{Tenant: "billing", Upstream: "stripe", Path: "/x", IdempotencyKey: "order-17"}
			}
			var id string
			if tc.cancel {
				info, _, err := r.q.Enqueue(ctx, job())
				if err != nil {
					t.Fatal(err)
				}
				id = info.ID
				if _, err := r.q.Cancel(ctx, id, "billing"); err != nil {
					t.Fatal(err)
				}
				time.Sleep(2 * time.Millisecond)
			} else {
				id = r.run(job(), tc.outcome)
			}
			// Another job of the same outcome pushes it out.
			r.run(&Job{Tenant: "billing", Upstream: "stripe", Path: "/y"}, tc.outcome)
			if _, err := r.q.Get(ctx, id, "billing"); !errors.Is(err, ErrNoLongerKept) {
				t.Fatalf("get: got %v, want no longer kept", err)
			}
			info, created, err := r.q.Enqueue(ctx, job())
			if err != nil || created {
				t.Fatalf("repeat: got created %v, %v, want an existing job", created, err)
			}
			if info.ID != id || info.State != tc.want || info.IdempotencyKey != "order-17" {
				t.Errorf("repeat: got %s %s key %q, want %s %s key order-17", info.ID, info.State, info.IdempotencyKey, id, tc.want)
			}
			r.nothingNew(id)
			// No tombstone beside the record.
			if gone, _ := finishBounds("", r.q.ups["stripe"]).Gone.WasDeleted(ctx, r.rdb, id); gone {
				t.Error("the dropped job has a tombstone beside its record")
			}
			// The same key in another lane is another job.
			other := job()
			other.Lane = "bulk"
			if _, created, err := r.q.Enqueue(ctx, other); err != nil || !created {
				t.Errorf("the key in another lane: got created %v, %v, want a new job", created, err)
			}
		})
	}
}

// TestRandomIDsLeaveNoRecord: jobs without an idempotency key cannot be
// repeated, so dropping them records nothing (a tombstone only).
func TestRandomIDsLeaveNoRecord(t *testing.T) {
	ctx := context.Background()
	r := newRememberRig(t, time.Hour)
	var ids []string
	for range 5 {
		ids = append(ids, r.run(&Job{Upstream: "stripe", Path: "/x"}, jobstore.Succeeded))
	}
	if n := len(r.rdb.Keys(ctx, r.space.RememberKey()+"*").Val()); n != 0 {
		t.Errorf("record keys: got %d, want none", n)
	}
	// (Tombstones are bounded by the counts kept: two here.)
	if _, err := r.q.Get(ctx, ids[3], ""); !errors.Is(err, ErrNoLongerKept) {
		t.Errorf("get: got %v, want no longer kept (its tombstone)", err)
	}
}

// TestRepeatAfterTheWindow: once idempotency_window is over, the key is
// forgotten, and a repeat is a new job.
func TestRepeatAfterTheWindow(t *testing.T) {
	ctx := context.Background()
	r := newRememberRig(t, time.Second)
	job := func() *Job { return &Job{Tenant: "billing", Upstream: "stripe", Path: "/x", IdempotencyKey: "k"} }
	r.run(job(), jobstore.Succeeded)
	r.run(&Job{Upstream: "stripe", Path: "/y"}, jobstore.Succeeded)
	if _, created, err := r.q.Enqueue(ctx, job()); err != nil || created {
		t.Fatalf("within the window: got created %v, %v, want the record", created, err)
	}
	time.Sleep(2100 * time.Millisecond) // window + its one-second span
	if _, created, err := r.q.Enqueue(ctx, job()); err != nil || !created {
		t.Fatalf("after the window: got created %v, %v, want a new job", created, err)
	}
}

// TestConcurrentRepeatsAfterTheDrop: repeats at once on their own
// connections (and Queues), while the jobs finish and are dropped, find
// either the job or its record; none makes the job again.
func TestConcurrentRepeatsAfterTheDrop(t *testing.T) {
	ctx := context.Background()
	r := newRememberRig(t, time.Hour)
	const keys, repeaters = 20, 6
	ids := map[string]string{}
	job := func(k int) *Job {
		return &Job{Tenant: "billing", Upstream: "stripe", Path: "/x", IdempotencyKey: fmt.Sprintf("order-%d", k)}
	}
	for k := range keys {
		info, _, err := r.q.Enqueue(ctx, job(k))
		if err != nil {
			t.Fatal(err)
		}
		ids[info.IdempotencyKey] = info.ID
	}
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	stop := make(chan struct{})
	repeats := make([]int, repeaters)
	for w := range repeaters {
		rdb := srv.Client(t) // a connection of its own
		q := newQueue(t, rdb, r.q.Upstreams())
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k = (k + 1) % keys {
				select {
				case <-stop:
					return
				default:
				}
				j := job(k)
				info, created, err := q.Enqueue(ctx, j)
				repeats[w]++
				switch {
				case err != nil:
					errs <- err
					return
				case created || info.ID != ids[j.IdempotencyKey]:
					errs <- fmt.Errorf("%s: got %s created %v, want %s, not created", j.IdempotencyKey, info.ID, created, ids[j.IdempotencyKey])
					return
				}
			}
		}()
	}
	// Meanwhile each job is taken and finished, dropping the one before.
	for range keys {
		tk, err := r.taker.Take(ctx, 1)
		if err != nil || len(tk.Jobs) != 1 {
			t.Fatalf("took %+v, %v", tk.Jobs, err)
		}
		r.finish(tk.Jobs[0].ID, tk.Jobs[0].Msg, jobstore.Succeeded)
	}
	r.run(&Job{Upstream: "stripe", Path: "/y"}, jobstore.Succeeded)
	time.Sleep(20 * time.Millisecond)
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("repeats per connection: %v", repeats)
	for k := range keys {
		j := job(k)
		info, created, err := r.q.Enqueue(ctx, j)
		if err != nil || created || info.State != StateSucceeded {
			t.Errorf("%s at the end: got %+v, %v, %v, want succeeded", j.IdempotencyKey, info, created, err)
		}
	}
	for _, id := range ids {
		r.nothingNew(id)
	}
}

// TestIdemIDPattern: the Lua pattern the scripts tell idempotency keys'
// IDs by agrees with IsIdempotentID, and both tell them from random IDs.
func TestIdemIDPattern(t *testing.T) {
	if got := strings.Count(IdempotentIDPattern, "%x"); got != tagLen+idemHexLen {
		t.Fatalf("pattern has %d hex digits, want %d", got, tagLen+idemHexLen)
	}
	lua := regexp.MustCompile(strings.NewReplacer("%x", "[0-9a-fA-F]").Replace(IdempotentIDPattern))
	for _, tc := range []struct {
		id   string
		want bool
	}{
		{IdempotentID("billing", "stripe", "default", "order-17"), true},
		{IdempotentID("", "s", "bulk", "k"), true},
		{"stripe.default.i" + strings.Repeat("0a", 15), false}, // no tenant tag: set by hand
		{"stripe.default.order-i" + strings.Repeat("0a", 15), false},
		{NewID("billing", "stripe", "default"), false},
		{"stripe.default.3fa9c1d2-i" + strings.Repeat("a", 29), false},
		{"stripe.default.3fa9c1d2-i" + strings.Repeat("a", 31), false},
		{"stripe.default.3fa9c1d2-j" + strings.Repeat("a", 30), false},
	} {
		if got := IsIdempotentID(tc.id); got != tc.want {
			t.Errorf("IsIdempotentID(%s): got %v, want %v", tc.id, got, tc.want)
		}
		if got := lua.MatchString(tc.id); got != tc.want {
			t.Errorf("pattern on %s: got %v, want %v", tc.id, got, tc.want)
		}
	}
	for range 1000 {
		if id := NewID("t", "u", "l"); IsIdempotentID(id) {
			t.Fatalf("random ID %s taken for an idempotency key's", id)
		}
	}
}
