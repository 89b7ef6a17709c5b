package fakeupstream

import (
	"sort"
	"time"
)

// The limiters here are in-process on purpose: the fake upstream is one
// process, so its counters need no Redis. Time is a parameter, measured as
// the time since the server started, so tests drive them without sleeping.
//
// Each limiter answers in two steps, check then take, so that the server can
// hold one lock, check every limit a request is subject to, and take from
// all of them only when all allow it: a rejected request consumes nothing.
//
// Concurrent requests read the clock before they take the server's lock, so
// a limiter can see a request slightly older than one it already counted.
// Each algorithm copes with that explicitly (see their comments); none of
// them may admit more than its limit because of it.

// verdict is one limit's answer for n units of one key at one instant.
type verdict struct {
	ok bool
	// tooLarge reports that n exceeds what the limit can ever admit at once.
	tooLarge bool
	// limit is the most units the limit admits at once.
	limit int64
	// remaining is how many more units would be admitted now: after the
	// units were taken, when the verdict comes from take.
	remaining int64
	// retryAfter is, when !ok and !tooLarge, how long until n units fit.
	retryAfter time.Duration
	// reset is how long until the limit is back to its full allowance if
	// nothing else arrives.
	reset time.Duration
}

// limiter counts units per key.
type limiter interface {
	// check reports whether n units for key fit at time at, changing nothing.
	check(key string, at time.Duration, n int64) verdict
	// take counts n units for key at time at, whether or not they fit, and
	// reports the state afterwards. Call it only after check allowed them.
	take(key string, at time.Duration, n int64) verdict
	// sweep forgets keys that are back to their full allowance at time at,
	// so that the number of keys held stays bounded by recent activity.
	sweep(at time.Duration)
	// size is how many keys have state.
	size() int
}

func newLimiter(alg Algorithm, l Limit, start time.Time) limiter {
	switch alg {
	case FixedWindow:
		origin := time.Duration(start.UnixNano() % int64(l.Per))
		if origin < 0 {
			origin += l.Per
		}
		return &fixedWindow{limit: l, origin: origin, keys: map[string]*windowState{}}
	case TokenBucket:
		c := l.capacity(TokenBucket)
		scale := l.Per.Microseconds()
		return &tokenBucket{limit: l, capacity: c, scale: scale, full: c * scale, keys: map[string]*bucketState{}}
	case Meter:
		return &meter{limit: l, rate: l.meterRate(), burst: l.Burst * 1000, keys: map[string]*meterState{}}
	}
	return &slidingLog{limit: l, keys: map[string]*logState{}}
}

// slidingLog keeps each admitted request's arrival and cost, and admits n
// units at time a only if every window of length Per that contains a would
// then hold at most Rate units. For an arrival later than everything logged
// that is just the window (a−Per, a]; for a late-arriving older request it
// includes the windows ending at the later entries too, so the log stays
// exact over arrival times whatever the order of the server's lock.
//
// Entries older than two windows before the latest arrival are dropped, and
// an arrival older than one window before the latest is counted as if it
// arrived then (only a request stalled for a whole window between reading the
// clock and taking the lock could be), so no dropped entry is ever needed.
type slidingLog struct {
	limit Limit
	keys  map[string]*logState
}

type logEntry struct {
	at  time.Duration
	cum int64 // total cost of this entry and all before it, including dropped ones
}

type logState struct {
	entries []logEntry // sorted by at
	base    int64      // cum of the last dropped entry
	latest  time.Duration
}

// upTo is the total cost of entries at or before x.
func (s *logState) upTo(x time.Duration) int64 {
	i := sort.Search(len(s.entries), func(i int) bool { return s.entries[i].at > x })
	if i == 0 {
		return s.base
	}
	return s.entries[i-1].cum
}

// in is the total cost of entries in (lo, hi].
func (s *logState) in(lo, hi time.Duration) int64 { return s.upTo(hi) - s.upTo(lo) }

func (s *logState) last() time.Duration {
	if len(s.entries) == 0 {
		return -1 << 62
	}
	return s.entries[len(s.entries)-1].at
}

