package leaky

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shaperhq/shaper/internal/gcra"
	"github.com/shaperhq/shaper/internal/script"
)

// A bucket's limits can change while it runs, by what the upstream says:
//
//   - Stated limits: an upstream that states its policy (RateLimit-Policy:
//     "default";q=40;w=1) gets that policy as an extra limit on requests,
//     so the bucket paces at the lower of what it was configured with and
//     what the upstream says. At most MaxStated are kept.
//   - Adaptive limits (Limit.Adaptive): Rate is a ceiling. Each pushback
//     cuts the rate paced at to AdaptCut of what it was (at most once per
//     AdaptCooldown); from there it climbs back by AdaptRise of the cut rate
//     per second (at least AdaptRiseMin of the ceiling), computed from the
//     time since the cut, so a climb costs no write.
//
// Both live in one hash per bucket (its "dyn" key), read by every script
// that books slots, so every replica paces at the same rates at once.
const (
	// MaxStated is how many stated limits a bucket keeps: the two with the
	// lowest rate per second.
	MaxStated = 2
	// AdaptCut is what a pushback leaves of an adaptive limit's rate.
	AdaptCut = 0.85
	// AdaptRise is the share of the cut rate an adaptive limit climbs back
	// by per second without pushback.
	AdaptRise = 0.03
	// AdaptRiseMin is the least it climbs by per second, as a share of
	// the ceiling, so a rate cut to the floor comes back in minutes.
	AdaptRiseMin = 0.005
	// AdaptCooldown is the least time between two cuts: the sends booked
	// before a cut still go out at the old rate, and their pushback says
	// nothing new.
	AdaptCooldown = 500 * time.Millisecond
	// dynTTL is how long the hash outlives its last write: a stated limit
	// the upstream stops stating lapses after it, and an adaptive limit has
	// long since climbed back to its ceiling.
	dynTTL = time.Hour
)

// dynLua reads a bucket's dynamic limits, for every script that books
// slots on a bucket's state (this package's, and through BookingLua
// another's). It needs script.Prelude before it and defines:
//
//	shaper_dyn_read(key) -> table of the hash's fields
//	shaper_dyn_interval(d, field, interval, now) -> an adaptive limit's interval now
//	shaper_stated(d, i) -> interval, capacity, per µs of stated limit i, or nil
var dynLua = `
local function shaper_dyn_read(key)
  local raw = redis.call('HGETALL', key)
  local d = {}
  for i = 1, #raw, 2 do d[raw[i]] = raw[i + 1] end
  return d
end

local function shaper_adapt_ratio(d, field, now)
  if field == '' then return 1 end
  local v = d[field]
  if not v then return 1 end
  local r, t = string.match(v, '^(%S+) (%S+)$')
  r, t = tonumber(r), tonumber(t)
  if not r or not t or r <= 0 then return 1 end
  r = r + math.max(` + strconv.FormatFloat(AdaptRise, 'f', -1, 64) + ` * r, ` + strconv.FormatFloat(AdaptRiseMin, 'f', -1, 64) + `) * math.max(0, now - t) / 1000000
  if r >= 1 then return 1 end
  return r
end

local function shaper_dyn_interval(d, field, interval, now)
  local r = shaper_adapt_ratio(d, field, now)
  if r >= 1 then return interval end
  return math.ceil(interval / r)
end

local function shaper_stated(d, i)
  local v = d['s' .. i]
  if not v then return nil end
  local iv, cap, per = string.match(v, '^(%d+) (%d+) (%d+)')
  if not iv then return nil end
  return tonumber(iv), tonumber(cap), tonumber(per)
end
`

// dynField is the hash field of an adaptive limit ("" for a fixed one).
func dynField(l Limit) string {
	if !l.Adaptive {
		return ""
	}
	return "a:" + limitID(l)
}

// statedParams is what a stated limit is stored as: "interval capacity
// per quota" (the scripts read the first three).
func statedParams(l Limit, guard time.Duration) string {
	p := l.Params(guard)
	return fmt.Sprintf("%d %d %d %d", p.Interval, p.Capacity, l.Per.Microseconds(), l.Rate)
}

