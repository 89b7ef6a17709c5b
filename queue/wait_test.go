package queue

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/leaky"
)

// waitRig is one upstream with partition limits, taken and finished as a
// worker does.
type waitRig struct {
	t      *testing.T
	q      *Queue
	u      shaper.Upstream
	bucket *leaky.Bucket
	taker  *jobstore.Taker
	space  jobstore.Space
}

func newWaitRig(t *testing.T) *waitRig {
	t.Helper()
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	ups := upstreams(100)
	ups[0].PartitionLimits = []leaky.Limit{{Rate: 1, Per: time.Hour}}
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
	return &waitRig{t: t, q: q, u: u, bucket: bucket, taker: taker, space: space}
}

func (r *waitRig) enqueue(j Job) *Info {
	r.t.Helper()
	j.Upstream = "stripe"
	info, _, err := r.q.Enqueue(context.Background(), &j)
	if err != nil {
		r.t.Fatal(err)
	}
	return info
}

// takeAndEnd takes every job that can go and ends each with end's item
// (nil: leave it active).
func (r *waitRig) takeAndEnd(end func(id string, f *jobstore.Finished) bool) {
	r.t.Helper()
	ctx := context.Background()
	tk, err := r.taker.Take(ctx, 10)
	if err != nil {
		r.t.Fatal(err)
	}
	var items []jobstore.Finished
	for _, j := range tk.Jobs {
		msg, err := jobstore.Unmarshal(j.Msg)
		if err != nil {
			r.t.Fatal(err)
		}
		f := jobstore.Finished{ID: j.ID, Lane: "default", Partition: "p", Msg: msg}
		if end(j.ID, &f) {
			items = append(items, f)
		}
	}
	if _, err := jobstore.Finish(ctx, r.q.rdb, jobstore.AsynqKeys(jobstore.QueueName("stripe")), r.space.CountsKey(), r.space.BacklogKey(), items); err != nil {
		r.t.Fatal(err)
	}
}