func (l *slidingLog) clamp(s *logState, at time.Duration) time.Duration {
	return max(at, s.latest-l.limit.Per)
}

func (l *slidingLog) status(s *logState, at time.Duration) verdict {
	v := verdict{limit: l.limit.Rate, remaining: max(0, l.limit.Rate-s.in(at-l.limit.Per, at))}
	if end := s.last() + l.limit.Per; end > at {
		v.reset = end - at
	}
	return v
}

func (l *slidingLog) check(key string, at time.Duration, n int64) verdict {
	s := l.keys[key]
	if s == nil {
		s = &logState{latest: at}
	}
	at = l.clamp(s, at)
	v := l.status(s, at)
	per, rate := l.limit.Per, l.limit.Rate
	if n > rate {
		v.tooLarge = true
		return v
	}
	worst := s.in(at-per, at)
	i := sort.Search(len(s.entries), func(i int) bool { return s.entries[i].at > at })
	for _, e := range s.entries[i:] {
		if e.at >= at+per {
			break
		}
		worst = max(worst, s.in(e.at-per, e.at))
	}
	if worst+n <= rate {
		v.ok = true
		return v
	}
	// n fits once enough of what is logged from a−Per on has left the
	// window: find the entry whose departure frees enough.
	floor := s.upTo(at - per)
	need := s.upTo(1<<62) - floor + n - rate
	j := sort.Search(len(s.entries), func(j int) bool { return s.entries[j].cum-floor >= need })
	v.retryAfter = s.entries[j].at + per - at
	return v
}

func (l *slidingLog) take(key string, at time.Duration, n int64) verdict {
	s := l.keys[key]
	if s == nil {
		s = &logState{latest: at}
		l.keys[key] = s
	}
	at = l.clamp(s, at)
	if n > 0 {
		i := sort.Search(len(s.entries), func(i int) bool { return s.entries[i].at > at })
		prev := s.base
		if i > 0 {
			prev = s.entries[i-1].cum
		}
		s.entries = append(s.entries, logEntry{})
		copy(s.entries[i+1:], s.entries[i:])
		s.entries[i] = logEntry{at: at, cum: prev + n}
		for j := i + 1; j < len(s.entries); j++ {
			s.entries[j].cum += n
		}
	}
	s.latest = max(s.latest, at)
	l.drop(s, s.latest-2*l.limit.Per)
	return l.status(s, at)
}

// drop forgets entries at or before x.
func (l *slidingLog) drop(s *logState, x time.Duration) {
	i := sort.Search(len(s.entries), func(i int) bool { return s.entries[i].at > x })
	if i > 0 {
		s.base = s.entries[i-1].cum
		s.entries = s.entries[i:]
	}
}

func (l *slidingLog) sweep(at time.Duration) {
	for k, s := range l.keys {
		if s.last() <= at-2*l.limit.Per {
			delete(l.keys, k)
		}
	}
}

func (l *slidingLog) size() int { return len(l.keys) }

// fixedWindow counts units per slot. Slots are aligned to the wall clock
// (multiples of Per since the Unix epoch), as real fixed-window limiters
// align them to the second or minute. The previous slot's count is kept too,
// so that a late-arriving request from just before a boundary is counted in
// the slot it arrived in; anything older is counted in the previous slot.
type fixedWindow struct {
	limit  Limit
	origin time.Duration // start's offset into its slot
	keys   map[string]*windowState
}

type windowState struct {
	slot       int64
	used, prev int64 // units in slot and in slot−1
}

func (f *fixedWindow) slotOf(at time.Duration) int64 {
	x := f.origin + at
	q := int64(x / f.limit.Per)
	if x < 0 && x%f.limit.Per != 0 {
		q--
	}
	return q
}

func (f *fixedWindow) end(slot int64) time.Duration {
	return time.Duration(slot+1)*f.limit.Per - f.origin
}

// usage is the slot a request at time at counts in and what that slot holds.
func (f *fixedWindow) usage(s *windowState, at time.Duration) (slot, used int64) {
	slot = f.slotOf(at)
	switch {
	case s == nil || slot > s.slot:
		return slot, 0
	case slot == s.slot:
		return slot, s.used
	}
	return s.slot - 1, s.prev
}