// learnScript replaces a bucket's stated limits.
//
//	KEYS[1] -> dyn hash
//	ARGV[1] -> hash lifetime ms
//	ARGV[2..] -> MaxStated values "interval capacity per", "" for none
//
// Returns 1 if the stated limits changed, 0 if they were already so.
var learnScript = script.New(`
local changed = 0
for i = 2, #ARGV do
  local f = 's' .. (i - 1)
  local cur = redis.call('HGET', KEYS[1], f)
  if ARGV[i] == '' then
    if cur then
      redis.call('HDEL', KEYS[1], f)
      changed = 1
    end
  elseif cur ~= ARGV[i] then
    redis.call('HSET', KEYS[1], f, ARGV[i])
    changed = 1
  end
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return changed
`)

// Learn records the limits the upstream states (requests per window) as
// extra limits of the bucket, for every replica: the bucket then paces at
// the lowest of its own limits and these. Only the MaxStated with the
// lowest rate per second are kept; an empty stated drops any. It reports
// whether what Redis held changed, so that one replica in the fleet, not
// each, can say so.
func (b *Bucket) Learn(ctx context.Context, stated []Limit) (bool, error) {
	kept := make([]Limit, 0, len(stated))
	for _, l := range stated {
		l.Cost, l.Burst, l.Adaptive = "", 0, false
		if l.Validate() != nil {
			continue
		}
		kept = append(kept, l)
	}
	slices.SortStableFunc(kept, func(a, c Limit) int {
		return cmpFloat(perSecond(a), perSecond(c))
	})
	kept = slices.CompactFunc(kept, func(a, c Limit) bool { return a.Rate == c.Rate && a.Per == c.Per })
	args := []any{dynTTL.Milliseconds()}
	for i := 0; i < MaxStated; i++ {
		v := ""
		if i < len(kept) {
			v = statedParams(kept[i], b.cfg.Guard)
		}
		args = append(args, v)
	}
	v, err := script.Run(ctx, b.p.rdb, "leaky.learn", learnScript, []string{b.dynKey()}, args...)
	if err != nil {
		return false, fmt.Errorf("learn limits of %s: %w", b.name, err)
	}
	return v == int64(1), nil
}

func perSecond(l Limit) float64 { return float64(l.Rate) / l.Per.Seconds() }

func cmpFloat(a, c float64) int {
	switch {
	case a < c:
		return -1
	case a > c:
		return 1
	}
	return 0
}

// cutScript lowers every adaptive limit of a bucket after pushback.
//
//	KEYS[1] -> dyn hash
//	ARGV[1] -> now override in µs ("" = Redis TIME)
//	ARGV[2] -> hash lifetime ms
//	ARGV[3] -> cooldown µs
//	ARGV[4..] -> per adaptive limit: field, floor ratio
//
// Returns {now, cut count}.
var cutScript = script.New(dynLua, `
local now = shaper_now(ARGV[1])
local d = shaper_dyn_read(KEYS[1])
local cool = tonumber(ARGV[3])
local cuts = 0
for i = 4, #ARGV, 2 do
  local f, floor = ARGV[i], tonumber(ARGV[i + 1])
  local last = 0
  local v = d[f]
  if v then last = tonumber(string.match(v, ' (%S+)$')) or 0 end
  if now - last >= cool then
    local r = shaper_adapt_ratio(d, f, now) * `+strconv.FormatFloat(AdaptCut, 'f', -1, 64)+`
    if r < floor then r = floor end
    redis.call('HSET', KEYS[1], f, string.format('%.9g', r) .. ' ' .. shaper_int(now))
    cuts = cuts + 1
  end
end
if cuts > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return {now, cuts}
`)

// Feedback tells the bucket how the upstream answered. Pushback (a 429)
// cuts every adaptive limit to AdaptCut of its rate, at most once per
// AdaptCooldown fleet-wide, never below one unit per Per; anything else
// changes nothing, since adaptive limits climb back by the clock. It
// reports how many limits were cut. A bucket without adaptive limits
// makes no call.
func (b *Bucket) Feedback(ctx context.Context, pushedBack bool) (int, error) {
	if !pushedBack {
		return 0, nil
	}
	args := []any{script.NowArg(b.p.now), dynTTL.Milliseconds(), AdaptCooldown.Microseconds()}
	for _, l := range b.cur().current() {
		if f := dynField(l); f != "" {
			args = append(args, f, strconv.FormatFloat(1/float64(l.Rate), 'f', 9, 64))
		}
	}
	if len(args) == 3 {
		return 0, nil
	}
	v, err := script.Run(ctx, b.p.rdb, "leaky.cut", cutScript, []string{b.dynKey()}, args...)
	if err != nil {
		return 0, fmt.Errorf("adapt %s: %w", b.name, err)
	}
	out, err := script.Ints(v, 2)
	if err != nil {
		return 0, fmt.Errorf("adapt %s: %w", b.name, err)
	}
	return int(out[1]), nil
}

