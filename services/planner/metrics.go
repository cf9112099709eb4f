package planner

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the planner's Prometheus metrics. The per-relay status gauge
// uses ngit-grasp's 0–5 encoding (RelayStatus value − 1), so operators keep
// their dashboards.
type Metrics struct {
	commands      *prometheus.CounterVec
	commandBytes  *prometheus.CounterVec
	status        *prometheus.GaugeVec
	repos         *prometheus.GaugeVec
	roots         *prometheus.GaugeVec
	batches       *prometheus.CounterVec
	incomplete    *prometheus.CounterVec
	batchDuration *prometheus.HistogramVec
	consolidation prometheus.Counter
	deferred      prometheus.Gauge
	reconnects    *prometheus.CounterVec
	resyncMissed  prometheus.Counter
	relays        *prometheus.GaugeVec
	recompute     prometheus.Histogram
	reportBatch   prometheus.Histogram
	flush         prometheus.Histogram
	indexUpdates  prometheus.Counter
	leader        prometheus.Gauge
	epoch         prometheus.Gauge
}

// NewMetrics creates the metrics and registers them when reg is not nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grasp_planner_commands_total", Help: "Fetch commands sent, by command.",
		}, []string{"command"}),
		commandBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grasp_planner_command_bytes_total", Help: "Bytes of the fetch commands sent (their encoded payloads), by command.",
		}, []string{"command"}),
		status: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "grasp_planner_relay_status",
			Help: "Relay sync status: 0 disconnected, 1 connecting, 2 syncing, 3 connected, 4 connected with historic sync failures, 5 disconnecting (ngit-grasp encoding).",
		}, []string{"relay"}),
		repos: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "grasp_planner_relay_repos", Help: "Repositories per relay whose history is confirmed or pending.",
		}, []string{"relay", "state"}),
		roots: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "grasp_planner_relay_roots", Help: "Root events per relay (per repository listing it) whose history is confirmed or pending.",
		}, []string{"relay", "state"}),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grasp_planner_batches_total", Help: "Historic batches started, confirmed, failed and abandoned (their session ended or a resync started over), by batch kind.",
		}, []string{"event", "kind"}),
		incomplete: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grasp_planner_batches_incomplete_total", Help: "Historic batches the fetcher reported INCOMPLETE (a one-second slice it could not read completely), by batch kind; each is also counted failed and retried, never confirmed.",
		}, []string{"kind"}),
		batchDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "grasp_planner_batch_duration_seconds", Help: "Time from a batch's command to its completion report.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 16),
		}, []string{"kind", "outcome"}),
		consolidation: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "grasp_planner_consolidations_total", Help: "Live subscription consolidations (one ReplaceLive with the minimal set).",
		}),
		deferred: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "grasp_planner_deferred_consolidations",
			Help: "Relays whose live subscriptions wait for a consolidation the loop builds a few at a time.",
		}),
		reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grasp_planner_reconnects_total", Help: "Relay sessions started, by kind: fresh, quick, long, daily, resume.",
		}, []string{"kind"}),
		resyncMissed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "grasp_planner_resync_missed_events_total",
			Help: "Events daily resyncs found that live subscriptions and catch-ups had missed (each waited for the resync); per relay in graspctl status.",
		}),
		relays: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "grasp_planner_relays", Help: "Relays tracked, connected and dead.",
		}, []string{"state"}),
		recompute: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "grasp_planner_recompute_duration_seconds", Help: "Duration of one compute_actions run including command building.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}),
		reportBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "grasp_planner_report_batch_size", Help: "Fetch reports handled together before one flush (those that were waiting when the first arrived).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 8),
		}),
		flush: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "grasp_planner_flush_duration_seconds", Help: "Time one flush waited for its commands' and relay records' acknowledgements.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		indexUpdates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "grasp_planner_index_updates_total", Help: "Index (KV) updates applied by the active planner; over the recompute count, how many updates a recompute coalesces.",
		}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "grasp_planner_leader", Help: "1 while this planner instance is the active one.",
		}),
		epoch: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "grasp_planner_epoch", Help: "Leadership epoch of this planner while active.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.commands, m.commandBytes, m.status, m.repos, m.roots, m.batches, m.incomplete, m.batchDuration,
			m.consolidation, m.deferred, m.reconnects, m.resyncMissed, m.relays, m.recompute, m.reportBatch, m.flush, m.indexUpdates, m.leader, m.epoch)
	}
	return m
}

