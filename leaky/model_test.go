package leaky

import (
	"github.com/shaperhq/shaper/internal/gcra"
)

// model is the pure-Go twin of the bucket scripts: the same decisions from
// the same state at the same now. The property test drives it and Redis with
// one sequence of operations and demands identical answers.
//
// The model keeps no TTLs. A key that Redis expired and a stale value (a TAT
// or block end at or before now) decide alike, so the model simply keeps the
// stale value, and the test compares "before" TATs only when they are in the
// future.
type model struct {
	blockUntil  int64
	blockReason string
	leases      map[string]int64
	tats        map[string]int64
}

func newModel() *model {
	return &model{leases: map[string]int64{}, tats: map[string]int64{}}
}

type modelLimit struct {
	key    string
	params gcra.Params
	cost   int64
}

// reserve mirrors reserveScript and returns its reply.
func (m *model) reserve(now, maxWait int64, lease string, conc int, leaseTTL int64, limits []modelLimit) []int64 {
	slot, reason, binding := now, int64(codeNone), int64(0)
	if b := m.blockUntil; b > slot {
		slot, reason = b, codeBlocked
	}
	prev := make([]int64, len(limits))
	for i, l := range limits {
		prev[i] = m.tats[l.key]
		if at := gcra.Earliest(prev[i], now, l.params, l.cost); at > slot {
			slot, reason, binding = at, codeLimit, int64(i+1)
		}
	}
	out := []int64{0, 0, reason, binding, now}
	if slot-now > maxWait {
		out[1] = slot - now - maxWait
		return out
	}
	if lease != "" {
		for id, exp := range m.leases {
			if exp <= now {
				delete(m.leases, id)
			}
		}
		if _, held := m.leases[lease]; !held && len(m.leases) >= conc {
			first := int64(-1)
			for _, exp := range m.leases {
				if first < 0 || exp < first {
					first = exp
				}
			}
			out[1], out[2], out[3] = first-now, codeConcurrency, 0
			return out
		}
		m.leases[lease] = slot + leaseTTL
	}
	for i, l := range limits {
		next := gcra.Take(prev[i], slot, l.params, l.cost)
		m.tats[l.key] = next
		out = append(out, prev[i], next)
	}
	out[0], out[1] = 1, slot-now
	return out
}

// cancel mirrors cancelScript.
func (m *model) cancel(now int64, lease string, slot int64, keys []string, tats []int64) int64 {
	if lease != "" {
		delete(m.leases, lease)
	}
	if now >= slot {
		return 0
	}
	var restored int64
	for i, k := range keys {
		prev, next := tats[2*i], tats[2*i+1]
		if m.tats[k] == next {
			if prev > now {
				m.tats[k] = prev
			} else {
				delete(m.tats, k)
			}
			restored++
		}
	}
	return restored
}

// block mirrors blockScript.
func (m *model) block(now, d int64, reason string) int64 {
	want := now + d
	if m.blockUntil >= want {
		return m.blockUntil
	}
	m.blockUntil, m.blockReason = want, reason
	return want
}
