package jobstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/leaky"
)

// rig is one upstream laid out as the dispatcher lays it out: its bucket
// is named QueueName(upstream), so the bucket's keys and the scheduler's
// share the hash tag {shaper.NAME} (newFixture's do not, which a single
// Redis forgives and a cluster would not). It remembers every job it
// enqueued so that check can account for all of them.
type rig struct {
	t      *testing.T
	rdb    redis.UniversalClient
	u      shaper.Upstream
	space  jobstore.Space
	store  jobstore.Keys
	bucket *leaky.Bucket
	taker  *jobstore.Taker
	ids    []string
	lane   map[string]string // id -> lane
	part   map[string]string // id -> partition
	cb     map[string]bool   // id -> has a callback
}

var rigSeq atomic.Int64

// newRig builds an upstream named after name and a counter (names must not
// collide between tests sharing a server), with defaults filled in.
func newRig(t *testing.T, rdb redis.UniversalClient, u shaper.Upstream, lookahead time.Duration) *rig {
	t.Helper()
	u.Name = fmt.Sprintf("%s-%d-%d", u.Name, time.Now().UnixNano()%1e6, rigSeq.Add(1))
	return newRigNamed(t, rdb, u, lookahead)
}

// newRigNamed is newRig keeping u.Name as it is.
func newRigNamed(t *testing.T, rdb redis.UniversalClient, u shaper.Upstream, lookahead time.Duration) *rig {
	t.Helper()
	u = u.WithDefaults()
	b, err := leaky.New(rdb, leaky.Config{}).Bucket(jobstore.QueueName(u.Name), leaky.BucketConfig{
		Limits: u.Limits, Guard: u.Guard, Concurrency: u.Concurrency})
	if err != nil {
		t.Fatal(err)
	}
	s := jobstore.For("", u.Name)
	tk, err := jobstore.NewTaker(rdb, s, jobstore.TakerConfig{Upstream: u, Bucket: b, Lookahead: lookahead,
		Lease: 30 * time.Second, ConcurrencyLease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return &rig{t: t, rdb: rdb, u: u, space: s, store: jobstore.AsynqKeys(s.Queue), bucket: b, taker: tk,
		lane: map[string]string{}, part: map[string]string{}, cb: map[string]bool{}}
}

// job is a job to enqueue.
type job struct {
	id, lane, tenant, partition string
	costs                       map[string]int64
	at                          time.Time
}

func (r *rig) entry(j job) jobstore.Entry {
	if j.lane == "" {
		j.lane = shaper.DefaultLane
	}
	msg := jobstore.Message{Type: "http", ID: j.id, Queue: r.space.Queue}
	return jobstore.Entry{ID: j.id, Lane: j.lane, FairKey: jobstore.FairKey(r.u, j.tenant, j.partition),
		Partition: j.partition, Costs: j.costs, Msg: msg.Marshal(), ProcessAt: j.at}
}

func (r *rig) add(jobs ...job) {
	r.t.Helper()
	for _, j := range jobs {
		e := r.entry(j)
		ok, err := r.space.Enqueue(context.Background(), r.rdb, e)
		if err != nil || !ok {
			r.t.Fatalf("enqueue %s: created %v, err %v", j.id, ok, err)
		}
		r.ids = append(r.ids, j.id)
		r.lane[j.id], r.part[j.id] = e.Lane, j.partition
	}
}

func (r *rig) take(n int) jobstore.Take {
	r.t.Helper()
	tk, err := r.taker.Take(context.Background(), n)
	if err != nil {
		r.t.Fatal(err)
	}
	return tk
}

// takeIDs takes up to n jobs and returns their ids.
func (r *rig) takeIDs(n int) []string { r.t.Helper(); return ids(r.take(n)) }

// check fails the test if the scheduler's bookkeeping disagrees with its
// jobs (see Space.Check).
func (r *rig) check(step string) {
	r.t.Helper()
	if err := r.space.Check(context.Background(), r.rdb, r.ids); err != nil {
		r.t.Fatalf("after %s:\n%v", step, err)
	}
}

// finish ends taken jobs with outcome (retryAt for Retry, which defers
// them: see fail).
func (r *rig) finish(o jobstore.Outcome, retryAt time.Time, ids ...string) {
	r.t.Helper()
	r.end(o, false, retryAt, ids...)
}

// fail sends taken jobs to retry at retryAt after a failed attempt.
func (r *rig) fail(retryAt time.Time, ids ...string) {
	r.t.Helper()
	r.end(jobstore.Retry, true, retryAt, ids...)
}

func (r *rig) end(o jobstore.Outcome, failure bool, retryAt time.Time, ids ...string) {
	r.t.Helper()
	var items []jobstore.Finished
	for _, id := range ids {
		items = append(items, jobstore.Finished{ID: id, Lane: r.lane[id], Partition: r.part[id],
			Msg: &jobstore.Message{Type: "http", ID: id, Queue: r.space.Queue}, Outcome: o, RetryAt: retryAt, Failure: failure})
	}
	errs, err := jobstore.Finish(context.Background(), r.rdb, r.store, r.space.CountsKey(), r.space.BacklogKey(), items)
	if err != nil {
		r.t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			r.t.Fatalf("finish %s: %v", ids[i], e)
		}
	}
}

// exists reports whether key exists.
func (r *rig) exists(key string) bool {
	r.t.Helper()
	n, err := r.rdb.Exists(context.Background(), key).Result()
	if err != nil {
		r.t.Fatal(err)
	}
	return n == 1
}

func (r *rig) counts() jobstore.Counts {
	r.t.Helper()
	c, err := r.space.ReadCounts(context.Background(), r.rdb)
	if err != nil {
		r.t.Fatal(err)
	}
	return c
}