// Each view of a waiting job tells the same story: GET's state and
// waiting_for, and the counts status shows.
func TestWaitingFor(t *testing.T) {
	type want struct {
		state      State
		waitingFor string
		until      bool // NextAttemptAt set
	}
	for _, tc := range []struct {
		name string
		// setup enqueues and acts; it returns the job to read.
		setup      func(r *waitRig) string
		want       want
		counts     LaneCounts
		asynqPause bool
	}{
		{
			name:   "queued",
			setup:  func(r *waitRig) string { return r.enqueue(Job{Path: "/a"}).ID },
			want:   want{StateQueued, "", false},
			counts: LaneCounts{Pending: 1},
		},
		{
			name: "operator pause",
			setup: func(r *waitRig) string {
				id := r.enqueue(Job{Path: "/a"}).ID
				if _, err := r.bucket.Block(context.Background(), time.Hour, "paused by ops"); err != nil {
					r.t.Fatal(err)
				}
				return id
			},
			want:   want{StateScheduled, WaitingPause, true},
			counts: LaneCounts{Scheduled: 1, WaitingFor: map[string]int64{WaitingPause: 1}},
		},
		{
			name: "asynq pause",
			setup: func(r *waitRig) string {
				id := r.enqueue(Job{Path: "/a"}).ID
				if err := asynq.NewInspectorFromRedisClient(r.q.rdb).PauseQueue(jobstore.QueueName("stripe")); err != nil {
					r.t.Fatal(err)
				}
				return id
			},
			want:       want{StateScheduled, WaitingPause, false},
			counts:     LaneCounts{Scheduled: 1, WaitingFor: map[string]int64{WaitingPause: 1}},
			asynqPause: true,
		},
		{
			// The job that met the 429 is handed back; the block it placed
			// holds the others untaken.
			name: "pushback, the job that met it",
			setup: func(r *waitRig) string {
				met := r.enqueue(Job{Path: "/met", Partition: "p"}).ID
				r.takeAndEnd(func(id string, f *jobstore.Finished) bool {
					f.Outcome, f.RetryAt, f.WaitsFor = jobstore.Retry, time.Now().Add(time.Minute), WaitingPushback
					f.ErrMsg = "waiting for pushback: upstream blocked until then (429 from upstream)"
					return true
				})
				if _, err := r.bucket.Block(context.Background(), time.Minute, BlockRefused); err != nil {
					r.t.Fatal(err)
				}
				r.enqueue(Job{Path: "/other"})
				return met
			},
			want:   want{StateScheduled, WaitingPushback, true},
			counts: LaneCounts{Scheduled: 2, WaitingFor: map[string]int64{WaitingPushback: 2}},
		},
		{
			name: "pushback, another job",
			setup: func(r *waitRig) string {
				if _, err := r.bucket.Block(context.Background(), time.Minute, BlockQuota); err != nil {
					r.t.Fatal(err)
				}
				return r.enqueue(Job{Path: "/other"}).ID
			},
			want:   want{StateScheduled, WaitingPushback, true},
			counts: LaneCounts{Scheduled: 1, WaitingFor: map[string]int64{WaitingPushback: 1}},
		},
		{
			// Handed back after a 429 that blocked nothing else (one
			// endpoint's limit): it waits for that pushback alone.
			name: "pushback on the job alone",
			setup: func(r *waitRig) string {
				id := r.enqueue(Job{Path: "/met"}).ID
				r.takeAndEnd(func(_ string, f *jobstore.Finished) bool {
					f.Outcome, f.RetryAt, f.WaitsFor = jobstore.Retry, time.Now().Add(time.Minute), WaitingPushback
					f.ErrMsg = "waiting for pushback: job held (429 from upstream (endpoint-rate))"
					return true
				})
				return id
			},
			want:   want{StateScheduled, WaitingPushback, true},
			counts: LaneCounts{Scheduled: 1, WaitingFor: map[string]int64{WaitingPushback: 1}},
		},
		{
			name: "partition parked for its limit",
			setup: func(r *waitRig) string {
				r.enqueue(Job{Path: "/1", Partition: "p"})
				second := r.enqueue(Job{Path: "/2", Partition: "p"}).ID
				r.takeAndEnd(func(_ string, f *jobstore.Finished) bool {
					f.Outcome = jobstore.Succeeded
					return true
				})
				// The take that finds the partition's next slot an hour away.
				r.takeAndEnd(func(id string, _ *jobstore.Finished) bool {
					r.t.Fatalf("took %s from a parked partition", id)
					return false
				})
				return second
			},
			want:   want{StateScheduled, WaitingLimit, true},
			counts: LaneCounts{Scheduled: 1, WaitingFor: map[string]int64{WaitingLimit: 1}},
		},
		{
			name:   "not_before",
			setup:  func(r *waitRig) string { return r.enqueue(Job{Path: "/a", NotBefore: time.Now().Add(time.Hour)}).ID },
			want:   want{StateScheduled, "", true},
			counts: LaneCounts{Scheduled: 1},
		},
		{
			// Handed back for a wait of shaper's own (its store): scheduled,
			// waiting for nothing named. The mark says so, not the words.
			name: "handed back, no cause named",
			setup: func(r *waitRig) string {
				id := r.enqueue(Job{Path: "/a"}).ID
				r.takeAndEnd(func(_ string, f *jobstore.Finished) bool {
					f.Outcome, f.RetryAt, f.ErrMsg = jobstore.Retry, time.Now().Add(time.Minute), "attempt 1 of 3: upstream answered 503"
					return true
				})
				return id
			},
			want: want{StateScheduled, "", true},
			// (The counters know a hand-back, not its cause.)
			counts: LaneCounts{Scheduled: 1, WaitingFor: map[string]int64{WaitingPushback: 1}},
		},
		{
			// A failure is one whatever its message reads like.
			name: "failed attempt, worded as a wait",
			setup: func(r *waitRig) string {
				id := r.enqueue(Job{Path: "/a"}).ID
				r.takeAndEnd(func(_ string, f *jobstore.Finished) bool {
					f.Outcome, f.Failure, f.RetryAt, f.ErrMsg = jobstore.Retry, true, time.Now().Add(time.Minute), "waiting for pushback: x"
					return true
				})
				return id
			},
			want:   want{StateRetrying, "", true},
			counts: LaneCounts{Retry: 1},
		},
		{
			// A failed attempt waiting to retry is retrying, paused or not.
			name: "failed attempt, during a pause",
			setup: func(r *waitRig) string {
				id := r.enqueue(Job{Path: "/a"}).ID
				r.takeAndEnd(func(_ string, f *jobstore.Finished) bool {
					f.Outcome, f.Failure, f.RetryAt, f.ErrMsg = jobstore.Retry, true, time.Now().Add(time.Minute), "attempt 1 of 3: upstream answered 503"
					return true
				})
				if _, err := r.bucket.Block(context.Background(), time.Hour, "paused by ops"); err != nil {
					r.t.Fatal(err)
				}
				return id
			},
			want:   want{StateRetrying, "", true},
			counts: LaneCounts{Retry: 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			r := newWaitRig(t)
			id := tc.setup(r)
			info, err := r.q.Get(ctx, id, "")
			if err != nil {
				t.Fatal(err)
			}
			got := want{info.State, info.WaitingFor, !info.NextAttemptAt.IsZero()}
			if got != tc.want {
				t.Errorf("GET: got %+v (next attempt %v), want %+v", got, info.NextAttemptAt, tc.want)
			}
			if info.State == StateScheduled && info.LastError != "" {
				t.Errorf("GET: last error %q on a job that waits, want none", info.LastError)
			}
			held, err := r.q.ReadHeld(ctx, "stripe")
			if err != nil {
				t.Fatal(err)
			}
			if c := held.Lanes["default"]; c.Pending != tc.counts.Pending || c.Scheduled != tc.counts.Scheduled ||
				c.Retry != tc.counts.Retry || !maps.Equal(c.WaitingFor, tc.counts.WaitingFor) {
				t.Errorf("counts: got %+v, want %+v", c, tc.counts)
			}
			if held.AsynqPaused != tc.asynqPause {
				t.Errorf("asynq paused: got %v, want %v", held.AsynqPaused, tc.asynqPause)
			}
			// The cheap count that bounds max_pending agrees on the total.
			n, err := r.q.pendingCount(ctx, "stripe")
			if c := held.Lanes["default"]; err != nil || n != c.Backlog() {
				t.Errorf("pending count %d, %v; want the counts' backlog %d", n, err, c.Backlog())
			}
		})
	}
}

