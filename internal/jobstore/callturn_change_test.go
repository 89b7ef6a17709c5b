package jobstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
)

// TestCallsKeepALoweredLimit: an operator lowers the limit from 40/s to
// 10/s while a worker takes jobs and a serve replica books calls, the
// serve hearing of it 900 ms late. Calls book only within the horizon,
// and a booking under limits older than the change books nothing (the
// serve reads the new ones and books again), so from the horizon after
// the change no window of a second holds more than 10 sends, calls and
// jobs counted together; before then, none more than 40. The serve goes
// on booking calls before it hears.
func TestCallsKeepALoweredLimit(t *testing.T) {
	const horizon = 250 * time.Millisecond
	rdb := srv.Client(t)
	ctx := context.Background()
	now := time.Now().UnixMicro()
	clock := func() time.Time { return time.UnixMicro(now) }
	u := shaper.Upstream{Name: fmt.Sprintf("lowered-%d", time.Now().UnixNano()%1e9), Limits: []leaky.Limit{leaky.PerSecond(40)}}
	u = u.WithDefaults()
	bucket := func(maxWait time.Duration) *leaky.Bucket {
		b, err := leaky.New(rdb, leaky.Config{Now: clock}).Bucket(QueueName(u.Name), leaky.BucketConfig{Limits: u.Limits, Guard: u.Guard, MaxWait: maxWait})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// The worker's bucket books up to its horizon; the serve's is
	// configured with proxy.max_wait, as server.newProxies does.
	work, serve := bucket(horizon), bucket(30*time.Second)
	s := For("", u.Name)
	tk, err := NewTaker(rdb, s, TakerConfig{Upstream: u, Bucket: work, Lookahead: horizon, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		id := fmt.Sprintf("j%04d", i)
		msg := Message{Type: "http", ID: id, Queue: s.Queue}
		if n, err := s.enqueue(ctx, rdb, Entry{ID: id, Lane: shaper.DefaultLane, FairKey: "b", Msg: msg.Marshal()}, "", strconv.FormatInt(now, 10)); err != nil || n != 1 {
			t.Fatalf("enqueue: %d %v", n, err)
		}
	}
	start := now
	const change, run = 2 * time.Second, 8 * time.Second
	var slots []int64
	var at int64
	var o leaky.Override
	unheard := 0 // calls booked after the change, before the serve heard of it
	heard := map[*leaky.Bucket]int64{}
	for el := time.Duration(0); el < run; el += 5 * time.Millisecond {
		if at == 0 && el >= change {
			o, err = work.PutLimits(ctx, []leaky.Limit{leaky.PerSecond(10)})
			if err != nil {
				t.Fatal(err)
			}
			at = o.At.UnixMicro()
			heard[work], heard[serve] = at, at+(900*time.Millisecond).Microseconds()
		}
		for _, b := range []*leaky.Bucket{work, serve} {
			if at != 0 && now >= heard[b] {
				if _, _, err := b.Apply(o, clock()); err != nil {
					t.Fatal(err)
				}
			}
		}
		got, err := tk.take(ctx, 64, strconv.FormatInt(now, 10))
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range got.Jobs {
			slots = append(slots, now+j.Slot.Delay.Microseconds())
		}
		// Calls of tenant a, as many as will book.
		for i := range 20 {
			tn, err := s.BookCall(ctx, rdb, Call{Upstream: u, Bucket: serve, FairKey: "a", ID: fmt.Sprintf("c%d-%d", now, i),
				Lookahead: horizon, Remaining: 30 * time.Second, Now: clock})
			if err != nil {
				t.Fatal(err)
			}
			if tn.Slot == nil {
				break
			}
			slots = append(slots, now+tn.Slot.Delay.Microseconds())
			if at != 0 && now < heard[serve] {
				unheard++
			}
		}
		now += (5 * time.Millisecond).Microseconds()
	}
	slices.Sort(slots)
	busiest := func(from, to int64) int {
		most := 0
		for i, s := range slots {
			if s < from || s >= to {
				continue
			}
			n := 0
			for _, x := range slots[i:] {
				if x-s >= time.Second.Microseconds() || x >= to {
					break
				}
				n++
			}
			most = max(most, n)
		}
		return most
	}
	if unheard == 0 {
		t.Errorf("the serve booked no call between the change and hearing of it")
	}
	settle := at + horizon.Microseconds()
	if got := busiest(start, settle); got > 40 {
		t.Errorf("a second before the change or while it settles holds %d sends, over the old 40", got)
	}
	if got := busiest(settle, slots[len(slots)-1]+1); got > 10 {
		t.Errorf("a second from %v after the change holds %d sends, over the new 10", time.Duration(settle-at)*time.Microsecond, got)
	}
	if last := time.Duration(slots[len(slots)-1]-start) * time.Microsecond; last > run+horizon {
		t.Errorf("a slot was booked %v after the start, beyond the run and the horizon", last)
	}
}
