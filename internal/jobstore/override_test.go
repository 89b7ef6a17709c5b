package jobstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/leaky"
)

// TestTakeFollowsOperatorLimits: the take paces at limits an operator put
// in place of the upstream's and at a partition's own, once the bucket
// has applied them, without being built again.
func TestTakeFollowsOperatorLimits(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, srv().Client(t), fast("live"), 50*time.Millisecond)
	apply := func() {
		t.Helper()
		o, err := r.bucket.ReadOverride(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := r.bucket.Apply(o, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	add := func(prefix, partition string, n int) {
		for i := range n {
			r.add(job{id: fmt.Sprintf("%s%d", prefix, i), tenant: "t", partition: partition})
		}
	}
	add("a", "acme", 3)
	if got := r.takeIDs(10); len(got) != 3 {
		t.Fatalf("before any override: took %v, want all 3", got)
	}
	r.finish(jobstore.Succeeded, time.Time{}, "a0", "a1", "a2")

	// acme gets 1 per 10s of its own; other partitions stay unlimited.
	if err := r.bucket.PutPartitionLimits(ctx, "acme", []leaky.Limit{{Rate: 1, Per: 10 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	apply()
	add("b", "acme", 3)
	add("c", "other", 2)
	got := r.takeIDs(10)
	acme := 0
	for _, id := range got {
		if id[0] == 'b' {
			acme++
		}
	}
	if acme != 1 || len(got) != 3 {
		t.Fatalf("with acme at 1 per 10s: took %v, want one of acme's and both of other's", got)
	}
	r.check("partition override")
	r.finish(jobstore.Succeeded, time.Time{}, got...)

	// The upstream at 2 per 10s: its slots now come 5s apart, beyond the
	// lookahead, so one take gets one job.
	if _, err := r.bucket.PutLimits(ctx, []leaky.Limit{{Rate: 2, Per: 10 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	apply()
	if gen := r.bucket.Config().Generation; gen != 1 {
		t.Fatalf("got generation %d, want 1", gen)
	}
	add("d", "", 3)
	if got := r.takeIDs(10); len(got) != 1 {
		t.Fatalf("with the upstream at 2 per 10s: took %v, want 1", got)
	}
	r.check("upstream override")
}