// The enqueue's answer already says a job is held back, as GET would.
func TestEnqueueAnswerSaysHeld(t *testing.T) {
	for _, tc := range []struct {
		name       string
		before     func(r *waitRig)
		job        Job
		state      State
		waitingFor string
	}{
		{"free", func(*waitRig) {}, Job{Path: "/a"}, StateQueued, ""},
		{"paused", func(r *waitRig) {
			if _, err := r.bucket.Block(context.Background(), time.Hour, "paused by ops"); err != nil {
				r.t.Fatal(err)
			}
		}, Job{Path: "/a"}, StateScheduled, WaitingPause},
		{"pushback", func(r *waitRig) {
			if _, err := r.bucket.Block(context.Background(), time.Minute, BlockRefused); err != nil {
				r.t.Fatal(err)
			}
		}, Job{Path: "/a"}, StateScheduled, WaitingPushback},
		{"paused through asynq", func(r *waitRig) {
			if err := asynq.NewInspectorFromRedisClient(r.q.rdb).PauseQueue(jobstore.QueueName("stripe")); err != nil {
				r.t.Fatal(err)
			}
		}, Job{Path: "/a"}, StateScheduled, WaitingPause},
		{"partition parked", func(r *waitRig) {
			r.enqueue(Job{Path: "/1", Partition: "p"})
			r.enqueue(Job{Path: "/2", Partition: "p"})
			r.takeAndEnd(func(_ string, f *jobstore.Finished) bool {
				f.Outcome = jobstore.Succeeded
				return true
			})
		}, Job{Path: "/3", Partition: "p"}, StateScheduled, WaitingLimit},
		{"another partition free", func(r *waitRig) {
			r.enqueue(Job{Path: "/1", Partition: "p"})
			r.enqueue(Job{Path: "/2", Partition: "p"})
			r.takeAndEnd(func(_ string, f *jobstore.Finished) bool {
				f.Outcome = jobstore.Succeeded
				return true
			})
		}, Job{Path: "/3", Partition: "q"}, StateQueued, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newWaitRig(t)
			tc.before(r)
			info := r.enqueue(tc.job)
			if info.State != tc.state || info.WaitingFor != tc.waitingFor {
				t.Fatalf("enqueue answered %s waiting for %q, want %s waiting for %q", info.State, info.WaitingFor, tc.state, tc.waitingFor)
			}
			got, err := r.q.Get(context.Background(), info.ID, "")
			if err != nil || got.State != info.State || got.WaitingFor != info.WaitingFor {
				t.Fatalf("GET: %+v, %v; want what the enqueue answered", got, err)
			}
		})
	}
}
