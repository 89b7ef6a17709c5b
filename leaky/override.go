package leaky

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/script"
)

// An operator can replace a bucket's configured limits while it runs, for
// every process pacing it, and give single partitions limits of their own
// (PutLimits, PutPartitionLimits). Both are kept in Redis with no expiry:
// an operator's setting is configuration, not limiter state (the TATs it
// paces are limiter state, and expire as every TAT does), and it must
// outlive any quiet spell until it is reset.
//
// A bucket's limits are passed to its scripts from memory, so the take
// reads nothing more per job: every process holds the override in force
// and re-applies it (Follow) as soon as the change is announced over
// pub/sub, and within ApplyWithin in case an announcement was lost (a
// fleet-wide count of changes, one GET a tick, says when to look). And
// nothing waits for that: the change writes its count of changes into the
// bucket's dyn hash, which every booking script reads already, and a
// script given limits that follow an older count books nothing and
// answers ReasonStale; the process reads the change then (Refresh) and
// books again. A partition's override is different: there may be many (100,000
// fit in tens of megabytes), so the booking script looks the job's
// partition up in one hash, field by field, and only on a bucket that has
// any.
//
// Strictness through a change of the bucket's limits. Each change opens
// a generation, and the new limits keep their state (TATs) under keys of
// that generation. Beside them, every process keeps enforcing the limits
// in force before the change, under their own keys, until the slots
// booked under them can no longer share a window with a new one
// (drainFor, judged by the scripts on Redis's clock): MaxWait for the
// slots booked ahead before the change, the longest Per of the old limits
// and the guard. So every window holds no more than the old limits allow
// while slots booked under them drain, and a new limit starts from an
// empty state without a burst on top of them: the old limits' state still
// holds them back. Every slot booked after the change has gone through the
// new limits' state too (the stale check), so from MaxWait after the
// change no window of length Per holds more than a new limit allows: from
// one Per after it, for a Per of at least MaxWait. A limit the upstream
// states still caps whatever is in force (Learn keeps its own state, which
// a change does not touch).
//
// A partition's limits change in place: their state is named by what the
// limit counts and over what window, so a partition that goes from 100 to
// 50 requests a minute continues from where its 100 left it. A lower rate
// on the same units and window holds at once (its slots are spaced from
// the last one booked); a higher one may let a window that straddles the
// change reach the new limit.
const (
	// ApplyWithin bounds how long a process that books nothing goes on
	// holding limits an operator has replaced (one that books reads them
	// at its next booking, ReasonStale).
	ApplyWithin = time.Second
	// phaseMemory is how long a replaced phase is kept in the record after
	// it ended, far beyond any drain; older ones are dropped at the next
	// change.
	phaseMemory = time.Hour
	// maxPhases bounds the replaced phases kept.
	maxPhases = 16
)

// ErrOverrideConflict is returned when another change of the same
// bucket's limits won a race more times than a change retries.
var ErrOverrideConflict = errors.New("leaky: limits changed concurrently; try again")

// Phase is a set of limits that was in force and may still be draining.
type Phase struct {
	// Generation names the limits' state: 0 for configured limits.
	Generation int64
	// Limits as they were paced.
	Limits []Limit
	// Ended is when a change replaced them, on Redis's clock.
	Ended time.Time

	field string // of the override record
}

// Override is what an operator has set on a bucket, as Redis holds it.
type Override struct {
	// Changes counts the changes ever made; 0 means never.
	Changes int64
	// Limits replace the configured limits; nil when the configured ones
	// are in force (never changed, or reset).
	Limits []Limit
	// At is when the last change was made, on Redis's clock.
	At time.Time
	// Earlier are the phases that changes replaced, newest first.
	Earlier []Phase
	// Partitions counts the partitions with limits of their own.
	Partitions int64
	// read orders this process's readings (ReadOverride): a later one
	// has a higher number; 0 for an Override that was not read.
	read uint64
}

// readings numbers ReadOverride's answers in the order they arrive.
var readings atomic.Uint64

// Generation names the state of the limits in force: the change that set
// them, or 0 for the configured limits.
func (o Override) Generation() int64 {
	if o.Limits == nil {
		return 0
	}
	return o.Changes
}

