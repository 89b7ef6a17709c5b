package server

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/testsupport"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/leaky"
)

// TestProxyLateBookingIsGivenBack: a call whose booking Redis answers
// only after the call's budget (its wait, 300 ms, and the store timeout,
// 300 ms; its script run behind Redis's pause of writes for 500 ms, and
// read within the 300 ms more that book allows) is answered 503 as before,
// and the slot and concurrency lease its script booked are given back at
// once, not held until they lapse: a reservation made next gets that
// slot, with the lease free. Redis is reached as serve reaches it
// (config.FailFast, whose 1 s read timeout the pause stays under). serve's
// log shows the booking came late, so the test cannot pass by the
// booking not being made at all. Margins on a loaded machine: the call
// may reach serve up to 200 ms after the pause began, and the pause may
// begin up to 200 ms after the first call's slot (the late call's slot,
// 700 ms after that, is then still ahead of its script and within the
// 250 ms a call books ahead).
func TestProxyLateBookingIsGivenBack(t *testing.T) {
	if testing.Short() {
		t.Skip("Redis held for half a second: runs in make test")
	}
	own := redistest.New(t)
	logs := &testsupport.LockedBuffer{}
	f := newProxyFixtureOn(t, serveClient(t, own), &recorder{}, func(u *shaper.Upstream) {
		u.Limits = []leaky.Limit{{Rate: 1, Per: 700 * time.Millisecond}}
		u.Concurrency = 1
	}, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	if resp, body := f.call("GET", "/proxy/api/v1/x", ""); resp.StatusCode != 200 {
		t.Fatalf("first call: got %d %s, want 200", resp.StatusCode, body)
	}
	// The next slot is 700 ms after the first call's. The call's script
	// runs 500 ms from now, after its wait: its slot, under 200 ms ahead
	// then, is within the wait it had when its script was sent. (CLIENT
	// PAUSE is in force once it answers, as a slow script of another's
	// started from a goroutine need not be on a loaded machine.)
	f.settled(1)
	if err := own.Client(t).Do(context.Background(), "CLIENT", "PAUSE", 500, "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	resp, body := f.call("GET", "/proxy/api/v1/late", "", "Shaper-Max-Wait", "0.3")
	if resp.StatusCode != 503 {
		t.Fatalf("the late call: got %d %s, want 503", resp.StatusCode, body)
	}
	if !strings.Contains(logs.String(), errBookedLate.Error()) {
		t.Fatalf("serve's log does not show the booking answered late (a booking never made gives nothing back): %s", logs.String())
	}
	r, err := elsewhere(t, f.rdb, f.upstream()).Reserve(context.Background(), nil, leaky.MaxWait(time.Minute))
	if err != nil || !r.OK || r.Delay > 450*time.Millisecond {
		t.Fatalf("a reservation after the late call: got %+v %v, want the late call's slot, within 450 ms, its lease free", r, err)
	}
	for _, s := range f.up.requests() {
		if s.uri == "/base/v1/late" {
			t.Errorf("upstream got the late call at %v", s.at)
		}
	}
}

// TestProxyLateSlotGivesItsCostsBack: a call whose booking answer comes
// back too late to send on its slot (Redis paused 300 ms after the
// script read its clock) books again and is sent, and the tokens of the
// slot it could not use are given back: the bucket holds one call's 400
// tokens, not two calls' worth, so a send of 600 more fits at once.
func TestProxyLateSlotGivesItsCostsBack(t *testing.T) {
	own := redistest.New(t)
	f := newProxyFixtureOn(t, own.Client(t), &recorder{}, func(u *shaper.Upstream) {
		u.Limits = []leaky.Limit{leaky.PerSecond(1000), {Rate: 1000, Per: time.Minute, Cost: "tokens", Burst: 1000}}
	}, func(c *Config) {
		// The scripts' clock is read when the script call is sent, so a
		// Redis that holds the call answers a slot already past.
		c.PacerNow = time.Now
	})
	if resp, body := f.call("GET", "/proxy/api/v1/x", ""); resp.StatusCode != 200 {
		t.Fatalf("first call: got %d %s, want 200", resp.StatusCode, body)
	}
	f.settled(1)
	ctl := own.Client(t)
	if err := ctl.Do(context.Background(), "CLIENT", "PAUSE", 300, "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	if resp, body := f.call("POST", "/proxy/api/v1/x", `{}`, "Shaper-Cost", "tokens=400"); resp.StatusCode != 200 {
		t.Fatalf("the call held by the pause: got %d %s, want 200", resp.StatusCode, body)
	}
	if n := len(f.up.requests()); n != 2 {
		t.Fatalf("upstream got %d requests, want 2", n)
	}
	r, err := elsewhere(t, f.rdb, f.upstream()).Reserve(context.Background(), leaky.Costs{"tokens": 600}, leaky.MaxWait(time.Minute))
	if err != nil || !r.OK || r.Delay > 5*time.Second {
		t.Fatalf("a reservation of 600 tokens after the call: got %+v %v, want it at once: the late slot's 400 tokens given back", r, err)
	}
}
