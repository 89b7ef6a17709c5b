package tokenbucket

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
)

// FuzzLimit: Validate either explains a limit or accepts one whose bucket
// the arithmetic can hold exactly, and that a fresh Local honours.
func FuzzLimit(f *testing.F) {
	f.Add(int64(100), int64(10), int64(time.Second))
	f.Add(int64(1), int64(1), int64(time.Hour))
	f.Add(int64(0), int64(1), int64(time.Second))
	f.Add(int64(1<<40), int64(1), int64(time.Hour))
	f.Add(int64(5), int64(1000), int64(time.Millisecond))
	f.Add(int64(-1), int64(-1), int64(-1))
	f.Fuzz(func(t *testing.T, capacity, refill, per int64) {
		l := Limit{Capacity: capacity, Refill: refill, Per: time.Duration(per)}
		err := l.Validate()
		if err != nil {
			if err.Error() == "" {
				t.Fatal("got an empty error message")
			}
			return
		}
		p := l.params()
		if p.Validate() != nil || p.Interval < 1 || l.Window() <= 0 {
			t.Fatalf("%+v passed Validate but has params %+v", l, p)
		}
		if !strings.Contains(l.String(), fmt.Sprint(capacity)) {
			t.Fatalf("String %q does not name the capacity", l.String())
		}
		res, err := NewLocal(l, nil).Allow(context.Background(), "k", capacity)
		if err != nil || !res.Allowed || res.Remaining != 0 {
			t.Fatalf("%v: spending a full fresh bucket got %v, %v; want allowed with 0 left", l, res, err)
		}
	})
}

// FuzzAllowArguments: any key and cost is either refused with ErrInvalid,
// before anything reaches Redis, or decided by Redis exactly as the model
// decides it (keys are arbitrary bytes).
func FuzzAllowArguments(f *testing.F) {
	for _, s := range []string{"k", "", "{", "}", "a{b}c", "\x00", "\xff\xfe", "ключ", strings.Repeat("x", 512), strings.Repeat("x", 513)} {
		f.Add(s, int64(1))
	}
	f.Add("k", int64(0))
	f.Add("k", int64(7))
	f.Add("k", int64(8))
	f.Add("k", int64(-1<<63))
	rdb := srv.Client(f)
	f.Fuzz(func(t *testing.T, key string, cost int64) {
		l := PerSecond(1, 7)
		clock := newFakeClock()
		lim, err := New(rdb, l, Config{Now: clock.Now, MaxBatch: 1, Prefix: fmt.Sprintf("t:fuzz:%d", seq.Add(1))})
		if err != nil {
			t.Fatal(err)
		}
		loc := NewLocal(l, clock.Now)
		invalid := key == "" || len(key) > MaxKeyLen || strings.ContainsAny(key, "{}") || cost < 1 || cost > l.Capacity
		for i := 0; i < 2; i++ {
			want, werr := loc.Allow(context.Background(), key, cost)
			got, gerr := lim.Allow(context.Background(), key, cost)
			if invalid {
				if !errors.Is(gerr, shaper.ErrInvalid) || !errors.Is(werr, shaper.ErrInvalid) {
					t.Fatalf("Allow(%q, %d): got %v and %v, want ErrInvalid from both", key, cost, gerr, werr)
				}
				return
			}
			if gerr != nil || werr != nil || got != want {
				t.Fatalf("Allow(%q, %d) #%d: got %v, %v from Redis, want %v, %v", key, cost, i, got, gerr, want, werr)
			}
		}
	})
}