// Pace is what a bucket configured with configured limits paces at at
// now (a replica's clock, close to Redis's): the limits in force, their
// generation, and the earlier phases that may still be draining; until is
// when the next of those is dropped (zero if none is). A phase drains for
// drainFor after its change on Redis's clock, as the scripts judge it;
// it is passed to them for clockMargin longer, so that a replica's clock
// ahead of Redis's does not end it early. maxWait and guard are the
// bucket's (BucketConfig).
func (o Override) Pace(configured []Limit, maxWait, guard time.Duration, now time.Time) (limits []Limit, gen int64, draining []Phase, until time.Time) {
	limits, gen = configured, int64(0)
	if o.Limits != nil {
		limits, gen = o.Limits, o.Changes
	}
	for _, ph := range o.Earlier {
		end := ph.Ended.Add(drainFor(ph.Limits, maxWait, guard) + clockMargin)
		if !now.Before(end) {
			continue
		}
		draining = append(draining, ph)
		if until.IsZero() || end.Before(until) {
			until = end
		}
	}
	return limits, gen, draining, until
}

// drainFor is how long after a change (on Redis's clock) its replaced
// limits are enforced: until no window of theirs can hold a slot booked
// under them alone and a slot booked only under the new limits. The last
// slot booked under them alone was booked before the change (the scripts
// refuse them after it, ReasonStale), at most maxWait ahead.
func drainFor(ls []Limit, maxWait, guard time.Duration) time.Duration {
	var per time.Duration
	for _, l := range ls {
		per = max(per, l.Per)
	}
	return maxWait + per + guard
}

// clockMargin is how much longer than its drain a phase is passed to the
// scripts, which end it on Redis's clock: a replica whose clock runs
// ahead by less does not drop it early.
const clockMargin = ApplyWithin

// opKey is the bucket's override record: a hash of
//
//	n       -> changes made
//	at      -> µs of the last change
//	lim     -> the limits in force (encodeLimits); absent: the configured ones
//	e:<i>   -> the phase change i replaced: "generation ended-µs limits"
//	pn      -> partitions with limits of their own
func (b *Bucket) opKey() string { return b.p.key(b.name, "op") }

// povKey is the partitions' overrides: partition -> encodePartition.
func (b *Bucket) povKey() string { return b.p.key(b.name, "pov") }

func (p *Pacer) limitsChannel() string { return p.prefix + ":leaky:limits" }

// LimitsChannel is where changes of limits are announced (the bucket's
// name), for processes that follow them (Follow).
func (p *Pacer) LimitsChannel() string { return p.limitsChannel() }

// encodeLimits writes limits as "rate per-µs cost burst adaptive", comma
// separated ("-" for no cost).
func encodeLimits(ls []Limit) string {
	parts := make([]string, len(ls))
	for i, l := range ls {
		c := l.Cost
		if c == "" {
			c = "-"
		}
		a := 0
		if l.Adaptive {
			a = 1
		}
		parts[i] = fmt.Sprintf("%d %d %s %d %d", l.Rate, l.Per.Microseconds(), c, l.Burst, a)
	}
	return strings.Join(parts, ",")
}

func decodeLimits(s string) ([]Limit, error) {
	if s == "" {
		return nil, errors.New("no limits")
	}
	var out []Limit
	for _, part := range strings.Split(s, ",") {
		f := strings.Fields(part)
		if len(f) < 5 {
			return nil, fmt.Errorf("limit %q: want 5 fields", part)
		}
		rate, err1 := strconv.ParseInt(f[0], 10, 64)
		per, err2 := strconv.ParseInt(f[1], 10, 64)
		burst, err3 := strconv.ParseInt(f[3], 10, 64)
		if err := errors.Join(err1, err2, err3); err != nil {
			return nil, fmt.Errorf("limit %q: %w", part, err)
		}
		l := Limit{Rate: rate, Per: time.Duration(per) * time.Microsecond, Burst: burst, Adaptive: f[4] == "1"}
		if f[2] != "-" {
			l.Cost = f[2]
		}
		out = append(out, l)
	}
	return out, nil
}

// encodePartition writes a partition's limits as the booking script reads
// them, "id interval capacity per-µs cost" (cost "-" for none), then rate
// and burst for ReadPartitionLimits; comma separated.
func (b *Bucket) encodePartition(ls []Limit) (string, error) {
	parts := make([]string, len(ls))
	for i, l := range ls {
		if err := l.Validate(); err != nil {
			return "", err
		}
		p := l.Params(b.cfg.Guard)
		if err := p.Validate(); err != nil {
			return "", fmt.Errorf("limit %v: %w", l, err)
		}
		c := l.Cost
		if c == "" {
			c = "-"
		}
		parts[i] = fmt.Sprintf("%s %d %d %d %s %d %d", limitID(l), p.Interval, p.Capacity, l.Per.Microseconds(), c, l.Rate, l.Burst)
	}
	return strings.Join(parts, ","), nil
}