// settleScript moves TATs by a cost's difference from its estimate.
//
//	KEYS[1..] -> TATs of the limits counting the cost
//	ARGV[1] -> now override in µs ("" = Redis TIME)
//	ARGV[2] -> units to add (negative: give back)
//	ARGV[2+2i-1 .. 2+2i] -> limit i: interval µs, per µs
//
// A refund never moves a TAT before now (the bucket is then simply empty)
// and ignores a limit with nothing booked; a charge books from now if the
// limit was idle. Returns the number of TATs moved.
var settleScript = script.New(`
local now = shaper_now(ARGV[1])
local delta = tonumber(ARGV[2])
local moved = 0
for i = 1, #KEYS do
  local iv, per = tonumber(ARGV[1 + 2 * i]), tonumber(ARGV[2 + 2 * i])
  local tat = tonumber(redis.call('GET', KEYS[i]) or '0')
  if delta > 0 or tat > now then
    if tat < now then tat = now end
    -- An overrun books at most one window more: a misread amount must
    -- not stall the limit for years.
    local nt = tat + math.min(delta * iv, per)
    if nt < now then nt = now end
    redis.call('SET', KEYS[i], shaper_int(nt), 'PX', math.max(1, math.ceil((nt - now + per) / 1000)))
    moved = moved + 1
  end
end
return moved
`)

// Settle replaces a reservation's estimated cost by what the send really
// used: actual-estimate units of cost are given back to (negative) or
// charged to (positive) every limit counting that cost, the bucket's own
// and, when partition is set, those of partitionLimits on that partition
// (as the scheduler keeps them). Units given back let the next sends go
// sooner; an overrun pushes them later. It is atomic in Redis.
func (b *Bucket) Settle(ctx context.Context, cost string, estimate, actual int64, partition string, partitionLimits []Limit) error {
	if actual < 0 || estimate < 0 {
		return errors.New("settle: costs must not be negative")
	}
	delta := min(actual, gcra.MaxSpan) - min(estimate, gcra.MaxSpan)
	if delta == 0 || cost == "" {
		return nil
	}
	var keys []string
	args := []any{script.NowArg(b.p.now), delta}
	s := b.cur()
	for i, l := range s.limits {
		if l.Cost == cost {
			keys = append(keys, s.keys[2+i])
			args = append(args, s.params[i].Interval, l.Per.Microseconds())
		}
	}
	if partition != "" {
		for _, l := range partitionLimits {
			if l.Cost == cost {
				keys = append(keys, b.PartitionTAT(partition, l))
				args = append(args, l.Params(b.cfg.Guard).Interval, l.Per.Microseconds())
			}
		}
	}
	if len(keys) == 0 {
		return nil
	}
	if _, err := script.Run(ctx, b.p.rdb, "leaky.settle", settleScript, keys, args...); err != nil {
		return fmt.Errorf("settle %s on %s: %w", cost, b.name, err)
	}
	return nil
}

// PartitionTAT is the key of a partition limit's TAT, as BookingLua's
// leaky_partition names it (the bucket's key prefix that BookingArgs
// passes, "p:", then partition, ":" and the limit's id).
func (b *Bucket) PartitionTAT(partition string, l Limit) string {
	return b.p.key(b.name, "p:") + partition + ":" + limitID(l)
}

