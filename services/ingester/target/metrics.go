package target

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the publisher's grasp_target_* series (docs/metrics.md).
type metrics struct {
	answers   *prometheus.CounterVec
	inFlight  prometheus.Gauge
	connected prometheus.Gauge
	latency   prometheus.Histogram
	// n mirrors the answer counters Status reports.
	n map[string]*atomic.Int64
}

func newMetrics(p *Publisher, reg prometheus.Registerer) *metrics {
	m := &metrics{
		answers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grasp_target_answers_total",
			Help: "Answers of the target relay to our EVENTs: ok, duplicate, refused, rate_limited, auth_required, error, and timeout or lost (no answer).",
		}, []string{"answer"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "grasp_target_in_flight", Help: "EVENTs sent to the target relay and waiting for its OK.",
		}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "grasp_target_connected", Help: "1 while the publisher holds a connection to the target relay.",
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "grasp_target_publish_seconds", Help: "Time from sending an EVENT to the target relay to its OK.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
	}
	m.n = map[string]*atomic.Int64{}
	for _, a := range []string{"ok", "duplicate", "refused", "rate_limited", "auth_required", "error", "timeout", "lost"} {
		m.answers.WithLabelValues(a) // present at 0
		m.n[a] = new(atomic.Int64)
	}
	if reg == nil {
		return m
	}
	gauge := func(name, help string, fn func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, fn)
	}
	reg.MustRegister(m.answers, m.inFlight, m.connected, m.latency,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "grasp_target_info", Help: "Always 1; the url label is the target relay (GRASP_TARGET_RELAY).",
			ConstLabels: prometheus.Labels{"url": p.cfg.Relay},
		}, func() float64 { return 1 }),
		gauge("grasp_target_publish_rate", "Configured steady publish rate to the target relay, events per second (GRASP_TARGET_PUBLISH_RATE).",
			func() float64 { return p.cfg.PublishRate }),
		gauge("grasp_target_publish_burst", "Configured publish burst (GRASP_TARGET_PUBLISH_BURST).",
			func() float64 { return float64(p.cfg.PublishBurst) }),
		gauge("grasp_target_publish_concurrency", "Configured bound on EVENTs waiting for their OK (GRASP_TARGET_PUBLISH_CONCURRENCY).",
			func() float64 { return float64(p.cfg.PublishConcurrency) }),
		gauge("grasp_target_write_rate", "Measured events per second the target relay took (written or duplicate), over about a minute.",
			func() float64 { return p.Status().WriteRate }),
		gauge("grasp_target_backlog_events", "Events waiting to be decided and published (the ingesters' consumer lag plus what they hold).",
			func() float64 { return float64(p.backlog.Load()) }),
		gauge("grasp_target_eta_seconds", "Time the backlog is expected to need at the measured write rate (the configured rate before one is measured).",
			func() float64 { return p.Status().ETA.Seconds() }),
		gauge("grasp_target_paused_seconds", "Rest of the pause after a rate-limited answer or a lost connection (0: not paused).",
			func() float64 { return p.Status().Paused.Seconds() }),
	)
	return m
}

// answer counts one answer of the target.
func (m *metrics) answer(a string) {
	m.answers.WithLabelValues(a).Inc()
	m.n[a].Add(1)
}

// count reads one answer counter.
func (m *metrics) count(a string) int64 { return m.n[a].Load() }
