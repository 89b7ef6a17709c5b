package schedule

import (
	"errors"
	"fmt"
	"strings"
	"time"
	_ "time/tzdata" // IANA zones without the host's zoneinfo (scratch images)

	"github.com/robfig/cron/v3"
)

// Spec is when a schedule ticks: a cron expression in a time zone. Ticks
// are whole seconds.
//
// Daylight-saving time, for expressions that name their hours (such as
// "30 2 * * *"), follows cron's usual rules as robfig/cron/v3 computes
// them, with one correction:
//   - a local time that does not exist on a spring-forward day (02:30 in
//     Europe/Berlin on the last Sunday of March) is not run that day; the
//     next run is the following day's 02:30 (robfig/cron's behaviour);
//   - a local time that occurs twice on a fall-back day (02:30 on the last
//     Sunday of October) runs once, at its first occurrence (robfig/cron
//     alone would run it twice; Next skips a tick whose wall clock is not
//     after the previous one's).
//
// Expressions whose hour field is every hour ("*/5 * * * *", @hourly) and
// @every run by elapsed time and are not corrected: the repeated hour of a
// fall-back day runs again, as the hours really pass.
type Spec struct {
	sched cron.Schedule
	loc   *time.Location
	// fixedHours is set when the hour field names some hours only: the
	// wall clock of its ticks must move forward.
	fixedHours bool
}

// allHours is the hour field of an expression that runs every hour.
const allHours = 1<<24 - 1

// ParseCron reads a cron expression: 5 fields (minute hour day-of-month
// month day-of-week), 6 with a leading seconds field, @every D (D whole
// seconds, at least 1s), or @yearly, @annually, @monthly, @weekly, @daily,
// @midnight, @hourly. The time zone is separate (LoadZone), so TZ= and
// CRON_TZ= prefixes are refused.
func ParseCron(expr string, loc *time.Location) (Spec, error) {
	expr = strings.TrimSpace(expr)
	switch {
	case expr == "":
		return Spec{}, errors.New("is required: 5 fields (\"0 3 * * *\"), 6 with seconds, @every 1m or @hourly")
	case strings.HasPrefix(expr, "TZ=") || strings.HasPrefix(expr, "CRON_TZ="):
		return Spec{}, fmt.Errorf("%q: give the time zone in timezone, not in the expression", expr)
	}
	if loc == nil {
		loc = time.UTC
	}
	if rest, ok := strings.CutPrefix(expr, "@every "); ok {
		d, err := time.ParseDuration(strings.TrimSpace(rest))
		switch {
		case err != nil:
			return Spec{}, fmt.Errorf("%q: @every takes a duration such as 30s, 5m or 1h30m", expr)
		case d < time.Second || d%time.Second != 0:
			return Spec{}, fmt.Errorf("%q: @every takes whole seconds, at least 1s", expr)
		}
		return Spec{sched: cron.Every(d), loc: loc}, nil
	}
	p := cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
	s, err := p.Parse(expr)
	if err != nil {
		return Spec{}, fmt.Errorf("%q: %v (5 fields, 6 with seconds, @every D or @hourly…)", expr, err)
	}
	ss, ok := s.(*cron.SpecSchedule)
	if !ok {
		return Spec{}, fmt.Errorf("%q: not a cron expression", expr)
	}
	ss.Location = loc
	return Spec{sched: ss, loc: loc, fixedHours: ss.Hour&allHours != allHours}, nil
}

// LoadZone reads an IANA time zone name ("Europe/Berlin"); "" is UTC.
// "Local" is refused: a replica's zone is not the fleet's.
func LoadZone(name string) (*time.Location, error) {
	switch name {
	case "", "UTC":
		return time.UTC, nil
	case "Local":
		return nil, errors.New(`"Local": name an IANA zone such as Europe/Berlin (each replica's local zone may differ)`)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("%q: not an IANA time zone name such as Europe/Berlin or America/New_York", name)
	}
	return loc, nil
}

// Next is the first tick after t, or the zero time when there is none
// within five years.
func (s Spec) Next(t time.Time) time.Time {
	n := s.sched.Next(t)
	if !s.fixedHours {
		return n
	}
	// On a fall-back day the wall clock repeats an hour; a tick whose wall
	// clock is not after t's is that hour's second pass.
	last := wall(t, s.loc)
	for i := 0; i < 4 && !n.IsZero(); i++ {
		w := wall(n, s.loc)
		if w.After(last) {
			break
		}
		// Jump to where the repeated hour's wall clock reaches t's again.
		n = s.sched.Next(n.Add(last.Sub(w)))
	}
	return n
}

// wall is t's wall clock in loc, as a time in UTC, so that two wall clocks
// compare as the clock on the wall reads.
func wall(t time.Time, loc *time.Location) time.Time {
	l := t.In(loc)
	return time.Date(l.Year(), l.Month(), l.Day(), l.Hour(), l.Minute(), l.Second(), 0, time.UTC)
}

// every is the period of an @every spec, 0 for others.
func (s Spec) every() time.Duration {
	if c, ok := s.sched.(cron.ConstantDelaySchedule); ok {
		return c.Delay
	}
	return 0
}