// pushbackScript blocks a bucket after a refusal that gave no time: for
// base the first time; twice as long as the last such block (up to
// ceiling) when the refused request left within probe after that block
// ended, that is the upstream still refused as soon as sending resumed (a
// storm); otherwise the refusals stopped for a while after the last block,
// and the block is half the last one, halved again for each further quiet
// stretch of twice its length, down to base.
//
// Growth is judged from the last block's end and over a fixed probe, not
// over a span that grows with the block: with that, sporadic refusals (a
// strict meter refusing one send in thirty after a slow trip) came often
// enough within twice a long block to keep it at the ceiling, and a fleet
// that should have paused 25 ms per refusal paused a second.
//
//	KEYS[1] -> block hash {until, reason, pb = last pushback µs, pbat = when,
//	           pbend = when it ended}
//	ARGV[1] -> now override in µs ("" = Redis TIME)
//	ARGV[2] -> base µs
//	ARGV[3] -> ceiling µs
//	ARGV[4] -> reason
//	ARGV[5] -> announcement channel
//	ARGV[6] -> bucket name
//	ARGV[7] -> when the refused request was sent, µs (0 unknown: now)
//	ARGV[8] -> probe µs
//
// A refusal of a request sent before the last pushback ended was already
// on its way when it began, or sent by a replica that had not yet heard of
// it: it neither grows nor renews the pushback.
//
// Returns {until µs, now µs, pushback µs, 1 if this call paused}.
var pushbackScript = script.New(`
local now = shaper_now(ARGV[1])
local base, ceil = tonumber(ARGV[2]), tonumber(ARGV[3])
local sent, probe = tonumber(ARGV[7]), tonumber(ARGV[8])
local f = redis.call('HMGET', KEYS[1], 'until', 'pb', 'pbat', 'pbend')
local cur, prev, at = tonumber(f[1] or '0'), tonumber(f[2] or '0'), tonumber(f[3] or '0')
-- A hash from before pbend was kept: its pause ended at pbat + pb.
local pend = tonumber(f[4] or tostring(at + prev))
if prev > 0 and sent > 0 and sent < math.max(at, pend) then
  return {math.max(cur, now), now, prev, 0}
end
local d = base
if prev > 0 then
  local ref = now
  if sent > 0 then ref = sent end
  local after = ref - pend
  if after <= probe then
    d = math.min(ceil, 2 * prev)
  else
    d = math.min(ceil, prev / 2)
    after = after - probe
    while d > base and after > 2 * d do
      after = after - 2 * d
      d = d / 2
    end
    d = math.max(base, math.floor(d))
  end
end
local want = now + d
-- Sending resumes when the longer of this pause and a block already in
-- force ends.
redis.call('HSET', KEYS[1], 'pb', shaper_int(d), 'pbat', shaper_int(now), 'pbend', shaper_int(math.max(cur, want)))
if want > cur then
  redis.call('HSET', KEYS[1], 'until', shaper_int(want), 'reason', ARGV[4])
  redis.call('PUBLISH', ARGV[5], ARGV[6] .. ' ' .. shaper_int(want))
  cur = want
end
-- Kept long enough to tell a repeat from a fresh start, even when a
-- refusal comes back seconds after its request was sent (a slow upstream):
-- growth is judged by when it was sent.
redis.call('PEXPIRE', KEYS[1], math.ceil((math.max(cur - now, 0) + probe + math.max(8 * d, 10000000)) / 1000) + 1)
return {cur, now, d, 1}
`)

// Pushback blocks the bucket fleet-wide after a refusal that said nothing
// about when to come back (a bare 429): briefly (base) when it is
// isolated; twice as long as the last time, up to ceiling, when the
// refused request left within probe after the last such block ended (the
// upstream refused again as soon as sending resumed); half as long, and
// less after longer quiet, when sends got through for longer than probe
// first. probe below twice base counts as twice base: callers pass a few
// of the bucket's send intervals, so that the first sends after a block
// are the ones that decide. sent is when the refused request was sent on
// Redis's clock (its slot; zero if unknown): a refusal of a request sent
// before the last pushback ended was in flight when it began, or sent by a
// replica that had not heard of it yet, and changes nothing. It returns the block's end, the length of the pushback in
// force, and whether this call paused (false for one already in flight).
func (b *Bucket) Pushback(ctx context.Context, base, ceiling, probe time.Duration, reason string, sent time.Time) (time.Time, time.Duration, bool, error) {
	if base <= 0 || ceiling < base {
		return time.Time{}, 0, false, fmt.Errorf("pushback %s: want 0 < base (%v) <= ceiling (%v)", b.name, base, ceiling)
	}
	probe = max(probe, 2*base)
	var sentUs int64
	if !sent.IsZero() {
		sentUs = sent.UnixMicro()
	}
	v, err := script.Run(ctx, b.p.rdb, "leaky.pushback", pushbackScript, b.blockKey(), script.NowArg(b.p.now),
		base.Microseconds(), ceiling.Microseconds(), reason, b.p.blocksChannel(), b.name, sentUs, probe.Microseconds())
	if err != nil {
		return time.Time{}, 0, false, fmt.Errorf("pushback %s: %w", b.name, err)
	}
	out, err := script.Ints(v, 4)
	if err != nil {
		return time.Time{}, 0, false, fmt.Errorf("pushback %s: %w", b.name, err)
	}
	b.p.blocks.set(b.name, out[0])
	return time.UnixMicro(out[0]), time.Duration(out[2]) * time.Microsecond, out[3] == 1, nil
}

