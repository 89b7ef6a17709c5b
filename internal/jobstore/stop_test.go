package jobstore_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/leaky"
)

// A take stops after parking 200 partitions or 2000 steps, so Redis is not
// held long. If it took nothing then, it must say to come back at once:
// reporting nothing due (and setting the sleep flag) leaves the rest of
// the ready structure unexamined until some enqueue or the poll interval.
func TestTakeThatStopsEarlySaysComeBack(t *testing.T) {
	t.Run("parks", func(t *testing.T) {
		u := fast("parks")
		u.Limits = append(u.Limits, leaky.Limit{Rate: 1_000_000, Per: time.Second, Cost: "tokens", Burst: 1000})
		u.PartitionLimits = []leaky.Limit{{Rate: 100, Per: time.Hour, Cost: "tokens", Burst: 10}}
		r := newRig(t, srv().Client(t), u, 100*time.Millisecond)
		const parts = 450
		for i := range parts {
			p := fmt.Sprintf("p%03d.example", i)
			r.add(job{id: "a" + p, tenant: "t", partition: p, costs: map[string]int64{"tokens": 5}},
				job{id: "b" + p, tenant: "t", partition: p, costs: map[string]int64{"tokens": 10}})
		}
		// Jobs finish as soon as they are taken, as a fast upstream's do, so
		// no lease is left to make a take report something due.
		var taken []string
		var tk jobstore.Take
		for i := 0; ; i++ {
			tk = r.take(64)
			taken = append(taken, ids(tk)...)
			r.finish(jobstore.Succeeded, time.Time{}, ids(tk)...)
			if len(tk.Jobs) == 0 && (tk.Next <= 0 || tk.Next > time.Millisecond) {
				break
			}
			if i == 30 {
				t.Fatalf("30 takes and still told to come back")
			}
		}
		if len(taken) != parts {
			t.Fatalf("took %d jobs, want the %d first jobs (each partition's second needs 10 tokens, 5 left)", len(taken), parts)
		}
		r.check("first jobs done")
		// Every partition waits 5 token intervals (~3m18s) for 10 tokens. The
		// take that says so must have seen them all: the lane is on the
		// calendar and next names that time.
		if !onCalendar(r, "default", "t") {
			t.Errorf("a take took nothing and reported next %v, with the lane's partitions not all examined (lane not on the calendar)", tk.Next)
		}
		interval := time.Duration(u.PartitionLimits[0].Params(r.u.Guard).Interval) * time.Microsecond
		if want := 5*interval - 100*time.Millisecond; tk.Next < want-2*time.Second || tk.Next > want+time.Second {
			t.Errorf("final take: next %v, want when the first partition has 10 tokens again (%v)", tk.Next, want)
		}
		r.check("all parked")
	})
	t.Run("steps", func(t *testing.T) {
		ctx := context.Background()
		u := fast("steps")
		u.Fairness.By = shaper.FairByPartition
		r := newRig(t, srv().Client(t), u, 100*time.Millisecond)
		for i := range 1100 {
			p := fmt.Sprintf("x%04d.example", i)
			r.add(job{id: p, tenant: "t", partition: p})
			if err := r.space.Cancel(ctx, r.rdb, p); err != nil {
				t.Fatal(err)
			}
		}
		r.add(job{id: "real", tenant: "t", partition: "zz.example"})
		r.check("1100 flows emptied by cancel, one job behind them")
		for i := 0; ; i++ {
			tk := r.take(10)
			if slices.Equal(ids(tk), []string{"real"}) {
				break
			}
			if len(tk.Jobs) != 0 || tk.Wait > 0 || tk.Next <= 0 || tk.Next > time.Millisecond || i == 10 {
				t.Fatalf("take %d: took %v, wait %v, next %v; want the ready job, or to be told to come back at once",
					i, ids(tk), tk.Wait, tk.Next)
			}
		}
		r.check("take")
	})
}
