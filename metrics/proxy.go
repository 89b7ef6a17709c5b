package metrics

import "github.com/prometheus/client_golang/prometheus"

// newProxy creates the proxy's metrics on m and registers them.
func (m *Metrics) newProxy(reg prometheus.Registerer) {
	m.ProxyCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shaper_proxy_calls_total",
		Help: "Calls through the proxy (/proxy/NAME/...) by upstream and the status code the caller was answered: the upstream's, or shaper's own (429 past the wait, 503 Redis unreachable, 4xx refused); \"canceled\" when the caller hung up before an answer.",
	}, []string{"upstream", "code"})
	m.ProxyWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "shaper_proxy_wait_seconds",
		Help:    "Time a proxied call waited for its send slot (its first, until sent), by upstream.",
		Buckets: []float64{0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60},
	}, []string{"upstream"})
	reg.MustRegister(m.ProxyCalls, m.ProxyWait)
}

// InitProxy creates an upstream's proxy series at zero.
func (m *Metrics) InitProxy(upstream string) {
	m.ProxyWait.WithLabelValues(upstream)
}
