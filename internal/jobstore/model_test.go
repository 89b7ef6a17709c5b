package jobstore

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
)

// pickModel is the take's pick order in pure Go: start-time fair queuing
// between fairness keys (each send moves a key on by 1/weight), the same
// between the lanes of a key, then the partition that became ready first,
// then the oldest job (FIFO). It models an upstream whose own limits never
// stop a take and that has no partition limits, the order the take keeps
// when nothing holds a job back; what holds jobs back has its own tests.
//
// Its structures are the script's sorted sets, kept the same lazy way (a
// lane whose flows emptied keeps its place until the take next reaches
// it), with the scores Redis holds: a set's virtual time is its lowest
// score, and a set that holds one member before and after a take keeps its
// score (a partition's, when not later than now). Scores are doubles both
// sides: Redis passes a Lua number to a command in a form that reads back
// exactly, so ties break alike.
type pickModel struct {
	u        shaper.Upstream
	fair     map[string]float64            // fk -> virtual start
	lanes    map[string]map[string]float64 // fk -> lane -> virtual start
	ready    map[string]map[string]int64   // lane|fk -> partition -> µs ready
	flows    map[string][]string           // lane|fk|pk -> ids, oldest first
	weights  map[string]int
	lweights map[string]int
}

func newPickModel(u shaper.Upstream) *pickModel {
	return &pickModel{u: u, fair: map[string]float64{},
		lanes: map[string]map[string]float64{}, ready: map[string]map[string]int64{},
		flows: map[string][]string{}, weights: u.Fairness.Weights, lweights: u.Lanes}
}

// lowest is the member with the lowest score, ties by member, as ZRANGE
// orders a sorted set.
func lowest[S cmp.Ordered](m map[string]S) string {
	var best string
	first := true
	for k, s := range m {
		if first || s < m[best] || s == m[best] && k < best {
			best, first = k, false
		}
	}
	return best
}

func (m *pickModel) enqueue(id, lane, fk, pk string, now int64) {
	g := lane + "|" + fk + "|" + pk
	m.flows[g] = append(m.flows[g], id)
	rk := lane + "|" + fk
	if m.ready[rk] == nil {
		m.ready[rk] = map[string]int64{}
	}
	if _, ok := m.ready[rk][pk]; !ok {
		m.ready[rk][pk] = now
	}
	if m.lanes[fk] == nil {
		m.lanes[fk] = map[string]float64{}
	}
	if _, ok := m.lanes[fk][lane]; !ok {
		m.lanes[fk][lane] = virtualTime(m.lanes[fk])
	}
	if _, ok := m.fair[fk]; !ok {
		m.fair[fk] = virtualTime(m.fair)
	}
}

// virtualTime is a set's lowest score, 0 for none.
func virtualTime(m map[string]float64) float64 {
	if len(m) == 0 {
		return 0
	}
	return m[lowest(m)]
}

// sole is a set's one member and its score, if it holds one.
type sole[S any] struct {
	m     map[string]S
	k     string
	score S
}

func soles[S any](sets ...map[string]S) []sole[S] {
	var out []sole[S]
	for _, m := range sets {
		if len(m) == 1 {
			for k, s := range m {
				out = append(out, sole[S]{m, k, s})
			}
		}
	}
	return out
}

// keep puts back the score of each set that held one member before the
// take and still does (unless ok says not).
func keep[S any](before []sole[S], ok func(S) bool) {
	for _, s := range before {
		if cur, in := s.m[s.k]; in && len(s.m) == 1 && ok(cur) {
			s.m[s.k] = s.score
		}
	}
}

func (m *pickModel) retire(fk, lane string) {
	delete(m.lanes[fk], lane)
	if len(m.lanes[fk]) == 0 {
		delete(m.lanes, fk)
		delete(m.fair, fk)
	}
}

func weight(w map[string]int, k string) float64 {
	if n, ok := w[k]; ok && n > 0 {
		return float64(n)
	}
	return 1
}

func (m *pickModel) take(n int, now int64) []string {
	vsets := []map[string]float64{m.fair}
	for _, l := range m.lanes {
		vsets = append(vsets, l)
	}
	var tsets []map[string]int64
	for _, r := range m.ready {
		tsets = append(tsets, r)
	}
	vs, ts := soles(vsets...), soles(tsets...)
	defer func() {
		keep(vs, func(float64) bool { return true })
		keep(ts, func(t int64) bool { return t <= now })
	}()
	var out []string
	for len(out) < n && len(m.fair) > 0 {
		fk := lowest(m.fair)
		s1 := m.fair[fk]
		if len(m.lanes[fk]) == 0 {
			delete(m.fair, fk)
			continue
		}
		lane := lowest(m.lanes[fk])
		s2 := m.lanes[fk][lane]
		rk := lane + "|" + fk
		if len(m.ready[rk]) == 0 {
			m.retire(fk, lane)
			continue
		}
		pk := lowest(m.ready[rk])
		g := rk + "|" + pk
		id := m.flows[g][0]
		m.flows[g] = m.flows[g][1:]
		if len(m.flows[g]) == 0 {
			delete(m.flows, g)
			delete(m.ready[rk], pk)
		} else {
			m.ready[rk][pk] = now
		}
		m.fair[fk] = s1 + 1/weight(m.weights, fk)
		m.lanes[fk][lane] = s2 + 1/weight(m.lweights, lane)
		out = append(out, id)
	}
	return out
}