func decodePartition(s string) ([]Limit, error) {
	var out []Limit
	for _, part := range strings.Split(s, ",") {
		f := strings.Fields(part)
		if len(f) != 7 {
			return nil, fmt.Errorf("partition limit %q: want 7 fields", part)
		}
		per, err1 := strconv.ParseInt(f[3], 10, 64)
		rate, err2 := strconv.ParseInt(f[5], 10, 64)
		burst, err3 := strconv.ParseInt(f[6], 10, 64)
		if err := errors.Join(err1, err2, err3); err != nil {
			return nil, fmt.Errorf("partition limit %q: %w", part, err)
		}
		l := Limit{Rate: rate, Per: time.Duration(per) * time.Microsecond, Burst: burst}
		if f[4] != "-" {
			l.Cost = f[4]
		}
		out = append(out, l)
	}
	return out, nil
}

// ReadOverride reads what an operator has set on the bucket.
func (b *Bucket) ReadOverride(ctx context.Context) (Override, error) {
	h, ok := b.p.rdb.(redis.Cmdable)
	if !ok {
		return Override{}, fmt.Errorf("leaky: client %T cannot read hashes", b.p.rdb)
	}
	m, err := h.HGetAll(ctx, b.opKey()).Result()
	if err != nil {
		return Override{}, fmt.Errorf("read limits of %s: %w", b.name, err)
	}
	o, err := parseOverride(m)
	o.read = readings.Add(1)
	return o, err
}

func parseOverride(m map[string]string) (Override, error) {
	var o Override
	o.Changes, _ = strconv.ParseInt(m["n"], 10, 64)
	if at, err := strconv.ParseInt(m["at"], 10, 64); err == nil && at > 0 {
		o.At = time.UnixMicro(at)
	}
	o.Partitions, _ = strconv.ParseInt(m["pn"], 10, 64)
	if s := m["lim"]; s != "" {
		ls, err := decodeLimits(s)
		if err != nil {
			return Override{}, fmt.Errorf("override limits: %w", err)
		}
		o.Limits = ls
	}
	for k, v := range m {
		if !strings.HasPrefix(k, "e:") {
			continue
		}
		f := strings.SplitN(v, " ", 3)
		if len(f) != 3 {
			continue
		}
		gen, err1 := strconv.ParseInt(f[0], 10, 64)
		ended, err2 := strconv.ParseInt(f[1], 10, 64)
		ls, err3 := decodeLimits(f[2])
		if errors.Join(err1, err2, err3) != nil {
			continue
		}
		o.Earlier = append(o.Earlier, Phase{Generation: gen, Limits: ls, Ended: time.UnixMicro(ended), field: k})
	}
	slices.SortFunc(o.Earlier, func(a, c Phase) int { return c.Ended.Compare(a.Ended) })
	return o, nil
}

// overrideScript makes one change of a bucket's limits, if no other
// change came first.
//
//	KEYS[1] -> override record (opKey)
//	KEYS[2] -> the dyn hash, whose 'n' the booking scripts check: it is
//	           the count of changes, so that from this call on nothing is
//	           booked under limits that follow an older one (ReasonStale)
//	ARGV[1] -> now override in µs ("" = Redis TIME)
//	ARGV[2] -> changes the caller read (n); another count: no change
//	ARGV[3] -> the new limits (encodeLimits), "" for the configured ones
//	ARGV[4] -> the phase replaced: "generation limits"
//	ARGV[5] -> announcement channel
//	ARGV[6] -> bucket name
//	ARGV[7] -> the dyn hash's least lifetime ms
//	ARGV[8..] -> fields of old phases to drop
//
// Returns {1 changed or 0 lost a race, now, changes}.
var overrideScript = script.New(`
local now = shaper_now(ARGV[1])
local n = tonumber(redis.call('HGET', KEYS[1], 'n') or '0')
if n ~= tonumber(ARGV[2]) then
  return {0, now, n}
end
local gen, lim = string.match(ARGV[4], '^(%d+) (.*)$')
redis.call('HSET', KEYS[1], 'n', n + 1, 'at', shaper_int(now), 'e:' .. n, gen .. ' ' .. shaper_int(now) .. ' ' .. lim)
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], 'lim')
else
  redis.call('HSET', KEYS[1], 'lim', ARGV[3])
end
for i = 8, #ARGV do
  redis.call('HDEL', KEYS[1], ARGV[i])
end
redis.call('HSET', KEYS[2], 'n', n + 1)
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[7]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[7])
end
redis.call('PUBLISH', ARGV[5], ARGV[6])
return {1, now, n + 1}
`)

