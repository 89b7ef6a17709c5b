package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/leaky"
)

// finishAll takes every ready job of an upstream as a worker does and
// ends each with the outcome end picks (nil: leave it active). It returns
// the IDs it took.
func finishAll(t *testing.T, q *Queue, rdb redis.UniversalClient, upstream string, end func(id string) *jobstore.Finished) []string {
	t.Helper()
	ctx := context.Background()
	u, _ := q.Upstream(upstream)
	bucket, err := leaky.New(rdb, leaky.Config{}).Bucket(jobstore.QueueName(upstream), leaky.BucketConfig{Limits: []leaky.Limit{leaky.PerSecond(1000000)}})
	if err != nil {
		t.Fatal(err)
	}
	space := jobstore.For("", upstream)
	taker, err := jobstore.NewTaker(rdb, space, jobstore.TakerConfig{Upstream: u, Bucket: bucket,
		Lookahead: time.Second, Lease: 30 * time.Second, ConcurrencyLease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for {
		tk, err := taker.Take(ctx, 500)
		if err != nil {
			t.Fatal(err)
		}
		if len(tk.Jobs) == 0 {
			return ids
		}
		var items []jobstore.Finished
		for _, j := range tk.Jobs {
			ids = append(ids, j.ID)
			f := end(j.ID)
			if f == nil {
				continue
			}
			msg, err := jobstore.Unmarshal(j.Msg)
			if err != nil {
				t.Fatal(err)
			}
			job, err := DecodeJob(j.ID, msg.Payload)
			if err != nil {
				t.Fatal(err)
			}
			f.ID, f.Msg, f.Partition = j.ID, msg, job.Partition
			if f.Outcome == jobstore.Succeeded {
				// As the dispatcher keeps it.
				f.Msg = SucceededMessage(msg)
			}
			if f.Lane == "" {
				_, f.Lane, _ = ParseID(j.ID)
			}
			items = append(items, *f)
		}
		if _, err := jobstore.Finish(ctx, rdb, jobstore.AsynqKeys(jobstore.QueueName(upstream)), space.CountsKey(), space.BacklogKey(), items); err != nil {
			t.Fatal(err)
		}
	}
}

func die(string) *jobstore.Finished {
	return &jobstore.Finished{Outcome: jobstore.Dead, ErrMsg: "upstream said 400"}
}

// listAll follows a listing's cursors to the end, calling between (if
// set) after each page; it fails on a page that holds more than the limit.
func listAll(t *testing.T, q *Queue, o ListOptions, between func()) []*Info {
	t.Helper()
	var all []*Info
	for pages := 0; ; pages++ {
		if pages > 1000 {
			t.Fatal("more than 1000 pages: the cursor does not advance")
		}
		p, err := q.List(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		if limit := cmp.Or(o.Limit, DefaultListLimit); len(p.Jobs) > limit {
			t.Fatalf("page of %d jobs, want at most %d", len(p.Jobs), limit)
		}
		all = append(all, p.Jobs...)
		if p.NextCursor == "" {
			return all
		}
		o.Cursor = p.NextCursor
		if between != nil {
			between()
		}
	}
}

func ids(infos []*Info) []string {
	out := make([]string, len(infos))
	for i, in := range infos {
		out[i] = in.ID
	}
	return out
}

// TestListPagesEachJobOnce: a tenant's queued jobs, spread over lanes and
// partitions (so over many flows), come back newest first, each exactly
// once, while more jobs are enqueued between pages; another tenant's never
// do. It holds whatever the upstream's jobs are fair by, since the flows'
// names differ with it.
func TestListPagesEachJobOnce(t *testing.T) {
	for _, by := range []string{shaper.FairByTenant, shaper.FairByPartition, shaper.FairByNone} {
		t.Run(by, func(t *testing.T) {
			ctx := context.Background()
			rdb := srv.Client(t)
			rdb.FlushAll(ctx)
			ups := upstreams(0)
			ups[0].Fairness.By = by
			q := newQueue(t, rdb, ups)
			var want []string
			n := 0
			enqueue := func(tenant string) string {
				n++
				lane := []string{"default", "bulk"}[(n/2)%2]
				info, _, err := q.Enqueue(ctx, &Job{Tenant: tenant, Upstream: "stripe", Lane: lane, Partition: fmt.Sprintf("p%d", n%7)})
				if err != nil {
					t.Fatal(err)
				}
				return info.ID
			}
			for range 60 {
				want = append(want, enqueue("a"))
				enqueue("b")
			}
			slices.Reverse(want)
			got := listAll(t, q, ListOptions{Upstream: "stripe", Tenant: "a", Limit: 7}, func() {
				enqueue("a")
				enqueue("b")
			})
			if !slices.Equal(ids(got), want) {
				t.Fatalf("got %d jobs %v,\nwant the %d first ones newest first %v", len(got), ids(got), len(want), want)
			}
			for _, info := range got {
				if info.Tenant != "a" || info.State != StateQueued {
					t.Fatalf("listed %+v, want only tenant a's queued jobs", info)
				}
			}
			// The filters: one lane, one partition, both.
			for _, o := range []ListOptions{{Lane: "bulk"}, {Partition: "p3"}, {Lane: "bulk", Partition: "p3"}} {
				o.Upstream, o.Tenant, o.Limit = "stripe", "b", 5
				got := listAll(t, q, o, nil)
				if len(got) == 0 {
					t.Fatalf("%+v: listed nothing", o)
				}
				for _, info := range got {
					if info.Tenant != "b" || o.Lane != "" && info.Lane != o.Lane || o.Partition != "" && info.Partition != o.Partition {
						t.Fatalf("%+v: listed %s (lane %s, partition %s)", o, info.ID, info.Lane, info.Partition)
					}
				}
			}
		})
	}
}

// TestListStates: each state lists its jobs and only them; every state
// together lists every job once.
func TestListStates(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	q := newQueue(t, rdb, upstreams(0))
	byState := map[State][]string{}
	add := func(s State, id string) { byState[s] = append(byState[s], id) }
	var toKill, toSucceed []string
	for i := range 6 {
		info, _, err := q.Enqueue(ctx, &Job{Tenant: "t", Upstream: "stripe", Path: fmt.Sprint("/", i)})
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			toKill = append(toKill, info.ID)
		} else {
			toSucceed = append(toSucceed, info.ID)
		}
	}
	finishAll(t, q, rdb, "stripe", func(id string) *jobstore.Finished {
		if slices.Contains(toKill, id) {
			add(StateDead, id)
			return die(id)
		}
		add(StateSucceeded, id)
		return &jobstore.Finished{Outcome: jobstore.Succeeded, Retention: time.Hour}
	})
	for i := range 3 {
		info, _, err := q.Enqueue(ctx, &Job{Tenant: "t", Upstream: "stripe", NotBefore: time.Now().Add(time.Duration(i+1) * time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		add(StateScheduled, info.ID)
	}
	c, _, _ := q.Enqueue(ctx, &Job{Tenant: "t", Upstream: "stripe", NotBefore: time.Now().Add(time.Hour)})
	if _, err := q.Cancel(ctx, c.ID, "t"); err != nil {
		t.Fatal(err)
	}
	add(StateCancelled, c.ID)
	for range 2 {
		info, _, _ := q.Enqueue(ctx, &Job{Tenant: "t", Upstream: "stripe"})
		add(StateQueued, info.ID)
	}
	var every []string
	for _, s := range []State{StateQueued, StateScheduled, StateRetrying, StateActive, StateSucceeded, StateDead, StateCancelled} {
		got := ids(listAll(t, q, ListOptions{Upstream: "stripe", Tenant: "t", State: s, Limit: 2}, nil))
		want := slices.Clone(byState[s])
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("state %s: got %v, want %v", s, got, want)
		}
		every = append(every, want...)
	}
	got := ids(listAll(t, q, ListOptions{Upstream: "stripe", Tenant: "t", Limit: 3}, nil))
	slices.Sort(got)
	slices.Sort(every)
	if !slices.Equal(got, every) {
		t.Errorf("every state: got %v, want %v", got, every)
	}
	// Scheduled jobs come latest due first.
	sched := listAll(t, q, ListOptions{Upstream: "stripe", Tenant: "t", State: StateScheduled}, nil)
	for i := 1; i < len(sched); i++ {
		if sched[i].NextAttemptAt.After(sched[i-1].NextAttemptAt) {
			t.Errorf("scheduled jobs out of order: %v before %v", sched[i-1].NextAttemptAt, sched[i].NextAttemptAt)
		}
	}
}

// TestListBoundsWork: a page examines at most ListScanFactor × limit
// entries, so a tenant with one dead job behind many of another tenant's
// gets short pages with cursors, and then its job, once.
func TestListBoundsWork(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	q := newQueue(t, rdb, upstreams(0))
	mine, _, _ := q.Enqueue(ctx, &Job{Tenant: "a", Upstream: "stripe"})
	finishAll(t, q, rdb, "stripe", die)
	// Later deaths score higher: b's 100 jobs come first, newest first.
	time.Sleep(5 * time.Millisecond)
	for range 100 {
		q.Enqueue(ctx, &Job{Tenant: "b", Upstream: "stripe"})
	}
	finishAll(t, q, rdb, "stripe", die)
	o := ListOptions{Upstream: "stripe", Tenant: "a", State: StateDead, Limit: 5}
	p, err := q.List(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Jobs) != 0 || p.NextCursor == "" {
		t.Fatalf("first page: got %d jobs and cursor %q, want none and a cursor (20 of b's 100 jobs examined)", len(p.Jobs), p.NextCursor)
	}
	got := listAll(t, q, o, nil)
	if len(got) != 1 || got[0].ID != mine.ID {
		t.Fatalf("got %v, want only %s", ids(got), mine.ID)
	}
}

// TestListRefusesBadOptions: each bad option is refused with its sentinel.
func TestListRefusesBadOptions(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	q := newQueue(t, rdb, upstreams(0))
	for range 3 {
		q.Enqueue(ctx, &Job{Tenant: "t", Upstream: "stripe"})
	}
	p, err := q.List(ctx, ListOptions{Upstream: "stripe", Tenant: "t", Limit: 1})
	if err != nil || p.NextCursor == "" {
		t.Fatalf("got %+v, %v; want a page with a cursor", p, err)
	}
	for _, tc := range []struct {
		o    ListOptions
		want error
	}{
		{ListOptions{Upstream: "twilio"}, ErrUnknownUpstream},
		{ListOptions{Upstream: "stripe", State: "sleeping"}, shaper.ErrInvalid},
		{ListOptions{Upstream: "stripe", Lane: "vip"}, ErrUnknownLane},
		{ListOptions{Upstream: "stripe", Partition: "a\nb"}, shaper.ErrInvalid},
		{ListOptions{Upstream: "stripe", Limit: MaxListLimit + 1}, shaper.ErrInvalid},
		{ListOptions{Upstream: "stripe", Limit: -1}, shaper.ErrInvalid},
		{ListOptions{Upstream: "stripe", Cursor: "!!"}, ErrBadCursor},
		{ListOptions{Upstream: "stripe", Tenant: "t", State: StateDead, Cursor: p.NextCursor}, ErrBadCursor},
		{ListOptions{Upstream: "stripe", Tenant: "u", Cursor: p.NextCursor}, ErrBadCursor},
	} {
		if _, err := q.List(ctx, tc.o); !errors.Is(err, tc.want) {
			t.Errorf("%+v: got %v, want %v", tc.o, err, tc.want)
		}
	}
}

// TestListRefusesCraftedCursors: a cursor whose position cannot be one of
// its index's is the client's bad cursor, never a Redis error.
func TestListRefusesCraftedCursors(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	q := newQueue(t, rdb, upstreams(0))
	o := ListOptions{Upstream: "stripe", Tenant: "t"}
	steps, _ := indexesFor("")
	at := func(idx index) int { return slices.Index(steps, idx) }
	for _, tc := range []struct {
		idx   index
		score string
		ok    bool
	}{
		{idxActive, "3", true},
		{idxActive, "0.5", false},
		{idxActive, "-1", false},
		{idxActive, "1e300", false},
		{idxActive, "NaN", false},
		{idxQueued, "12", true},
		{idxQueued, "inf", false},
		{idxScheduled, "1764500000.5", true},
		{idxScheduled, "NaN", false},
		{idxArchived, "-Inf", false},
		{idxScheduled, "0x1_0p0", false},
		{idxScheduled, "1_000", false},
		{idxScheduled, "1.5e9", true},
	} {
		o.Cursor = cursor{Step: at(tc.idx), Query: queryDigest(o), Score: tc.score, Member: "x"}.encode()
		_, err := q.List(ctx, o)
		if tc.ok && err != nil || !tc.ok && !errors.Is(err, ErrBadCursor) {
			t.Errorf("index %d at %q: got %v, want ok %v (else ErrBadCursor)", tc.idx, tc.score, err, tc.ok)
		}
	}
}

// TestListBoundsFlowReads: listing the queued jobs of an upstream with
// many flows (a partition each) reads each flow at most about once per
// page, however few of its jobs are the caller's.
func TestListBoundsFlowReads(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	ups := upstreams(0)
	ups[0].Fairness.By = shaper.FairByPartition
	q := newQueue(t, rdb, ups)
	const flows = 300
	for i := range flows {
		if _, _, err := q.Enqueue(ctx, &Job{Tenant: "b", Upstream: "stripe", Partition: fmt.Sprintf("p%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	calls := func() int64 {
		info, err := rdb.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			if rest, ok := strings.CutPrefix(line, "cmdstat_zrevrangebyscore:calls="); ok {
				n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				return n
			}
		}
		return 0
	}
	before := calls()
	p, err := q.List(ctx, ListOptions{Upstream: "stripe", Tenant: "a", State: StateQueued, Limit: 5})
	if err != nil {
		t.Fatal(err)
	}
	if got := calls() - before; got > 2*flows {
		t.Errorf("one page read flows %d times, want at most %d (twice per flow)", got, 2*flows)
	}
	if len(p.Jobs) != 0 {
		t.Errorf("listed %d of another tenant's jobs", len(p.Jobs))
	}
	// And the listing still ends, each of b's jobs once.
	got := listAll(t, q, ListOptions{Upstream: "stripe", Tenant: "b", State: StateQueued, Limit: 50}, nil)
	if len(got) != flows {
		t.Errorf("listed %d of b's %d jobs", len(got), flows)
	}
}

// TestListEveryUpstream: without an upstream the listing walks every
// upstream in name order, each job once, across pages that stop inside an
// upstream and at a boundary, and a page visits at most
// ListUpstreamsPerPage upstreams.
func TestListEveryUpstream(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	var ups []shaper.Upstream
	for i := range ListUpstreamsPerPage + 4 {
		ups = append(ups, shaper.Upstream{Name: fmt.Sprintf("u%02d", i), Limits: []leaky.Limit{leaky.PerSecond(1000)}, Lanes: map[string]int{"default": 1}, Retry: shaper.Retry{MaxAttempts: 3},
			ResultRetention: time.Hour, DeadRetention: time.Hour})
	}
	ups[3].Lanes = map[string]int{"default": 1, "bulk": 1}
	q := newQueue(t, rdb, ups)
	var want []string
	for _, u := range []int{1, 3, 3, 3, 19} {
		info, _, err := q.Enqueue(ctx, &Job{Tenant: "t", Upstream: ups[u].Name})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, info.ID)
		q.Enqueue(ctx, &Job{Tenant: "other", Upstream: ups[u].Name})
	}
	// Name order between upstreams, newest first within one.
	want[1], want[3] = want[3], want[1]
	got := listAll(t, q, ListOptions{Tenant: "t", Limit: 2}, nil)
	if !slices.Equal(ids(got), want) {
		t.Fatalf("got %v,\nwant %v", ids(got), want)
	}
	// The first page stops after ListUpstreamsPerPage upstreams when they
	// hold nothing of the caller's.
	p, err := q.List(ctx, ListOptions{Tenant: "nobody"})
	if err != nil || len(p.Jobs) != 0 || p.NextCursor == "" {
		t.Fatalf("got %+v, %v; want an empty page with a cursor", p, err)
	}
	if p, err = q.List(ctx, ListOptions{Tenant: "nobody", Cursor: p.NextCursor}); err != nil || p.NextCursor != "" {
		t.Fatalf("second page: got %+v, %v; want the end", p, err)
	}
	// A lane keeps the upstreams that have it; one none has is refused.
	if got := listAll(t, q, ListOptions{Tenant: "t", Lane: "bulk"}, nil); len(got) != 0 {
		t.Errorf("lane bulk: got %v, want none (all went to default)", ids(got))
	}
	if _, err := q.List(ctx, ListOptions{Lane: "vip"}); !errors.Is(err, ErrUnknownLane) {
		t.Errorf("lane vip: got %v, want ErrUnknownLane", err)
	}
	// A cursor of one upstream's listing is not one of every upstream's.
	one, _ := q.List(ctx, ListOptions{Upstream: "u03", Tenant: "t", Limit: 1})
	if _, err := q.List(ctx, ListOptions{Tenant: "t", Cursor: one.NextCursor}); !errors.Is(err, ErrBadCursor) {
		t.Errorf("one upstream's cursor: got %v, want ErrBadCursor", err)
	}
}
