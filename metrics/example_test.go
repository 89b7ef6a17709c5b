package metrics_test

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shaperhq/shaper/metrics"
)

// Metrics go on a registry the caller owns (serve it with promhttp). The
// backlog gauge is read at scrape time, so every replica reports the
// fleet's backlog from Redis rather than its own share.
func Example() {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	m.JobsEnqueued.WithLabelValues("stripe", "default").Add(3)
	m.Dispatches.WithLabelValues("stripe", "succeeded").Inc()
	err := metrics.RegisterBacklog(reg, m, func(ctx context.Context) (map[string]map[string]int64, error) {
		// In shaper this reads queue.Queue.Counts for every upstream.
		return map[string]map[string]int64{"stripe": {"default": 2}}, nil
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	families, err := reg.Gather()
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, f := range families {
		if f.GetName() == "shaper_build_info" {
			continue // its labels name the build and the Go version
		}
		for _, s := range f.GetMetric() {
			v := s.GetCounter().GetValue() + s.GetGauge().GetValue()
			if v == 0 {
				continue
			}
			fmt.Print(f.GetName())
			for _, l := range s.GetLabel() {
				fmt.Printf(" %s=%s", l.GetName(), l.GetValue())
			}
			fmt.Println(":", v)
		}
	}
	// Output:
	// shaper_backlog_jobs lane=default upstream=stripe: 2
	// shaper_dispatches_total outcome=succeeded upstream=stripe: 1
	// shaper_jobs_enqueued_total lane=default upstream=stripe: 3
}