// dynKey is the hash of the bucket's dynamic limits.
func (b *Bucket) dynKey() string { return b.p.key(b.name, "dyn") }

// statedKey is the TAT of stated limit i (1-based).
func (b *Bucket) statedKey(i int) string { return b.p.key(b.name, "tat:stated"+strconv.Itoa(i)) }

// LimitState is one limit as the bucket paces it now.
type LimitState struct {
	// Limit is as configured; for a stated limit, Rate and Per are the
	// upstream's quota and window.
	Limit Limit
	// Rate is the rate paced at now, in units per Limit.Per: Limit.Rate
	// unless an adaptive limit is below its ceiling.
	Rate float64
	// Source is "configured", "adaptive", "stated" or "operator".
	Source string
}

// Sources of a LimitState.
const (
	SourceConfigured = "configured"
	SourceAdaptive   = "adaptive"
	SourceStated     = "stated"
	// SourceOperator: an operator replaced the configured limits (see
	// Override).
	SourceOperator = "operator"
)

// limitStates turns the dyn hash's fields into LimitStates.
func (b *Bucket) limitStates(s *limitSet, fields map[string]string, now int64) []LimitState {
	out := make([]LimitState, 0, s.n+MaxStated)
	for _, l := range s.current() {
		ls := LimitState{Limit: l, Rate: float64(l.Rate), Source: SourceConfigured}
		if f := dynField(l); f != "" {
			ls.Source = SourceAdaptive
			ls.Rate = float64(l.Rate) * adaptRatio(fields[f], now)
		}
		if s.gen > 0 {
			// An operator's limit, adaptive or not.
			ls.Source = SourceOperator
		}
		out = append(out, ls)
	}
	for i := 1; i <= MaxStated; i++ {
		v, ok := fields["s"+strconv.Itoa(i)]
		if !ok {
			continue
		}
		parts := strings.Fields(v)
		if len(parts) != 4 {
			continue
		}
		iv, _ := strconv.ParseInt(parts[0], 10, 64)
		per, _ := strconv.ParseInt(parts[2], 10, 64)
		q, _ := strconv.ParseInt(parts[3], 10, 64)
		if iv <= 0 || per <= 0 {
			continue
		}
		l := Limit{Rate: max(q, 1), Per: time.Duration(per) * time.Microsecond}
		out = append(out, LimitState{Limit: l, Rate: float64(l.Rate), Source: SourceStated})
	}
	return out
}

// adaptRatio is shaper_adapt_ratio in Go, for displays.
func adaptRatio(v string, now int64) float64 {
	parts := strings.Fields(v)
	if len(parts) != 2 {
		return 1
	}
	r, err1 := strconv.ParseFloat(parts[0], 64)
	t, err2 := strconv.ParseInt(parts[1], 10, 64)
	if err1 != nil || err2 != nil || r <= 0 {
		return 1
	}
	r += max(AdaptRise*r, AdaptRiseMin) * float64(max(0, now-t)) / 1e6
	return min(r, 1)
}

// dynKeys are the keys every booking script needs after the TATs: the dyn
// hash, then one TAT per stated limit.
func (b *Bucket) dynKeys() []string {
	out := []string{b.dynKey()}
	for i := 1; i <= MaxStated; i++ {
		out = append(out, b.statedKey(i))
	}
	return out
}