// TestPickOrderMatchesModel runs random enqueues and takes against Redis
// and pickModel and compares the ids each take gives, in order: FIFO
// within a flow, fair share by weight between tenants (or partitions),
// lanes by weight within a share, partitions by when they became ready.
func TestPickOrderMatchesModel(t *testing.T) {
	seeds := 40
	if testing.Short() {
		seeds = 12
	}
	for seed := range seeds {
		checkPickOrder(t, seed, []string{"a", "b", "c"}, []string{"", "p1", "p2", "p3"}, 150, 3, 5)
	}
}

// TestPickOrderMatchesModelPastTheView: with more fairness keys (and
// partitions) than a take holds of a sorted set at once (VIEW in
// take.lua), and takes long enough to go past them, the order is the
// model's still.
func TestPickOrderMatchesModelPastTheView(t *testing.T) {
	var tenants, parts []string
	for i := range 40 {
		tenants = append(tenants, fmt.Sprintf("t%02d", i))
		parts = append(parts, fmt.Sprintf("p%02d", i))
	}
	seeds := 6
	if testing.Short() {
		seeds = 3
	}
	for seed := range seeds {
		checkPickOrder(t, seed, tenants, append([]string{""}, parts...), 400, 10, 30)
	}
}

// checkPickOrder is one seed of the model test: ops random enqueues (of
// tenants and partitions) and takes of up to most jobs, one take in odds.
func checkPickOrder(t *testing.T, seed int, tenants, parts []string, ops, odds, most int) {
	t.Helper()
	rdb := srv.Client(t)
	ctx := context.Background()
	{
		rng := rand.New(rand.NewPCG(uint64(seed), 17))
		u := shaper.Upstream{Name: fmt.Sprintf("model-%d-%d", time.Now().UnixNano()%1e6, seed),
			Limits: []leaky.Limit{leaky.PerSecond(1000000)},
			Lanes:  map[string]int{"default": 1, "fast": 1 + rng.IntN(3), "bulk": 1}}
		u.Fairness.By = []string{shaper.FairByTenant, shaper.FairByPartition, shaper.FairByNone}[seed%3]
		u.Fairness.Weights = map[string]int{tenants[0]: 1, tenants[1]: 1 + rng.IntN(3), parts[1]: 2}
		u = u.WithDefaults()
		b, err := leaky.New(rdb, leaky.Config{}).Bucket(QueueName(u.Name), leaky.BucketConfig{Limits: u.Limits, Guard: u.Guard})
		if err != nil {
			t.Fatal(err)
		}
		s := For("", u.Name)
		tk, err := NewTaker(rdb, s, TakerConfig{Upstream: u, Bucket: b, Lookahead: time.Second, Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		m := newPickModel(u)
		now := time.Now().UnixMicro()
		var log []string
		for op := range ops {
			now += 1000
			clock := strconv.FormatInt(now, 10)
			if rng.IntN(odds) > 0 {
				id := fmt.Sprintf("j%03d", op)
				tenant := tenants[rng.IntN(len(tenants))]
				lane := []string{"default", "fast", "bulk"}[rng.IntN(3)]
				part := parts[rng.IntN(len(parts))]
				fk := FairKey(u, tenant, part)
				msg := Message{Type: "http", ID: id, Queue: s.Queue}
				e := Entry{ID: id, Lane: lane, FairKey: fk, Partition: part, Msg: msg.Marshal()}
				if n, err := s.enqueue(ctx, rdb, e, "", clock); err != nil || n != 1 {
					t.Fatalf("seed %d: enqueue %s: got %d, %v; want 1, nil", seed, id, n, err)
				}
				m.enqueue(id, lane, fk, part, now)
				log = append(log, fmt.Sprintf("enqueue %s %s/%s/%s", id, tenant, lane, part))
				continue
			}
			n := 1 + rng.IntN(most)
			got, err := tk.take(ctx, n, clock)
			if err != nil {
				t.Fatalf("seed %d: take: %v", seed, err)
			}
			var ids []string
			for _, j := range got.Jobs {
				ids = append(ids, j.ID)
			}
			want := m.take(n, now)
			log = append(log, fmt.Sprintf("take %d: %v", n, ids))
			if !slices.Equal(ids, want) {
				t.Fatalf("seed %d (fairness by %s, weights %v, lanes %v): take %d got %v, want %v; ops:\n%s",
					seed, u.Fairness.By, u.Fairness.Weights, u.Lanes, n, ids, want, strings.Join(log, "\n"))
			}
		}
	}
}