// BatchStarted implements Observer.
func (m *Metrics) BatchStarted(_ string, kind BatchKind) {
	m.batches.WithLabelValues("started", kind.String()).Inc()
}

// BatchFinished implements Observer.
func (m *Metrics) BatchFinished(_ string, kind BatchKind, ok bool, took time.Duration) {
	event, outcome := "confirmed", "ok"
	if !ok {
		event, outcome = "failed", "failed"
	}
	m.batches.WithLabelValues(event, kind.String()).Inc()
	m.batchDuration.WithLabelValues(kind.String(), outcome).Observe(took.Seconds())
}

// BatchIncomplete implements Observer.
func (m *Metrics) BatchIncomplete(_ string, kind BatchKind) {
	m.incomplete.WithLabelValues(kind.String()).Inc()
}

// BatchAbandoned implements Observer.
func (m *Metrics) BatchAbandoned(_ string, kind BatchKind) {
	m.batches.WithLabelValues("abandoned", kind.String()).Inc()
}

// Consolidated implements Observer.
func (m *Metrics) Consolidated(string) { m.consolidation.Inc() }

// Reconnected implements Observer.
func (m *Metrics) Reconnected(_ string, kind ReconnectKind) {
	m.reconnects.WithLabelValues(string(kind)).Inc()
}

// ResyncMissed implements Observer.
func (m *Metrics) ResyncMissed(_ string, n uint64) { m.resyncMissed.Add(float64(n)) }

// relayChanged updates the per-relay gauges of one relay.
func (m *Metrics) relayChanged(s *RelayState) {
	repos, roots, pendRepos, pendRoots := s.Counts()
	m.status.WithLabelValues(s.URL).Set(float64(s.Status) - 1)
	m.repos.WithLabelValues(s.URL, "confirmed").Set(float64(repos))
	m.repos.WithLabelValues(s.URL, "pending").Set(float64(pendRepos))
	m.roots.WithLabelValues(s.URL, "confirmed").Set(float64(roots))
	m.roots.WithLabelValues(s.URL, "pending").Set(float64(pendRoots))
}

// relayDropped removes a dropped relay's series.
func (m *Metrics) relayDropped(url string) {
	m.status.DeleteLabelValues(url)
	for _, st := range []string{"confirmed", "pending"} {
		m.repos.DeleteLabelValues(url, st)
		m.roots.DeleteLabelValues(url, st)
	}
}

// queue sets the gauge of relays waiting for a deferred consolidation.
func (m *Metrics) queue(mach *Machine) { m.deferred.Set(float64(mach.DeferredConsolidations())) }

// totals sets the tracked/connected/dead gauges.
func (m *Metrics) totals(relays map[RelayID]*RelayState) {
	var connected, dead int
	for _, s := range relays {
		if s.Connected() {
			connected++
		}
		if s.Dead {
			dead++
		}
	}
	m.relays.WithLabelValues("tracked").Set(float64(len(relays)))
	m.relays.WithLabelValues("connected").Set(float64(connected))
	m.relays.WithLabelValues("dead").Set(float64(dead))
}

// forget clears every per-relay series, when this instance stops leading.
func (m *Metrics) forget() {
	m.status.Reset()
	m.repos.Reset()
	m.roots.Reset()
	m.relays.Reset()
	m.leader.Set(0)
}
