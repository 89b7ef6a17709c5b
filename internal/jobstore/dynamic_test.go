package jobstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shaperhq/shaper/leaky"
)

// slotGaps takes n jobs one take at a time with a long lookahead and
// returns the gaps between their slots.
func slotGaps(tk []time.Time) []time.Duration {
	var out []time.Duration
	for i := 1; i < len(tk); i++ {
		out = append(out, tk[i].Sub(tk[i-1]))
	}
	return out
}

// TestTakeObeysStatedAndAdaptiveLimits: the take books on the same
// dynamic limits as leaky's Reserve — a stated 20/s caps a configured
// 1000/s, and a cut adaptive limit paces below its ceiling.
func TestTakeObeysStatedAndAdaptiveLimits(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit leaky.Limit
		setup func(b *leaky.Bucket) error
		min   time.Duration
	}{
		{"stated", leaky.PerSecond(1000), func(b *leaky.Bucket) error {
			_, err := b.Learn(context.Background(), []leaky.Limit{leaky.PerSecond(20)})
			return err
		}, 50 * time.Millisecond},
		{"adaptive", leaky.Limit{Rate: 20, Per: time.Second, Adaptive: true}, func(b *leaky.Bucket) error {
			_, err := b.Feedback(context.Background(), true)
			return err
		}, 58 * time.Millisecond}, // 50ms / AdaptCut = 58.8ms
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := fast(tc.name)
			u.Limits = []leaky.Limit{tc.limit}
			f := newFixture(t, u)
			if err := tc.setup(f.bucket); err != nil {
				t.Fatal(err)
			}
			for i := range 4 {
				f.enqueue(fmt.Sprintf("j%d", i), "default", "a", "")
			}
			var slots []time.Time
			for len(slots) < 4 {
				tk := f.take(4)
				for _, j := range tk.Jobs {
					slots = append(slots, j.Slot.Now.Add(j.Slot.Delay))
				}
				if len(tk.Jobs) == 0 {
					time.Sleep(10 * time.Millisecond)
				}
			}
			for i, g := range slotGaps(slots) {
				if g < tc.min {
					t.Errorf("gap %d: got %v, want at least %v", i, g, tc.min)
				}
			}
		})
	}
}
