package jobstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
)

// TestPartitionAsFastAsUpstreamFillsTake: a partition whose limit is no
// tighter than the upstream's gives a take as many jobs as the upstream's
// limit does (it goes once it can send by the upstream's own slot for the
// job), not one job a partition: 32 jobs over 4 tenants and 8 partitions,
// all asked for in one take, all go, each partition's sends spaced by its
// limit and the upstream's by its own.
func TestPartitionAsFastAsUpstreamFillsTake(t *testing.T) {
	rdb := srv().Client(t)
	u := fairUpstream("fill") // 100,000/s, the partitions' limit the same
	r := newRig(t, rdb, u, 250*time.Millisecond)
	for i := range 64 {
		r.add(job{id: fmt.Sprintf("j%02d", i), tenant: fmt.Sprintf("t%d", i%4), partition: fmt.Sprintf("p%d", i%8)})
	}
	tk := r.take(32)
	if len(tk.Jobs) != 32 {
		t.Fatalf("took %d, want 32", len(tk.Jobs))
	}
	spacing := 10 * time.Microsecond
	// (The take's slots are all from one Redis now, so their delays
	// order and space them.)
	var all []time.Duration
	byPart := map[string][]time.Duration{}
	for _, j := range tk.Jobs {
		at := j.Slot.Delay
		if d := j.Slot.Delay; d > 250*time.Millisecond {
			t.Errorf("job %s booked %v ahead, beyond the lookahead", j.ID, d)
		}
		all = append(all, at)
		byPart[r.part[j.ID]] = append(byPart[r.part[j.ID]], at)
	}
	spaced := func(what string, ts []time.Duration) {
		t.Helper()
		for i := range ts {
			for k := range i {
				if d := (ts[i] - ts[k]).Abs(); d < spacing {
					t.Errorf("%s: two sends %v apart, want at least %v", what, d, spacing)
				}
			}
		}
	}
	spaced("upstream", all)
	for p, ts := range byPart {
		if len(ts) != 4 {
			t.Errorf("partition %s gave %d jobs, want 4", p, len(ts))
		}
		spaced("partition "+p, ts)
	}
	r.check("take")
}

// TestParkedViewsAgree: after a take, the three views of whether a
// partition is parked agree: status (pk), a job's own hold (GET
// /v1/jobs/{id}) and an enqueue's Held. A partition as fast as its
// upstream, whose next slot lies ahead but no later than the upstream's,
// is not parked; one twice as slow is, until its next slot.
func TestParkedViewsAgree(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		per    time.Duration
		parked bool
	}{
		{"as-fast", 2 * time.Second, false},
		{"slower", 4 * time.Second, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			rdb := srv().Client(t)
			u := shaper.Upstream{Name: "views-" + c.name, Limits: []leaky.Limit{{Rate: 1, Per: 2 * time.Second}},
				PartitionLimits: []leaky.Limit{{Rate: 1, Per: c.per}}}
			r := newRig(t, rdb, u, 50*time.Millisecond)
			r.add(job{id: "p1", tenant: "t", partition: "a"}, job{id: "p2", tenant: "t", partition: "a"})
			if got := r.takeIDs(10); len(got) != 1 || got[0] != "p1" {
				t.Fatalf("took %v, want [p1]", got)
			}
			bk := r.bucket.Layout().Block
			h, err := r.space.ReadHolds(ctx, rdb, bk)
			if err != nil {
				t.Fatal(err)
			}
			jh, err := r.space.ReadJobHold(ctx, rdb, bk, "p2")
			if err != nil {
				t.Fatal(err)
			}
			e, err := r.space.EnqueueChecked(ctx, rdb, r.entry(job{id: "p3", tenant: "t", partition: "a"}), bk)
			if err != nil {
				t.Fatal(err)
			}
			r.ids = append(r.ids, "p3")
			r.lane["p3"], r.part["p3"] = "default", "a"
			inStatus, inJob := h.Parked["default"] > 0, !jh.ParkedUntil.IsZero()
			if inStatus != c.parked || inJob != c.parked || e.Held != c.parked {
				t.Errorf("parked: status %v, the job's hold %v (until %v), the enqueue's Held %v; want %v in all three",
					inStatus, inJob, jh.ParkedUntil, e.Held, c.parked)
			}
			r.check("views")
		})
	}
}