func (f *fixedWindow) status(slot, used int64, at time.Duration) verdict {
	v := verdict{limit: f.limit.Rate, remaining: max(0, f.limit.Rate-used)}
	if used > 0 {
		v.reset = f.end(slot) - at
	}
	return v
}

func (f *fixedWindow) check(key string, at time.Duration, n int64) verdict {
	s := f.keys[key]
	slot, used := f.usage(s, at)
	v := f.status(slot, used, at)
	switch {
	case n > f.limit.Rate:
		v.tooLarge = true
	case used+n <= f.limit.Rate:
		v.ok = true
	case s != nil && slot < s.slot && s.used+n > f.limit.Rate:
		// Counted in the previous slot, and the current one is full too.
		v.retryAfter = f.end(s.slot) - at
	default:
		v.retryAfter = f.end(slot) - at
	}
	return v
}

func (f *fixedWindow) take(key string, at time.Duration, n int64) verdict {
	s := f.keys[key]
	if s == nil {
		s = &windowState{slot: f.slotOf(at)}
		f.keys[key] = s
	}
	if slot := f.slotOf(at); slot > s.slot {
		if slot == s.slot+1 {
			s.prev = s.used
		} else {
			s.prev = 0
		}
		s.slot, s.used = slot, 0
	}
	slot, used := f.usage(s, at)
	if slot == s.slot {
		s.used += n
	} else {
		s.prev += n
	}
	return f.status(slot, used+n, at)
}

func (f *fixedWindow) sweep(at time.Duration) {
	now := f.slotOf(at)
	for k, s := range f.keys {
		if s.slot < now-1 || s.used == 0 && s.prev == 0 {
			delete(f.keys, k)
		}
	}
}

func (f *fixedWindow) size() int { return len(f.keys) }

// tokenBucket keeps each key's level in token·microseconds (one token is
// Per's length in microseconds), so refilling Rate tokens per Per is exact
// integer arithmetic: every elapsed microsecond adds Rate. A request older
// than the key's last update gets no refill, which is only ever stricter.
type tokenBucket struct {
	limit    Limit
	capacity int64 // tokens
	scale    int64 // token·µs per token
	full     int64 // capacity × scale
	keys     map[string]*bucketState
}

