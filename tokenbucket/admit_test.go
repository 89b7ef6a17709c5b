package tokenbucket

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/shaperhq/shaper/internal/gcra"
	"github.com/shaperhq/shaper/internal/script"
)

// admitScript decides a batch's requests through AdmitLua, as a script of
// another package does: every bucket read in one MGET, its requests
// decided in order, each bucket written once after its last allowed one.
//
//	KEYS[i] -> bucket i
//	ARGV[1..4] -> now override ("" = Redis TIME), interval, capacity, the
//	  request count r; ARGV[5..4+2r] -> each request's bucket index and cost
//
// Returns each request's level, as tb_admit answered it.
var admitScript = script.New(AdmitLua(), `
local now = shaper_now(ARGV[1])
local interval, capacity = tonumber(ARGV[2]), tonumber(ARGV[3])
local vals = redis.call('MGET', unpack(KEYS))
local tats, out = {}, {}
for i = 1, #KEYS do tats[i] = tonumber(vals[i]) end
local written = {}
for j = 1, tonumber(ARGV[4]) do
  local k, cost = tonumber(ARGV[3 + 2 * j]), tonumber(ARGV[4 + 2 * j])
  local level, tat = tb_admit(tats[k], now, interval, capacity, cost)
  if tat then tats[k], written[k] = tat, true end
  out[j] = level
end
for k in pairs(written) do tb_keep(KEYS[k], tats[k], now, interval) end
return out
`)

// TestAdmitLuaMatchesModel plays random sequences of batches through a
// script that decides them with AdmitLua and through Local, and requires
// the same results, as TestMatchesModel does for the limiter's own
// scripts; every key written expires within the bucket's span and one
// interval, as theirs do.
func TestAdmitLuaMatchesModel(t *testing.T) {
	noLeaks(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(uint64(seed), 1))
	for round := range 20 {
		l := Limit{Capacity: 1 + r.Int64N(20), Refill: 1 + r.Int64N(60), Per: time.Hour * time.Duration(1+r.IntN(3))}
		clock := newFakeClock()
		lim := newLimiter(t, rdb, l, Config{Now: clock.Now})
		loc := NewLocal(l, clock.Now)
		p := l.params()
		for i, o := range randomOps(r, l, 100) {
			clock.Advance(o.advance)
			var keys []string
			index := map[string]int{}
			var adms []Admission
			args := []any{"", p.Interval, p.Capacity, len(o.reqs)}
			for _, q := range o.reqs {
				a, err := lim.Admission(q.key, q.cost)
				if err != nil {
					t.Fatal(err)
				}
				if _, ok := index[a.Key]; !ok {
					keys = append(keys, a.Key)
					index[a.Key] = len(keys)
				}
				args[0] = a.Clock()
				args = append(args, index[a.Key], a.Cost)
				adms = append(adms, a)
			}
			v, err := script.Run(ctx, rdb, "admit", admitScript, keys, args...)
			if err != nil {
				t.Fatal(err)
			}
			levels, err := script.Ints(v, len(o.reqs))
			if err != nil {
				t.Fatal(err)
			}
			for j, q := range o.reqs {
				want, err := loc.Allow(ctx, q.key, q.cost)
				if err != nil {
					t.Fatal(err)
				}
				if got := adms[j].Result(levels[j]); got != want {
					t.Fatalf("round %d (%v) step %d request %d (%s, cost %d): got %+v through AdmitLua, want %+v from the model",
						round, l, i, j, q.key, q.cost, got, want)
				}
			}
			bound := gcra.CeilDiv(p.Span()+p.Interval, 1000)
			for _, k := range keys {
				ttl, err := rdb.PTTL(ctx, k).Result()
				if err != nil {
					t.Fatal(err)
				}
				// -2: never written (every request on it denied, or none
				// allowed since it expired, which the hour-long
				// intervals here rule out).
				if ttl != -2*time.Nanosecond && (ttl <= 0 || ttl.Milliseconds() > bound) {
					t.Fatalf("round %d step %d: key %s has PTTL %v, want in (0, %dms]", round, i, k, ttl, bound)
				}
			}
		}
	}
}
