package queue

import (
	"bytes"
	"context"
	"errors"
	"testing"
)

// BenchmarkGetAcrossTenants times Get of another tenant's 900 KB job
// against a missing ID and the tenant's own job (issue 7, point 4). Reading
// a foreign job must not cost more than a missing one, or its time tells
// that it exists. The figures are for BENCHMARKS.md, never asserted:
//
//	go test -run '^$' -bench GetAcrossTenants -count 10 ./queue
func BenchmarkGetAcrossTenants(b *testing.B) {
	ctx := context.Background()
	rdb := srv.Client(b)
	rdb.FlushAll(ctx)
	q, err := New(rdb, Config{Upstreams: upstreams(1000)})
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	body := bytes.Repeat([]byte("x"), 900<<10)
	big, _, err := q.Enqueue(ctx, &Job{Tenant: "billing", Upstream: "stripe", Path: "/big", Body: body})
	if err != nil {
		b.Fatal(err)
	}
	// The same job under an ID set by hand, without a tag: its payload
	// must be read to refuse another tenant.
	untagged, _, err := q.Enqueue(ctx, &Job{ID: "stripe.default.big", Tenant: "billing",
		Upstream: "stripe", Path: "/big", Body: body})
	if err != nil {
		b.Fatal(err)
	}
	missing := NewID("ops", "stripe", "default")
	for _, bc := range []struct {
		name, id, tenant string
		want             error
	}{
		{"foreign-900KB", big.ID, "ops", ErrNotFound},
		{"foreign-missing", NewID("billing", "stripe", "default"), "ops", ErrNotFound},
		{"missing", missing, "ops", ErrNotFound},
		{"own-900KB", big.ID, "billing", nil},
		{"foreign-untagged-900KB", untagged.ID, "ops", ErrNotFound},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := q.Get(ctx, bc.id, bc.tenant); !errors.Is(err, bc.want) && err != bc.want {
					b.Fatalf("Get(%s, %s): got %v, want %v", bc.id, bc.tenant, err, bc.want)
				}
			}
		})
	}
}
