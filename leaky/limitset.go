package leaky

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/shaperhq/shaper/internal/gcra"
)

// errLimitsChanged fails a reservation that shared a script call with
// reservations under other limits (SetLimits ran between them); Reserve
// books it again under the new ones.
var errLimitsChanged = errors.New("limits changed during the reservation")

// errStale fails a reservation whose script found that an operator had
// changed the bucket's limits since this process read them (ReasonStale);
// Reserve reads them again (Refresh) and books under the new ones.
var errStale = errors.New("limits changed by an operator since they were read")

// limitSet is the limits a bucket paces at: the current ones (the first
// n), then the draining ones, with their shapes and keys. It is never
// changed once built; SetLimits swaps in another.
type limitSet struct {
	limits   []Limit
	n        int
	gen      int64
	draining []Phase
	params   []gcra.Params
	// upto is, per limit, the µs on Redis's clock from which the scripts
	// no longer enforce it: a draining limit's drain ends there (drainFor
	// after its change); 0 for the limits in force.
	upto []int64
	// keys are block, leases, one TAT per limit; reserveKeys keys plus the
	// dynamic limits' (dynKeys), stateKeys keys plus the dyn hash: built
	// once, since a shared slice appended to on every call could be
	// written by two calls at once.
	keys, reserveKeys, stateKeys []string
	// spin is how long before a slot Wait watches the clock: strictSpin
	// for a set with a strictly spaced limit, else 0.
	spin time.Duration
	// version counts the sets a bucket has had, for callers that keep
	// arguments built from one (BookingVersion).
	version uint64
	// pov: some partition of the bucket has limits of its own, which the
	// booking script must look up (PutPartitionLimits).
	pov bool
	// changes is the count of operators' changes (Override.Changes) the
	// set follows: a booking script refuses it once the bucket's dyn hash
	// holds a later count (ReasonStale).
	changes int64
}

func (s *limitSet) current() []Limit { return s.limits[:s.n] }

func (b *Bucket) cur() *limitSet { return b.set.Load() }

func (b *Bucket) blockKey() []string  { return []string{b.p.key(b.name, "block")} }
func (b *Bucket) leasesKey() []string { return []string{b.p.key(b.name, "leases")} }

// tatKey is the TAT of limit l in generation gen: the configured limits'
// keys keep their names from before generations existed.
func (b *Bucket) tatKey(l Limit, gen int64) string {
	if gen == 0 {
		return b.p.key(b.name, "tat:"+limitID(l))
	}
	return b.p.key(b.name, "tat:"+limitID(l)+"@"+strconv.FormatInt(gen, 10))
}

// newSet checks limits and builds their set, the draining limits after
// them.
func (b *Bucket) newSet(limits []Limit, gen int64, draining []Phase, version uint64) (*limitSet, error) {
	if len(limits) == 0 {
		return nil, errors.New("at least one limit is required")
	}
	if gen < 0 {
		return nil, fmt.Errorf("generation %d: must not be negative", gen)
	}
	s := &limitSet{gen: gen, draining: slices.Clone(draining), version: version}
	s.keys = []string{b.p.key(b.name, "block"), b.p.key(b.name, "leases")}
	seen := map[string]bool{}
	add := func(l Limit, g, upto int64) error {
		prm := l.Params(b.cfg.Guard)
		if err := prm.Validate(); err != nil {
			return fmt.Errorf("limit %v: %w", l, err)
		}
		s.limits = append(s.limits, l)
		s.params = append(s.params, prm)
		s.keys = append(s.keys, b.tatKey(l, g))
		s.upto = append(s.upto, upto)
		return nil
	}
	for i, l := range limits {
		if err := l.Validate(); err != nil {
			return nil, fmt.Errorf("limit %d (%v): %w", i+1, l, err)
		}
		id := limitID(l)
		if seen[id] {
			return nil, fmt.Errorf("limit %d (%v): two limits count %s per %v", i+1, l, l.Unit(), l.Per)
		}
		seen[id] = true
		if err := add(l, gen, 0); err != nil {
			return nil, err
		}
	}
	s.n = len(limits)
	for _, ph := range draining {
		// Its drain ends on Redis's clock, in the scripts; a phase
		// without an end drains until it is dropped.
		var upto int64
		if !ph.Ended.IsZero() {
			upto = ph.Ended.Add(drainFor(ph.Limits, b.cfg.MaxWait, b.cfg.Guard)).UnixMicro()
		}
		for _, l := range ph.Limits {
			if l.Validate() != nil {
				continue
			}
			k := b.tatKey(l, ph.Generation)
			if slices.Contains(s.keys[2:], k) {
				continue
			}
			if err := add(l, ph.Generation, upto); err != nil {
				return nil, err
			}
		}
	}
	s.reserveKeys = append(slices.Clone(s.keys), b.dynKeys()...)
	s.stateKeys = append(slices.Clone(s.keys), b.dynKey())
	if s.strictSlack() > 0 {
		s.spin = strictSpin
	}
	return s, nil
}

// SetLimits replaces the limits the bucket paces at, in this process,
// from its next reservation on: limits under generation gen's state, and
// beside them the draining phases' limits under theirs (see
// BucketConfig). Reservations already booked keep their slots. It is how
// every replica applies an operator's change (see Override.Pace); it
// writes nothing to Redis.
func (b *Bucket) SetLimits(limits []Limit, gen int64, draining []Phase) error {
	old := b.cur()
	s, err := b.newSet(limits, gen, draining, old.version+1)
	if err != nil {
		return fmt.Errorf("bucket %s: %w", b.name, err)
	}
	s.pov, s.changes = old.pov, old.changes
	b.set.Store(s)
	return nil
}

// BookingVersion changes whenever SetLimits does: a caller that keeps
// BookingKeys and BookingArgs builds them again when it does.
func (b *Bucket) BookingVersion() uint64 { return b.cur().version }
