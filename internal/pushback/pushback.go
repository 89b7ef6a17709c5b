// Package pushback reads an upstream's 429 the one way shaper reads it,
// for jobs (package dispatcher) and proxied calls (package server) alike,
// and pauses the upstream's bucket for every replica as it says: until
// the time it gives, or, when it gives none, by a bare pushback that grows
// while the refusals repeat (leaky.Bucket.Pushback).
package pushback

import (
	"cmp"
	"context"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/shaperhq/shaper/internal/ratelimit"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

// Pushback lengths for a 429 that gives no time: an isolated one costs
// BareBase of sending (2.5% of a second); a refusal of a request sent
// within BareProbe of the upstream's send intervals (at least twice
// BareBase: 50 ms, five sends at 100/s) after the last such pause ended
// doubles it, up to the upstream's pushback_default.
const (
	BareBase  = 25 * time.Millisecond
	BareProbe = 3
)

// Refusal is what one 429 says.
type Refusal struct {
	// Wait is the least delay before the refused request may go again;
	// zero when the answer gave no time.
	Wait time.Duration
	// Reason describes the refusal: "429 from upstream (reason)".
	Reason string
	// Whole is set when the refusal concerns the whole upstream (not one
	// endpoint, object or partition's quota): it pauses the fleet, and
	// adaptive limits are cut.
	Whole bool
	// Bare is a whole refusal that gave no time: a bare pushback.
	Bare bool
}

// Read reads a 429's headers h (rd is their rate-limit reading). Stripe's
// endpoint-scoped reasons and a quota the IETF draft marks as one
// partition's (pk) concern one endpoint, object or user; the rest of the
// upstream may go on.
func Read(h http.Header, rd ratelimit.Reading) Refusal {
	wait := rd.RetryAfter
	q, whole := rd.Exhausted()
	if wait <= 0 && whole {
		wait = q.Reset
	}
	r := Refusal{Wait: wait, Reason: "429 from upstream"}
	reason := strings.ToLower(strings.TrimSpace(h.Get("Stripe-Rate-Limited-Reason")))
	if reason != "" {
		r.Reason += " (" + reason + ")"
	}
	if strings.HasPrefix(reason, "endpoint-") || reason == "resource-specific" {
		return r
	}
	if p, ok := rd.ExhaustedPartition(); ok && !whole {
		r.Wait = max(r.Wait, p.Reset)
		r.Reason += " (" + p.Name + ", one partition's quota)"
		return r
	}
	r.Whole, r.Bare = true, wait <= 0
	return r
}

// Pause is the fleet-wide pause a bare refusal places on b: BareBase, or
// longer while refusals repeat, up to ceiling (the upstream's
// pushback_default); spacing is how far apart the upstream's request
// limits space sends, sentAt the refused send's slot on Redis's clock. It
// returns the pause's end, its length, and whether this call placed it.
func Pause(ctx context.Context, b *leaky.Bucket, ceiling, spacing time.Duration, sentAt time.Time) (time.Time, time.Duration, bool, error) {
	return b.Pushback(ctx, BareBase, max(BareBase, ceiling), BareProbe*spacing, queue.BlockRefused, sentAt)
}

// Spacing is how far apart the request limits among ls, at the rates they
// are paced at, space sends under guard: a quota that frees its next unit
// sooner than this needs no pause. Zero when none counts requests.
func Spacing(ls []leaky.LimitState, guard time.Duration) time.Duration {
	var out int64
	for _, l := range ls {
		if l.Limit.Cost != "" || l.Rate <= 0 {
			continue
		}
		iv := l.Limit.Params(guard).Interval
		out = max(out, int64(float64(iv)*float64(l.Limit.Rate)/l.Rate))
	}
	return time.Duration(out) * time.Microsecond
}

// Relearn is how often a replica refreshes stated limits that did not
// change, keeping them alive in Redis (they lapse after an hour unstated).
const Relearn = 5 * time.Minute

// Stated turns the policies an answer states into limits on requests, in
// one order, so that answers stating the same compare equal.
func Stated(rd *ratelimit.Reading) []leaky.Limit {
	if rd == nil {
		return nil
	}
	var out []leaky.Limit
	for _, p := range rd.RequestPolicies() {
		l := leaky.Limit{Rate: p.Quota, Per: p.Window}
		if l.Validate() == nil {
			out = append(out, l)
		}
	}
	slices.SortFunc(out, func(a, b leaky.Limit) int {
		return cmp.Or(cmp.Compare(a.Per, b.Per), cmp.Compare(a.Rate, b.Rate))
	})
	return out
}
