package schedule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/keyspace"
	"github.com/shaperhq/shaper/internal/script"
)

// Config configures a Store; zero values are documented defaults.
type Config struct {
	// Prefix starts every key (default "shaper").
	Prefix string
	// Now, when set, replaces Redis's clock (tests).
	Now func() time.Time
}

// Store keeps schedules in Redis. Build it with NewStore; it is safe for
// concurrent use.
type Store struct {
	rdb redis.UniversalClient
	k   keys
	now func() time.Time
}

// NewStore returns a Store on rdb, which the caller owns.
func NewStore(rdb redis.UniversalClient, cfg Config) *Store {
	return &Store{rdb: rdb, k: newKeys(cfg.Prefix), now: cfg.Now}
}

type keys struct{ cal, def, state, paused, tenantPrefix string }

func newKeys(prefix string) keys {
	p := keyspace.Prefix(prefix) + ":{schedules}:"
	return keys{cal: p + "cal", def: p + "def", state: p + "state", paused: p + "paused", tenantPrefix: p + "t:"}
}

func (k keys) tenant(t string) string { return k.tenantPrefix + t }

func member(tenant, name string) string { return name + "@" + tenant }

// clock is "now": Redis TIME, or the Now override.
func (s *Store) clock(ctx context.Context) (time.Time, error) {
	if s.now != nil {
		return s.now(), nil
	}
	t, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return time.Time{}, fmt.Errorf("redis time: %w", err)
	}
	return t, nil
}

func (s *Store) nowArg() string { return script.NowArg(s.now) }

// tickArg is a tick as a script argument: unix seconds, "" for none.
func tickArg(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return strconv.FormatInt(t.Unix(), 10)
}

// Create stores a new schedule (ErrExists if one by its name exists for
// its tenant), first tick from Redis's clock. sch must have been checked:
// its name, cron and timezone parse, its job was checked by the caller.
func (s *Store) Create(ctx context.Context, sch *Schedule) (View, error) {
	return s.put(ctx, sch, "create")
}

func (s *Store) put(ctx context.Context, sch *Schedule, mode string) (View, error) {
	if err := CheckName(sch.Name); err != nil {
		return View{}, fmt.Errorf("schedule name: %w", err)
	}
	sp, err := sch.Spec()
	if err != nil {
		return View{}, err
	}
	if sch.CatchUp == "" {
		sch.CatchUp = CatchUpLast
	}
	if sch.Timezone == "" {
		sch.Timezone = "UTC"
	}
	if sch.Source == "" {
		sch.Source = SourceAPI
	}
	now, err := s.clock(ctx)
	if err != nil {
		return View{}, err
	}
	sch.CreatedAt = now.UTC().Truncate(time.Millisecond)
	stored := *sch
	stored.Paused = false // the paused set says
	def, err := json.Marshal(&stored)
	if err != nil {
		return View{}, err
	}
	paused := "0"
	if sch.Paused {
		paused = "1"
	}
	m := member(sch.Tenant, sch.Name)
	v, err := script.Run(ctx, s.rdb, "schedule put", putScript,
		[]string{s.k.cal, s.k.def, s.k.paused, s.k.tenant(sch.Tenant)},
		m, def, tickArg(sp.Next(now)), paused, mode, sch.Name, MaxPerTenant)
	if err != nil {
		return View{}, err
	}
	switch v.(int64) {
	case 0:
		return View{}, fmt.Errorf("schedule %s: %w", sch.Name, ErrExists)
	case -2:
		return View{}, fmt.Errorf("tenant %s has %d schedules, the most it may have: %w", sch.Tenant, MaxPerTenant, ErrTooMany)
	}
	return s.Get(ctx, sch.Tenant, sch.Name)
}

// Get reads one schedule of a tenant (ErrNotFound).
func (s *Store) Get(ctx context.Context, tenant, name string) (View, error) {
	vs, err := s.views(ctx, tenant, []string{name})
	if err != nil {
		return View{}, err
	}
	if len(vs) == 0 {
		return View{}, fmt.Errorf("schedule %s: %w", name, ErrNotFound)
	}
	return vs[0], nil
}