// PutLimits replaces the bucket's limits, for every process that paces it
// (each applies them within ApplyWithin, see Follow), until ResetLimits.
// The limits are checked as Pacer.Bucket checks them. It returns the
// override now in force.
func (b *Bucket) PutLimits(ctx context.Context, limits []Limit) (Override, error) {
	if _, err := b.newSet(limits, 1, nil, 0); err != nil {
		return Override{}, fmt.Errorf("limits of %s: %w", b.name, err)
	}
	return b.change(ctx, encodeLimits(limits))
}

// ResetLimits puts the configured limits back in force for every process;
// it changes nothing when they are in force already.
func (b *Bucket) ResetLimits(ctx context.Context) (Override, error) {
	return b.change(ctx, "")
}

func (b *Bucket) change(ctx context.Context, next string) (Override, error) {
	for try := 0; try < 5; try++ {
		o, err := b.ReadOverride(ctx)
		if err != nil {
			return Override{}, err
		}
		if next == "" && o.Limits == nil {
			return o, nil
		}
		cur, gen := b.cfg.Limits, int64(0)
		if o.Limits != nil {
			cur, gen = o.Limits, o.Changes
		}
		args := []any{script.NowArg(b.p.now), o.Changes, next, strconv.FormatInt(gen, 10) + " " + encodeLimits(cur),
			b.p.limitsChannel(), b.name, dynTTL.Milliseconds()}
		// Old phases go once long past any drain, and beyond maxPhases.
		for i, ph := range o.Earlier {
			if i >= maxPhases-1 || (!o.At.IsZero() && o.At.Sub(ph.Ended) > phaseMemory) {
				args = append(args, ph.field)
			}
		}
		v, err := script.Run(ctx, b.p.rdb, "leaky.override", overrideScript, []string{b.opKey(), b.dynKey()}, args...)
		if err != nil {
			return Override{}, fmt.Errorf("change limits of %s: %w", b.name, err)
		}
		out, err := script.Ints(v, 3)
		if err != nil {
			return Override{}, fmt.Errorf("change limits of %s: %w", b.name, err)
		}
		if out[0] == 1 {
			if err := b.bumpChanges(ctx); err != nil {
				return Override{}, err
			}
			return b.ReadOverride(ctx)
		}
	}
	return Override{}, fmt.Errorf("change limits of %s: %w", b.name, ErrOverrideConflict)
}

// Apply makes the bucket pace at what o says at now (see Override.Pace):
// in this process, without writing to Redis. It reports whether that
// changed the limits paced at, and when to apply again (a draining phase
// ends; zero for never). An o read before one applied already (a reading
// that a Refresh overtook) counts as that one. Readings are ordered by
// when this process read them, not by their count of changes, which may
// go back if Redis loses its last writes (a failover): the latest
// reading is what the scripts compare against.
func (b *Bucket) Apply(o Override, now time.Time) (bool, time.Time, error) {
	b.applyMu.Lock()
	defer b.applyMu.Unlock()
	if b.applied != nil && o.read < b.applied.read {
		o = *b.applied
	}
	limits, gen, draining, until := o.Pace(b.cfg.Limits, b.cfg.MaxWait, b.cfg.Guard, now)
	s := b.cur()
	pov := o.Partitions > 0
	b.applied = &o
	if s.gen == gen && slices.Equal(s.current(), limits) && samePhases(s.draining, draining) && s.pov == pov && s.changes == o.Changes {
		return false, until, nil
	}
	ns, err := b.newSet(limits, gen, draining, s.version+1)
	if err != nil {
		return false, until, fmt.Errorf("bucket %s: %w", b.name, err)
	}
	ns.pov, ns.changes = pov, o.Changes
	b.set.Store(ns)
	return true, until, nil
}