type bucketState struct {
	level int64 // token·µs
	at    int64 // µs since start of the last update
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// level is the bucket's level at µs now and the time it applies to.
func (b *tokenBucket) level(s *bucketState, now int64) (level, at int64) {
	if s == nil {
		return b.full, now
	}
	now = max(now, s.at)
	missing := b.full - s.level
	if now-s.at >= ceilDiv(missing, b.limit.Rate) {
		return b.full, now
	}
	return s.level + (now-s.at)*b.limit.Rate, now
}

func (b *tokenBucket) status(level int64) verdict {
	return verdict{
		limit:     b.capacity,
		remaining: level / b.scale,
		reset:     time.Duration(ceilDiv(b.full-level, b.limit.Rate)) * time.Microsecond,
	}
}

func (b *tokenBucket) check(key string, at time.Duration, n int64) verdict {
	level, _ := b.level(b.keys[key], at.Microseconds())
	v := b.status(level)
	switch need := n * b.scale; {
	case n > b.capacity:
		v.tooLarge = true
	case level >= need:
		v.ok = true
	default:
		v.retryAfter = time.Duration(ceilDiv(need-level, b.limit.Rate)) * time.Microsecond
	}
	return v
}

func (b *tokenBucket) take(key string, at time.Duration, n int64) verdict {
	s := b.keys[key]
	level, now := b.level(s, at.Microseconds())
	if s == nil {
		s = &bucketState{}
		b.keys[key] = s
	}
	s.level, s.at = level-n*b.scale, now
	return b.status(s.level)
}

func (b *tokenBucket) sweep(at time.Duration) {
	now := at.Microseconds()
	for k, s := range b.keys {
		if l, _ := b.level(s, now); l == b.full {
			delete(b.keys, k)
		}
	}
}

func (b *tokenBucket) size() int { return len(b.keys) }

// meter is nginx's limit_req with `burst=Burst nodelay` (burst 0 by
// default): a leaky bucket kept per key as an excess in milli-requests and
// the whole millisecond of the last accepted request. A request arriving ms
// milliseconds after it sets
//
//	excess = max(0, excess − rate×ms/1000 + 1000)
//
// with rate in milli-requests per second and integer division, and is
// refused if that exceeds burst×1000. With burst 0 a request is refused
// whenever fewer than ⌈1000/rate⌉ whole milliseconds passed since the last
// accepted one: the upstream that punishes uneven spacing. A new key's
// first request is free (excess 0), as in nginx.
//
// Like nginx the meter reads only whole milliseconds, so two requests
// 19.9ms apart may count as 19 or 20. A request that read the clock before
// the last accepted one counts as arriving in the same millisecond (nginx
// clamps a negative ms to 0 the same way), which is only ever stricter.
//
// A cost of n counts as n requests arriving in the same millisecond, the
// first of them treated as nginx treats a single request.
type meter struct {
	limit Limit
	rate  int64 // milli-requests per second, as nginx's ctx->rate
	burst int64 // milli-requests
	keys  map[string]*meterState
}

type meterState struct {
	excess int64 // milli-requests beyond the request in service
	last   int64 // ms since start of the last accepted request
}

// meterRate is the limit in milli-requests per second, truncated as nginx
// truncates "7r/m" to 116.
func (l Limit) meterRate() int64 {
	return l.Rate * 1000 * 1000 / l.Per.Milliseconds()
}

func msOf(at time.Duration) int64 {
	ms := int64(at / time.Millisecond)
	if at < 0 && at%time.Millisecond != 0 {
		ms--
	}
	return ms
}

// level is the key's level in milli-requests at millisecond now: the
// excess plus the request in service, drained by what elapsed. Zero when
// the key has no state or has drained.
func (m *meter) level(s *meterState, now int64) int64 {
	if s == nil {
		return 0
	}
	lv := s.excess + 1000
	ms := now - s.last
	if ms <= 0 {
		return lv
	}
	// rate×ms/1000 ≥ lv once ms ≥ lv×1000/rate: stop before the product
	// could overflow.
	if ms >= ceilDiv(lv*1000, m.rate) {
		return 0
	}
	return max(0, lv-m.rate*ms/1000)
}

// after is how long from at until millisecond ms begins.
func after(ms int64, at time.Duration) time.Duration {
	return max(0, time.Duration(ms)*time.Millisecond-at)
}

func (m *meter) status(s *meterState, now int64, at time.Duration) verdict {
	lv := m.level(s, now)
	v := verdict{limit: m.burst/1000 + 1, remaining: max(0, (m.burst+1000-lv)/1000)}
	if s != nil && lv > 0 {
		v.reset = after(s.last+ceilDiv((s.excess+1000)*1000, m.rate), at)
	}
	return v
}

func (m *meter) check(key string, at time.Duration, n int64) verdict {
	s := m.keys[key]
	now := msOf(at)
	v := m.status(s, now, at)
	switch {
	case n > m.burst/1000+1:
		v.tooLarge = true
	case n == 0 || m.level(s, now)+n*1000 <= m.burst+1000:
		v.ok = true
	default:
		// The level must fall to burst+1000 − n×1000: the drained amount
		// rate×ms/1000 must reach excess + n×1000 − burst.
		need := s.excess + n*1000 - m.burst
		v.retryAfter = after(s.last+ceilDiv(need*1000, m.rate), at)
	}
	return v
}

func (m *meter) take(key string, at time.Duration, n int64) verdict {
	now := msOf(at)
	s := m.keys[key]
	if n > 0 {
		lv := m.level(s, now)
		if s == nil {
			s = &meterState{last: now}
			m.keys[key] = s
		}
		s.excess = lv + (n-1)*1000
		if now > s.last {
			s.last = now
		}
	}
	return m.status(s, now, at)
}

func (m *meter) sweep(at time.Duration) {
	now := msOf(at)
	for k, s := range m.keys {
		if m.level(s, now) == 0 {
			delete(m.keys, k)
		}
	}
}

func (m *meter) size() int { return len(m.keys) }
