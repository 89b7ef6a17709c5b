package cli

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/config"
	"github.com/shaperhq/shaper/metrics"
	"github.com/shaperhq/shaper/queue"
	"github.com/shaperhq/shaper/schedule"
	"github.com/shaperhq/shaper/server"
	"github.com/shaperhq/shaper/status"
)

// startSchedules writes the config's schedules to Redis (each job checked
// as the API checks one; a bad one stops the start) and runs this
// replica's schedule runner until ctx ends, in a goroutine counted in wg.
// Every serve, work and dev process runs one: ticks run exactly once
// however many do (package schedule).
func startSchedules(ctx context.Context, wg *sync.WaitGroup, rdb redis.UniversalClient, cfg *config.Config, jobs *server.Server, m *metrics.Metrics, log *slog.Logger) error {
	defs, err := cfg.ScheduleDefs()
	if err != nil {
		return err
	}
	var problems []string
	for i, d := range defs {
		for _, e := range jobs.CheckSchedule(d, fmt.Sprintf("schedules[%d].", i)) {
			problems = append(problems, e.Field+": "+e.Message)
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("invalid config schedules:\n  %s", strings.Join(problems, "\n  "))
	}
	st := schedule.NewStore(rdb, schedule.Config{Prefix: cfg.Redis.Prefix})
	if err := st.Sync(ctx, defs); err != nil {
		return err
	}
	r := schedule.NewRunner(st, jobs, schedule.RunnerConfig{Logger: log, Metrics: m})
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.Run(ctx)
	}()
	return nil
}

// workerScheduleJobs is what a worker replica checks and makes schedules'
// jobs with: the API's checks against every configured upstream (a
// worker draining some upstreams still runs every schedule).
func workerScheduleJobs(rdb redis.UniversalClient, cfg *config.Config, m *metrics.Metrics) (*server.Server, func(), error) {
	q, err := queue.New(rdb, queueConfig(cfg))
	if err != nil {
		return nil, nil, err
	}
	st, err := status.NewReader(rdb, q, cfg.Redis.Prefix)
	if err != nil {
		q.Close()
		return nil, nil, err
	}
	jobs, err := server.NewScheduleJobs(q, st, m, cfg.Callbacks.AllowedHosts)
	if err != nil {
		q.Close()
		return nil, nil, err
	}
	return jobs, func() { q.Close() }, nil
}
