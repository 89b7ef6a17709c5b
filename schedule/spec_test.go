package schedule

import (
	"strings"
	"testing"
	"time"
)

func berlin(t *testing.T) *time.Location {
	t.Helper()
	loc, err := LoadZone("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func mustSpec(t *testing.T, expr string, loc *time.Location) Spec {
	t.Helper()
	sp, err := ParseCron(expr, loc)
	if err != nil {
		t.Fatalf("ParseCron(%q): %v", expr, err)
	}
	return sp
}

// ticks lists the ticks of sp after from, n of them.
func ticks(sp Spec, from time.Time, n int) []time.Time {
	var out []time.Time
	for t := from; len(out) < n; {
		t = sp.Next(t)
		out = append(out, t)
	}
	return out
}

func TestNextAcrossDaylightSaving(t *testing.T) {
	loc := berlin(t)
	cases := []struct {
		name, expr string
		from       time.Time
		want       []string
	}{
		// 2026-03-29 has no 02:30: that day is not run (robfig/cron).
		{"spring forward", "30 2 * * *", time.Date(2026, 3, 28, 12, 0, 0, 0, loc),
			[]string{"2026-03-30 02:30 CEST", "2026-03-31 02:30 CEST"}},
		// 2026-10-25 has 02:30 twice: run at the first only.
		{"fall back", "30 2 * * *", time.Date(2026, 10, 24, 12, 0, 0, 0, loc),
			[]string{"2026-10-25 02:30 CEST", "2026-10-26 02:30 CET", "2026-10-27 02:30 CET"}},
		{"fall back, from between the two", "30 2 * * *", time.Date(2026, 10, 25, 2, 45, 0, 0, loc),
			[]string{"2026-10-26 02:30 CET"}},
		{"fall back, every minute of hour 2", "*/20 2 * * *", time.Date(2026, 10, 25, 1, 0, 0, 0, loc),
			[]string{"2026-10-25 02:00 CEST", "2026-10-25 02:20 CEST", "2026-10-25 02:40 CEST", "2026-10-26 02:00 CET"}},
		// Expressions that run every hour follow the hours as they pass.
		{"fall back, hourly", "@hourly", time.Date(2026, 10, 25, 1, 30, 0, 0, loc),
			[]string{"2026-10-25 02:00 CEST", "2026-10-25 02:00 CET", "2026-10-25 03:00 CET"}},
		{"spring forward, hourly", "0 * * * *", time.Date(2026, 3, 29, 1, 30, 0, 0, loc),
			[]string{"2026-03-29 03:00 CEST", "2026-03-29 04:00 CEST"}},
		{"six fields", "15 30 2 * * *", time.Date(2026, 10, 24, 12, 0, 0, 0, loc),
			[]string{"2026-10-25 02:30 CEST", "2026-10-26 02:30 CET"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got []string
			for _, tk := range ticks(mustSpec(t, c.expr, loc), c.from, len(c.want)) {
				got = append(got, tk.In(loc).Format("2006-01-02 15:04 MST"))
			}
			if strings.Join(got, ", ") != strings.Join(c.want, ", ") {
				t.Errorf("got %v, want %v", got, c.want)
			}
		})
	}
}

func TestEveryIsElapsedTime(t *testing.T) {
	sp := mustSpec(t, "@every 90s", time.UTC)
	from := time.Unix(1000, 500)
	if got, want := sp.Next(from), time.Unix(1090, 0); !got.Equal(want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestParseCronRefuses(t *testing.T) {
	cases := []struct{ expr, want string }{
		{"", "is required"},
		{"* * *", "expected 5 to 6 fields"},
		{"61 * * * *", "end of range"},
		{"@every 500ms", "whole seconds, at least 1s"},
		{"@every 1.5s", "whole seconds"},
		{"@every soon", "takes a duration"},
		{"@fortnightly", "unrecognized descriptor"},
		{"TZ=Europe/Berlin 0 3 * * *", "give the time zone in timezone"},
		{"CRON_TZ=UTC 0 3 * * *", "give the time zone in timezone"},
	}
	for _, c := range cases {
		_, err := ParseCron(c.expr, time.UTC)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseCron(%q): got %v, want an error containing %q", c.expr, err, c.want)
		}
	}
	for _, tz := range []string{"Mars/Olympus", "Local", "europe/berlin "} {
		if _, err := LoadZone(tz); err == nil {
			t.Errorf("LoadZone(%q): got nil, want an error", tz)
		}
	}
	for _, name := range []string{"", "-x", "a b", "a@b", "a:b", strings.Repeat("a", 101)} {
		if CheckName(name) == nil {
			t.Errorf("CheckName(%q): got nil, want an error", name)
		}
	}
}

func TestPlan(t *testing.T) {
	sp := mustSpec(t, "@every 1m", time.UTC)
	t0 := time.Unix(6000, 0).UTC()
	cases := []struct {
		name string
		c    CatchUp
		tick time.Time
		now  time.Time
		want step
	}{
		{"on time", CatchUpLast, t0, t0, step{run: true}},
		{"late within grace", CatchUpNone, t0, t0.Add(Grace), step{run: true}},
		{"late, successor not missed", CatchUpLast, t0, t0.Add(65 * time.Second), step{run: true}},
		{"none: missed", CatchUpNone, t0, t0.Add(Grace + time.Second), step{to: t0.Add(time.Minute), skipped: 1}},
		{"none: ten missed", CatchUpNone, t0, t0.Add(10*time.Minute + 5*time.Second), step{to: t0.Add(10 * time.Minute), skipped: 10}},
		{"last: ten missed", CatchUpLast, t0, t0.Add(10*time.Minute + 5*time.Second), step{to: t0.Add(9 * time.Minute), skipped: 9}},
		{"last: a year missed", CatchUpLast, t0, t0.Add(525600*time.Minute + 30*time.Second), step{to: t0.Add(525600 * time.Minute), skipped: 525600}},
	}
	for _, c := range cases {
		if got := plan(sp, c.c, c.tick, c.now); got != c.want {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
	}
	// A spec schedule walks (no gallop) to the same answer.
	daily := mustSpec(t, "0 3 * * *", time.UTC)
	d0 := time.Date(2026, 1, 1, 3, 0, 0, 0, time.UTC)
	if got, want := plan(daily, CatchUpLast, d0, d0.AddDate(0, 0, 30).Add(time.Hour)), (step{to: d0.AddDate(0, 0, 30), skipped: 30}); got != want {
		t.Errorf("daily, last: got %+v, want %+v", got, want)
	}
	if got, want := plan(daily, CatchUpNone, d0, d0.AddDate(0, 0, 30).Add(time.Hour)), (step{to: d0.AddDate(0, 0, 31), skipped: 31}); got != want {
		t.Errorf("daily, none: got %+v, want %+v", got, want)
	}
}
