package jobstore_test

import (
	"fmt"
	"testing"
	"time"
)

// Lanes divide a tenant's share, not the upstream: tenant a with backlog
// in high (weight 3) and low (weight 1) and tenant b with backlog only in
// low each get half of the sends, and a's half splits 3:1 between its
// lanes.
func TestLanesWithinTenantShare(t *testing.T) {
	for _, batch := range []int{1, 8, 40} {
		t.Run(fmt.Sprintf("take %d at a time", batch), func(t *testing.T) {
			u := fast("lanes")
			u.Lanes = map[string]int{"high": 3, "low": 1}
			r := newRig(t, srv().Client(t), u, 100*time.Millisecond)
			for i := range 30 {
				r.add(job{id: fmt.Sprintf("a-high-%02d", i), lane: "high", tenant: "a"},
					job{id: fmt.Sprintf("a-low-%02d", i), lane: "low", tenant: "a"},
					job{id: fmt.Sprintf("b-low-%02d", i), lane: "low", tenant: "b"})
			}
			r.check("enqueue")
			got := map[string]int{}
			taken := 0
			for taken < 40 {
				tk := r.take(batch)
				if len(tk.Jobs) == 0 {
					t.Fatalf("took nothing after %d", taken)
				}
				for _, j := range tk.Jobs {
					got[j.ID[:len(j.ID)-3]]++
				}
				taken += len(tk.Jobs)
				// Within every prefix of sends the tenants stay within one
				// send of each other.
				a, b := got["a-high"]+got["a-low"], got["b-low"]
				if a-b > 1 || b-a > 1 {
					t.Fatalf("after %d sends a has %d, b %d", taken, a, b)
				}
			}
			r.check("takes")
			if a, b := got["a-high"]+got["a-low"], got["b-low"]; a != 20 || b != 20 {
				t.Errorf("of the first 40 sends a got %d, b %d; want 20 each", a, b)
			}
			if got["a-high"] != 15 || got["a-low"] != 5 {
				t.Errorf("a's sends high:low = %d:%d, want 15:5", got["a-high"], got["a-low"])
			}
		})
	}
}

// Start-time fair queuing starts a tenant that joins (or comes back) at the
// current virtual time: it may go once ahead of the tenants already
// waiting, within the round, but gets no burst for the time it was away,
// and the tenants already there keep their share.
func TestFairnessUnderChurn(t *testing.T) {
	if testing.Short() {
		t.Skip("seconds of churn: runs in make test")
	}
	batches := []int{1, 7}
	if testing.Short() {
		// The checker reads every job after each step; one batch size
		// keeps go test -short quick.
		batches = []int{7}
	}
	for _, batch := range batches {
		t.Run(fmt.Sprintf("take %d at a time", batch), func(t *testing.T) {
			r := newRig(t, srv().Client(t), fast("churn"), 100*time.Millisecond)
			seq := map[string]int{}
			add := func(tenant string, n int) {
				for range n {
					r.add(job{id: fmt.Sprintf("%s-%04d", tenant, seq[tenant]), tenant: tenant})
					seq[tenant]++
				}
			}
			sent := map[string]int{}
			// takeN takes n jobs and checks, after every send, that no
			// tenant in tenants (all backlogged throughout) is more than
			// one send ahead of another since the mark.
			takeN := func(n int, tenants ...string) {
				t.Helper()
				base := map[string]int{}
				for _, k := range tenants {
					base[k] = sent[k]
				}
				for done := 0; done < n; {
					tk := r.take(min(batch, n-done))
					if len(tk.Jobs) == 0 {
						t.Fatalf("took nothing")
					}
					for _, j := range tk.Jobs {
						sent[j.ID[:1]]++
						done++
						for _, x := range tenants {
							for _, y := range tenants {
								if d := (sent[x] - base[x]) - (sent[y] - base[y]); d > 1 {
									t.Fatalf("tenant %s is %d sends ahead of %s (sent since the mark: %v, base %v)", x, d, y, sent, base)
								}
							}
						}
					}
				}
				r.check("takes")
			}
			add("a", 400)
			add("b", 400)
			takeN(60, "a", "b")
			// c joins late: no catch-up for the 60 sends it missed.
			add("c", 400)
			takeN(60, "a", "b", "c")
			// d has little to send: it gets its few within the first rounds
			// and leaves; the others go on evenly.
			add("d", 3)
			before := sent["d"]
			takeN(12, "a", "b", "c")
			if sent["d"]-before != 3 {
				t.Errorf("d sent %d of its 3 within 12 sends among 4 tenants", sent["d"]-before)
			}
			takeN(30, "a", "b", "c")
			// d comes back with a backlog, after being away 30 sends: again
			// one round at most ahead.
			add("d", 400)
			takeN(80, "a", "b", "c", "d")
			// a leaves (its jobs are cancelled), the rest share.
			r.check("before a leaves")
			for i := sent["a"]; i < seq["a"]; i++ {
				if err := r.space.Cancel(t.Context(), r.rdb, fmt.Sprintf("a-%04d", i)); err != nil {
					t.Fatal(err)
				}
			}
			r.check("a cancelled")
			gone := sent["a"]
			takeN(60, "b", "c", "d")
			if sent["a"] != gone {
				t.Errorf("a sent %d after all its jobs were cancelled", sent["a"]-gone)
			}
		})
	}
}