// Refresh reads what an operator has set on the bucket and applies it
// (Apply, at the pacer's clock), after a booking under the limits of
// BookingVersion version answered ReasonStale: an operator changed them
// and this process had not heard yet (the announcement lost, or not
// arrived). Callers that all saw the same stale version read once: a
// caller whose version was replaced meanwhile returns at once. A change
// it applies is told to Follow's changed, as Follow's own are.
func (b *Bucket) Refresh(ctx context.Context, version uint64) error {
	b.refreshMu.Lock()
	defer b.refreshMu.Unlock()
	if b.cur().version != version {
		return nil
	}
	o, err := b.ReadOverride(ctx)
	if err != nil {
		return err
	}
	now := time.Now
	if b.p.now != nil {
		now = b.p.now
	}
	ch, _, err := b.Apply(o, now())
	if err != nil {
		return err
	}
	if ch {
		b.p.hooks.changed(b)
	}
	return nil
}

// changeHooks are the changed functions of the Follows running, by
// bucket, so that a change Refresh applies is told as Follow's are.
type changeHooks struct {
	mu   sync.Mutex
	next int
	fs   map[*Bucket]map[int]func(*Bucket)
}

func (h *changeHooks) add(bs []*Bucket, f func(*Bucket)) (remove func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.next++
	id := h.next
	if h.fs == nil {
		h.fs = map[*Bucket]map[int]func(*Bucket){}
	}
	for _, b := range bs {
		if h.fs[b] == nil {
			h.fs[b] = map[int]func(*Bucket){}
		}
		h.fs[b][id] = f
	}
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, b := range bs {
			delete(h.fs[b], id)
		}
	}
}

func (h *changeHooks) changed(b *Bucket) {
	h.mu.Lock()
	fs := make([]func(*Bucket), 0, len(h.fs[b]))
	for _, f := range h.fs[b] {
		fs = append(fs, f)
	}
	h.mu.Unlock()
	for _, f := range fs {
		f(b)
	}
}

func samePhases(a, c []Phase) bool {
	return slices.EqualFunc(a, c, func(x, y Phase) bool {
		return x.Generation == y.Generation && x.Ended.Equal(y.Ended) && slices.Equal(x.Limits, y.Limits)
	})
}

// Follow keeps buckets pacing at what operators set, until ctx ends: it
// applies a change as soon as it is announced on LimitsChannel, and
// besides, every ApplyWithin/2, reads the fleet's count of changes (one
// GET, whatever the number of buckets: an idle fleet pays next to nothing)
// and re-reads the buckets' overrides when it moved, in case an
// announcement was lost; and every fullReread it re-reads them all. A
// phase whose drain the scripts have ended is dropped from their
// arguments on the local clock, clockMargin later. changed, if not nil, is
// called after a bucket's limits changed, by Follow or by a Refresh while
// Follow runs. Run it in a
// goroutine you own; it needs a client that can Subscribe. Errors reading
// Redis are retried at the next tick; it returns nil when ctx ends.
func (p *Pacer) Follow(ctx context.Context, buckets []*Bucket, changed func(*Bucket)) error {
	sub, ok := p.rdb.(interface {
		Subscribe(ctx context.Context, channels ...string) *redis.PubSub
	})
	if !ok {
		return fmt.Errorf("leaky: client %T cannot subscribe to limit announcements", p.rdb)
	}
	byName := map[string]*Bucket{}
	known := map[*Bucket]Override{}
	for _, b := range buckets {
		byName[b.name] = b
	}
	now := time.Now
	if p.now != nil {
		now = p.now
	}
	if changed != nil {
		for _, b := range buckets {
			defer b.p.hooks.add([]*Bucket{b}, changed)()
		}
	}
	apply := func(b *Bucket) {
		// Phases are dropped on this clock, clockMargin after the scripts
		// stopped enforcing them on Redis's.
		if ch, _, err := b.Apply(known[b], now()); err == nil && ch {
			b.p.hooks.changed(b)
		}
	}
	read := func(b *Bucket) bool {
		o, err := b.ReadOverride(ctx)
		if err != nil {
			return false
		}
		known[b] = o
		apply(b)
		return true
	}
	ps := sub.Subscribe(ctx, p.limitsChannel())
	defer ps.Close()
	msgs := ps.Channel()
	tick := time.NewTicker(ApplyWithin / 2)
	defer tick.Stop()
	seen, full := "", time.Time{}
	readAll := func() {
		v, err := script.Run(ctx, p.rdb, "leaky.changes", changesScript, []string{p.changesKey()})
		if err != nil {
			return
		}
		cur := fmt.Sprint(v)
		if cur == seen && time.Since(full) < fullReread {
			for _, b := range buckets {
				apply(b)
			}
			return
		}
		all := true
		for _, b := range buckets {
			all = read(b) && all
		}
		if all {
			seen, full = cur, time.Now()
		}
	}
	readAll()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-msgs:
			if !ok {
				return nil
			}
			if b := byName[m.Payload]; b != nil {
				read(b)
			}
		case <-tick.C:
			readAll()
		}
	}
}