// List reads a tenant's schedules, by name.
func (s *Store) List(ctx context.Context, tenant string) ([]View, error) {
	names, err := s.rdb.ZRange(ctx, s.k.tenant(tenant), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("list schedules: %w", err)
	}
	return s.views(ctx, tenant, names)
}

// views reads the named schedules of a tenant in one round trip; names
// with no definition are left out.
func (s *Store) views(ctx context.Context, tenant string, names []string) ([]View, error) {
	if len(names) == 0 {
		return nil, nil
	}
	ms := make([]string, len(names))
	for i, n := range names {
		ms[i] = member(tenant, n)
	}
	pipe := s.rdb.Pipeline()
	defs := pipe.HMGet(ctx, s.k.def, ms...)
	states := pipe.HMGet(ctx, s.k.state, ms...)
	next := pipe.ZMScore(ctx, s.k.cal, ms...)
	paused := pipe.SMIsMember(ctx, s.k.paused, toAny(ms)...)
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("read schedules: %w", err)
	}
	var out []View
	for i := range ms {
		raw, ok := defs.Val()[i].(string)
		if !ok {
			continue
		}
		var v View
		if err := json.Unmarshal([]byte(raw), &v.Schedule); err != nil {
			return nil, fmt.Errorf("schedule %s: %w", names[i], err)
		}
		if st, ok := states.Val()[i].(string); ok {
			if err := json.Unmarshal([]byte(st), &v.State); err != nil {
				return nil, fmt.Errorf("schedule %s state: %w", names[i], err)
			}
		}
		v.Paused = paused.Val()[i]
		if sc := next.Val()[i]; sc > 0 && !v.Paused {
			v.NextRunAt = time.Unix(int64(sc), 0).UTC()
		}
		out = append(out, v)
	}
	return out, nil
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// Delete removes a schedule made through the API (ErrNotFound,
// ErrConfigOwned).
func (s *Store) Delete(ctx context.Context, tenant, name string) error {
	return s.remove(ctx, tenant, name, "api")
}

func (s *Store) remove(ctx context.Context, tenant, name, by string) error {
	v, err := script.Run(ctx, s.rdb, "schedule remove", removeScript,
		[]string{s.k.cal, s.k.def, s.k.state, s.k.paused, s.k.tenant(tenant)}, member(tenant, name), name, by)
	if err != nil {
		return err
	}
	switch v.(int64) {
	case 0:
		return fmt.Errorf("schedule %s: %w", name, ErrNotFound)
	case -1:
		return fmt.Errorf("schedule %s: %w", name, ErrConfigOwned)
	}
	return nil
}

// Pause takes a schedule out of the calendar until Resume.
func (s *Store) Pause(ctx context.Context, tenant, name string) (View, error) {
	return s.pause(ctx, tenant, name, "pause", "")
}

// Resume puts a paused schedule back, at its first tick after now: ticks
// while it was paused are not run.
func (s *Store) Resume(ctx context.Context, tenant, name string) (View, error) {
	v, err := s.Get(ctx, tenant, name)
	if err != nil {
		return View{}, err
	}
	sp, err := v.Spec()
	if err != nil {
		return View{}, err
	}
	now, err := s.clock(ctx)
	if err != nil {
		return View{}, err
	}
	return s.pause(ctx, tenant, name, "resume", tickArg(sp.Next(now)))
}

func (s *Store) pause(ctx context.Context, tenant, name, what, next string) (View, error) {
	v, err := script.Run(ctx, s.rdb, "schedule "+what, pauseScript,
		[]string{s.k.cal, s.k.def, s.k.paused}, member(tenant, name), what, next)
	if err != nil {
		return View{}, err
	}
	switch v.(int64) {
	case 0:
		return View{}, fmt.Errorf("schedule %s: %w", name, ErrNotFound)
	case -1:
		return View{}, fmt.Errorf("schedule %s: %w", name, ErrConfigOwned)
	}
	return s.Get(ctx, tenant, name)
}

