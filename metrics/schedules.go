package metrics

import "github.com/prometheus/client_golang/prometheus"

// newScheduleRuns is shaper_schedule_runs_total. Its only label is the
// result: schedules are made by tenants, so their names never label it.
func newScheduleRuns() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shaper_schedule_runs_total",
		Help: "Schedule ticks by result: enqueued (a job made), existing (the tick's job had been made already: by another replica running the same tick, or by one that stopped before moving the schedule on), refused (the job was refused, e.g. a full backlog; the schedule goes on), skipped (missed while no replica ran, per catch_up), error (Redis failed; the tick stays due).",
	}, []string{"result"})
}

// InitScheduleRuns makes every result's series, so that a rate reads 0
// rather than nothing.
func (m *Metrics) InitScheduleRuns() {
	for _, r := range []string{"enqueued", "existing", "refused", "skipped", "error"} {
		m.ScheduleRuns.WithLabelValues(r)
	}
	m.InitRedisErrors("schedules")
}