// fullReread is how often Follow reads every override even though the
// fleet's count of changes did not move (it is bumped after the change,
// by a second command that could fail).
const fullReread = 5 * time.Minute

// changesKey counts the changes of limits of every bucket under the
// prefix: Follow's cheap look. It has no TTL, as the records it counts;
// it is one small integer.
func (p *Pacer) changesKey() string { return p.prefix + ":leaky:limits:changes" }

// changesScript reads or bumps the count of changes.
//
//	KEYS[1] -> the count (changesKey)
//	ARGV[1] -> "1" to bump it, absent to read it
//
// Returns the count.
var changesScript = script.New(`
if ARGV[1] == '1' then
  return redis.call('INCR', KEYS[1])
end
return tonumber(redis.call('GET', KEYS[1]) or '0')
`)

// bumpChanges tells every Follow that some override changed. It is a
// command of its own, since the count lives outside the bucket's slot.
func (b *Bucket) bumpChanges(ctx context.Context) error {
	if _, err := script.Run(ctx, b.p.rdb, "leaky.changes", changesScript, []string{b.p.changesKey()}, "1"); err != nil {
		return fmt.Errorf("announce the change of limits of %s: %w", b.name, err)
	}
	return nil
}

// partitionScript sets or clears one partition's own limits.
//
//	KEYS[1] -> partitions' overrides (povKey)
//	KEYS[2] -> override record (opKey)
//	ARGV[1] -> partition
//	ARGV[2] -> its limits (encodePartition), "" to clear
//	ARGV[3] -> announcement channel
//	ARGV[4] -> bucket name
//
// Returns 1 if the partition's limits changed.
var partitionScript = script.New(`
local changed = 0
if ARGV[2] == '' then
  changed = redis.call('HDEL', KEYS[1], ARGV[1])
elseif redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  changed = 1
end
if changed == 1 then
  redis.call('HSET', KEYS[2], 'pn', redis.call('HLEN', KEYS[1]))
  redis.call('PUBLISH', ARGV[3], ARGV[4])
end
return changed
`)

// PutPartitionLimits gives one partition limits of its own in place of
// whatever the caller's config gives it, for every process at once: the
// booking script reads them from Redis on every take of the partition's
// jobs (see BookingLua), once the processes know the bucket has any
// (within ApplyWithin of the first). The limits are shaped under the
// bucket's guard.
func (b *Bucket) PutPartitionLimits(ctx context.Context, partition string, limits []Limit) error {
	if partition == "" {
		return errors.New("partition limits: no partition")
	}
	if len(limits) == 0 {
		return errors.New("partition limits: at least one limit is required")
	}
	v, err := b.encodePartition(limits)
	if err != nil {
		return fmt.Errorf("limits of partition %s: %w", partition, err)
	}
	return b.setPartition(ctx, partition, v)
}

// ResetPartitionLimits takes a partition's own limits away again.
func (b *Bucket) ResetPartitionLimits(ctx context.Context, partition string) error {
	return b.setPartition(ctx, partition, "")
}

func (b *Bucket) setPartition(ctx context.Context, partition, v string) error {
	ch, err := script.Run(ctx, b.p.rdb, "leaky.partition", partitionScript, []string{b.povKey(), b.opKey()},
		partition, v, b.p.limitsChannel(), b.name)
	if err != nil {
		return fmt.Errorf("limits of %s partition %s: %w", b.name, partition, err)
	}
	if ch == int64(1) {
		return b.bumpChanges(ctx)
	}
	return nil
}

// HasPartitionOverrides reports whether, as this process last heard
// (Apply, Follow), some partition of the bucket has limits an operator
// set.
func (b *Bucket) HasPartitionOverrides() bool { return b.cur().pov }

// ReadPartitionLimits is the partition's own limits, if an operator set
// them.
func (b *Bucket) ReadPartitionLimits(ctx context.Context, partition string) ([]Limit, bool, error) {
	h, ok := b.p.rdb.(redis.Cmdable)
	if !ok {
		return nil, false, fmt.Errorf("leaky: client %T cannot read hashes", b.p.rdb)
	}
	v, err := h.HGet(ctx, b.povKey(), partition).Result()
	if errors.Is(err, redis.Nil) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("limits of %s partition %s: %w", b.name, partition, err)
	}
	ls, err := decodePartition(v)
	return ls, err == nil, err
}
