package window

import (
	"math/bits"
	"sort"
)

// The pure-Go twins of the scripts in lua.go, with time passed in: the
// reference the scripts are tested against, operation for operation. All
// times and durations are integer microseconds, as in the scripts.

// decision is a script's reply.
type decision struct {
	allowed    bool
	remaining  int64
	retryAfter int64
	resetAfter int64
}

// counterState is the hash a fixed window or sliding window counter keeps
// per key; ok is false while the key does not exist. A fixed window leaves
// prev at zero.
type counterState struct {
	ok    bool
	start int64 // w
	cur   int64 // c
	prev  int64 // p
}

// mulDiv is exact ⌊a·b/c⌋ and its remainder for a, b >= 0 and b <= c, like
// window_muldiv in Lua.
func mulDiv(a, b, c int64) (q, r int64) {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	uq, ur := bits.Div64(hi, lo, uint64(c))
	return int64(uq), int64(ur)
}

// windowStart is the start of the clock-aligned window holding now,
// flooring as shaper_idiv does.
func windowStart(now, per int64) int64 {
	r := now % per
	if r < 0 {
		r += per
	}
	return now - r
}

func fixedWindowModel(st counterState, now, per, rate, n int64) (decision, counterState) {
	if st.ok && now < st.start {
		now = st.start
	}
	start := windowStart(now, per)
	var count int64
	if st.ok && st.start >= start {
		count = st.cur
	}
	reset := start + per - now
	if count+n > rate {
		return decision{remaining: max(rate-count, 0), retryAfter: reset, resetAfter: reset}, st
	}
	count += n
	return decision{allowed: true, remaining: rate - count, resetAfter: reset},
		counterState{ok: true, start: start, cur: count}
}

// slidingLogModel keeps the log as sorted scores; the members' names only
// matter to Redis. It never changes log in place, so callers may probe.
func slidingLogModel(log []int64, now, per, rate, n int64) (decision, []int64) {
	cut := sort.Search(len(log), func(i int) bool { return log[i] > now-per })
	log = log[cut:]
	count := int64(len(log))
	if count+n > rate {
		k := count + n - rate
		return decision{
			remaining:  max(rate-count, 0),
			retryAfter: log[k-1] + per - now,
			resetAfter: log[len(log)-1] + per - now,
		}, log
	}
	at := sort.Search(len(log), func(i int) bool { return log[i] > now })
	next := make([]int64, 0, len(log)+int(n))
	next = append(next, log[:at]...)
	for range n {
		next = append(next, now)
	}
	next = append(next, log[at:]...)
	return decision{allowed: true, remaining: rate - count - n, resetAfter: next[len(next)-1] + per - now}, next
}

func slidingWindowModel(st counterState, now, per, rate, n int64) (decision, counterState) {
	if st.ok && now < st.start {
		now = st.start
	}
	start := windowStart(now, per)
	elapsed := now - start
	var cur, prev int64
	if st.ok {
		switch {
		case st.start >= start:
			cur, prev = st.cur, st.prev
		case st.start >= start-per:
			prev = st.cur
		}
	}
	var weighted int64
	if prev > 0 {
		q, r := mulDiv(prev, per-elapsed, per)
		weighted = q
		if r > 0 {
			weighted++
		}
	}
	resetAfter := func(c int64) int64 {
		switch {
		case c > 0:
			return start + 2*per - now
		case prev > 0:
			return start + per - now
		}
		return 0
	}
	if weighted+cur+n > rate {
		var retry int64
		if room := rate - cur - n; room >= 0 {
			q, _ := mulDiv(per, room, prev)
			retry = per - q - elapsed
		} else {
			q, _ := mulDiv(per, rate-n, cur)
			retry = 2*per - q - elapsed
		}
		return decision{remaining: max(rate-weighted-cur, 0), retryAfter: retry, resetAfter: resetAfter(cur)}, st
	}
	cur += n
	return decision{allowed: true, remaining: rate - weighted - cur, resetAfter: resetAfter(cur)},
		counterState{ok: true, start: start, cur: cur, prev: prev}
}
