package jobstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/tokenbucket"
)

// BenchmarkCallBooker books lone calls, each paying its admission, as
// the proxy books a call at an upstream with room: its client-side cost
// (allocations, go-redis included) beside the round trip.
func BenchmarkCallBooker(b *testing.B) {
	rdb := srv.Client(b)
	u := shaper.Upstream{Name: "bench-book-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 10),
		Limits: []leaky.Limit{leaky.PerSecond(1_000_000)}}.WithDefaults()
	bucket, err := leaky.New(rdb, leaky.Config{}).Bucket(QueueName(u.Name), leaky.BucketConfig{Limits: u.Limits, Guard: u.Guard})
	if err != nil {
		b.Fatal(err)
	}
	lim, err := tokenbucket.New(rdb, tokenbucket.Limit{Capacity: 1_000_000_000, Refill: 1_000_000, Per: time.Second},
		tokenbucket.Config{Prefix: "bench-book"})
	if err != nil {
		b.Fatal(err)
	}
	booker := NewCallBooker(rdb, For("", u.Name))
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		a, err := lim.Admission("bench", 1)
		if err != nil {
			b.Fatal(err)
		}
		t, err := booker.Book(ctx, Call{Upstream: u, Bucket: bucket, LeaseAfterSlot: 40 * time.Second, FairKey: "bench",
			ID: strconv.Itoa(i), Lookahead: 250 * time.Millisecond, Deadline: time.Now().Add(30 * time.Second), Admit: &a})
		if err != nil || t.Slot == nil {
			b.Fatalf("book: %+v %v", t, err)
		}
	}
}
