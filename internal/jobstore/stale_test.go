package jobstore_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/shaperhq/shaper/leaky"
)

// TestTakeRefusesStaleLimits: a take under limits an operator has changed
// since the bucket last read them (a replica that has not heard of the
// change) books nothing under them; the taker reads the change and takes
// under the new limits at once.
func TestTakeRefusesStaleLimits(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, srv().Client(t), fast("stale"), 50*time.Millisecond)
	// Written to Redis, not applied here: this replica has not heard.
	next := []leaky.Limit{{Rate: 2, Per: 10 * time.Second}}
	if _, err := r.bucket.PutLimits(ctx, next); err != nil {
		t.Fatal(err)
	}
	if gen := r.bucket.Config().Generation; gen != 0 {
		t.Fatalf("before the take: generation %d, want 0 (not heard)", gen)
	}
	for i := range 3 {
		r.add(job{id: fmt.Sprintf("j%d", i), tenant: "t"})
	}
	// Under the old limits all three would go; under 2 per 10s one does
	// within the lookahead.
	if got := r.takeIDs(10); len(got) != 1 {
		t.Fatalf("took %v, want 1 (the operator's 2 per 10s)", got)
	}
	if c := r.bucket.Config(); c.Generation != 1 || !slices.Equal(c.Limits, next) {
		t.Fatalf("after the take: pacing at %v generation %d, want %v generation 1", c.Limits, c.Generation, next)
	}
	r.check("stale take")
}