// Sync makes the stored config schedules those declared: each declared
// one is made or replaced (keeping its calendar place when its cron and
// timezone are unchanged), and a config schedule no longer declared is
// removed. Every replica calls it at start; they all write the same.
// A declared schedule takes over an API schedule of the same name and
// tenant.
func (s *Store) Sync(ctx context.Context, declared []*Schedule) error {
	want := map[string]bool{}
	for _, d := range declared {
		d.Source = SourceConfig
		if _, err := s.put(ctx, d, "replace"); err != nil {
			return fmt.Errorf("schedules: %s: %w", d.Name, err)
		}
		want[member(d.Tenant, d.Name)] = true
	}
	all, err := s.rdb.HGetAll(ctx, s.k.def).Result()
	if err != nil {
		return fmt.Errorf("schedules: %w", err)
	}
	for _, m := range slices.Sorted(maps.Keys(all)) {
		if want[m] || !strings.Contains(all[m], `"source":"config"`) {
			continue
		}
		var sch Schedule
		if json.Unmarshal([]byte(all[m]), &sch) != nil || sch.Source != SourceConfig {
			continue
		}
		if err := s.remove(ctx, sch.Tenant, sch.Name, ""); err != nil && !errors.Is(err, ErrNotFound) {
			return fmt.Errorf("schedules: remove %s: %w", sch.Name, err)
		}
	}
	return nil
}

// due is one schedule whose tick has come.
type due struct {
	member string
	tick   time.Time
	sch    *Schedule // nil if its definition has gone or cannot be read
}

// due reads Redis's clock, up to limit due schedules and the first tick
// after now (zero when none), in one call.
func (s *Store) due(ctx context.Context, limit int) (time.Time, time.Time, []due, error) {
	v, err := script.Run(ctx, s.rdb, "schedule due", dueScript, []string{s.k.cal, s.k.def}, limit, s.nowArg())
	if err != nil {
		return time.Time{}, time.Time{}, nil, err
	}
	arr, ok := v.([]any)
	if !ok || len(arr)%3 != 2 {
		return time.Time{}, time.Time{}, nil, fmt.Errorf("schedule due: reply %v", v)
	}
	us, err := strconv.ParseInt(fmt.Sprint(arr[0]), 10, 64)
	if err != nil {
		return time.Time{}, time.Time{}, nil, fmt.Errorf("schedule due: now %v", arr[0])
	}
	var after time.Time
	if s, _ := arr[1].(string); s != "" {
		secs, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return time.Time{}, time.Time{}, nil, fmt.Errorf("schedule due: next tick %v", arr[1])
		}
		after = time.Unix(int64(secs), 0).UTC()
	}
	var out []due
	for i := 2; i < len(arr); i += 3 {
		m, _ := arr[i].(string)
		secs, err := strconv.ParseFloat(fmt.Sprint(arr[i+1]), 64)
		if err != nil {
			return time.Time{}, time.Time{}, nil, fmt.Errorf("schedule due: tick %v", arr[i+1])
		}
		d := due{member: m, tick: time.Unix(int64(secs), 0).UTC()}
		if raw, _ := arr[i+2].(string); raw != "" {
			var sch Schedule
			if json.Unmarshal([]byte(raw), &sch) == nil {
				d.sch = &sch
			}
		}
		out = append(out, d)
	}
	return time.UnixMicro(us).UTC(), after, out, nil
}

// advance moves member from tick to next (zero: out of the calendar) if it
// is still at tick, recording st when given; false when it was not.
func (s *Store) advance(ctx context.Context, m string, tick, next time.Time, st *State) (bool, error) {
	var stArg string
	if st != nil {
		b, err := json.Marshal(st)
		if err != nil {
			return false, err
		}
		stArg = string(b)
	}
	v, err := script.Run(ctx, s.rdb, "schedule advance", advanceScript, []string{s.k.cal, s.k.state},
		m, tickArg(tick), tickArg(next), stArg)
	if err != nil {
		return false, err
	}
	return v.(int64) == 1, nil
}

// state reads one member's State.
func (s *Store) state(ctx context.Context, m string) (State, error) {
	var st State
	raw, err := s.rdb.HGet(ctx, s.k.state, m).Result()
	if err == redis.Nil {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal([]byte(raw), &st)
}
