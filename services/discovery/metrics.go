package discovery

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are discovery's Prometheus series. Gauges describing the index
// are set at each batch by the goroutine that owns the index.
type metrics struct {
	repos      prometheus.Gauge
	roots      prometheus.Gauge
	relays     prometheus.Gauge
	batches    prometheus.Counter
	batchSize  prometheus.Histogram
	batchKeys  prometheus.Histogram
	writes     prometheus.Counter
	refused    *prometheus.CounterVec
	connected  prometheus.Gauge
	leader     prometheus.Gauge
	eventsSeen prometheus.Counter
	// storedSeen and storedDropped count the stored-event announcements
	// received from NATS and those dropped because the queue was full.
	storedSeen    prometheus.Counter
	storedDropped prometheus.Counter
	// historyIncomplete counts history reads that could not read some
	// one-second slice completely (see docs/decisions/0021-history-crowded-second.md).
	historyIncomplete prometheus.Counter
	// feedGapRereads counts sessions ended to read the whole history
	// because NATS reconnected while they were live.
	feedGapRereads prometheus.Counter
	// archived, overLimit and overLimitTotal describe the archive
	// (GRASP-05): archived repositories in the index, candidates left out
	// by GRASP_ARCHIVE_MAX_REPOS now, and each time one was left out.
	archived       prometheus.Gauge
	overLimit      prometheus.Gauge
	overLimitTotal prometheus.Counter

	// batchEvents counts events applied since the last flush (owned by the
	// active session's goroutine).
	batchEvents int
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		repos:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "grasp_discovery_repos_indexed", Help: "Repositories in the RepoSyncIndex (hosted: their announcement lists this service)."}),
		roots:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "grasp_discovery_root_events_indexed", Help: "Root events (1617/1618/1621) attached to indexed repositories, counted once per repository."}),
		relays: prometheus.NewGauge(prometheus.GaugeOpts{Name: "grasp_discovery_relays_referenced", Help: "Distinct relays listed by indexed repositories."}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{Name: "grasp_discovery_batches_total",
			Help: "Index update batches (one per batch window, plus one at the end of each history read)."}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "grasp_discovery_batch_events",
			Help: "Events folded into the index per batch.", Buckets: prometheus.ExponentialBuckets(1, 4, 10)}),
		batchKeys: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "grasp_discovery_batch_changed_keys",
			Help: "Index keys written or deleted per batch.", Buckets: prometheus.ExponentialBuckets(1, 4, 10)}),
		writes: prometheus.NewCounter(prometheus.CounterOpts{Name: "grasp_discovery_index_writes_total", Help: "Keys written or deleted in the repo index."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grasp_discovery_refused_relay_urls_total",
			Help: "Relay URLs of announcements not used, by reason (scheme, credentials, too_long, malformed, private_address, too_many)."}, []string{"reason"}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{Name: "grasp_discovery_self_subscription_connected", Help: "1 while the live self-subscription to the own relay is up."}),
		leader:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "grasp_discovery_leader", Help: "1 while this instance holds the discovery lease."}),
		eventsSeen: prometheus.NewCounter(prometheus.CounterOpts{Name: "grasp_discovery_events_total",
			Help: "Events received from the self-subscription (history and live)."}),
		storedSeen: prometheus.NewCounter(prometheus.CounterOpts{Name: "grasp_discovery_stored_events_total",
			Help: "Stored-event announcements (grasp.stored.<kind>) received from the writers over NATS."}),
		storedDropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "grasp_discovery_stored_events_dropped_total",
			Help: "Stored-event announcements dropped because discovery's queue was full (harmless while the live self-subscription stays up; if it is lost, the next session reads the whole history)."}),
		historyIncomplete: prometheus.NewCounter(prometheus.CounterOpts{Name: "grasp_discovery_history_incomplete_total",
			Help: "Self-subscription history reads that left a one-second slice incomplete (more events in one second than the own relay returns per REQ, and no NIP-77): the read is retried after the reconnect backoff and discovery does not report ready."}),
		feedGapRereads: prometheus.NewCounter(prometheus.CounterOpts{Name: "grasp_discovery_feed_gap_rereads_total",
			Help: "Self-subscription sessions ended to read the whole history because NATS reconnected while they were live (the stored-event feed, and likely the own relay's broadcast, lost announcements)."}),
		archived: prometheus.NewGauge(prometheus.GaugeOpts{Name: "grasp_discovery_archived_repos",
			Help: "Archived repositories in the RepoSyncIndex (GRASP-05: their announcement does not list this service but matches GRASP_ARCHIVE_WHITELIST or GRASP_ARCHIVE_ALL); included in grasp_discovery_repos_indexed."}),
		overLimit: prometheus.NewGauge(prometheus.GaugeOpts{Name: "grasp_discovery_archive_over_limit",
			Help: "Repositories that match the archive settings only by an identifier entry or GRASP_ARCHIVE_ALL and are not synced because GRASP_ARCHIVE_MAX_REPOS such repositories already are."}),
		overLimitTotal: prometheus.NewCounter(prometheus.CounterOpts{Name: "grasp_discovery_archive_over_limit_total",
			Help: "Times an archive candidate was left out by GRASP_ARCHIVE_MAX_REPOS (each announcement version once)."}),
	}
	for _, r := range []string{RefusedScheme, RefusedCredentials, RefusedTooLong, RefusedMalformed, RefusedInternal, RefusedTooMany} {
		m.refused.WithLabelValues(r) // export zeros so rates work from the start
	}
	if reg != nil {
		reg.MustRegister(m.repos, m.roots, m.relays, m.batches, m.batchSize, m.batchKeys, m.writes, m.refused, m.connected, m.leader, m.eventsSeen, m.storedSeen, m.storedDropped, m.historyIncomplete, m.feedGapRereads,
			m.archived, m.overLimit, m.overLimitTotal)
	}
	return m
}

// observeBatch records one written batch and refreshes the index gauges.
func (m *metrics) observeBatch(events, changedKeys int, t *term) {
	m.batches.Inc()
	m.batchSize.Observe(float64(events))
	m.batchKeys.Observe(float64(changedKeys))
	m.writes.Add(float64(changedKeys))
	st := t.index.Stats()
	m.repos.Set(float64(st.Repos))
	m.roots.Set(float64(st.RootEvents))
	m.relays.Set(float64(st.Relays))
	m.archived.Set(float64(st.Archived))
	m.overLimit.Set(float64(st.OverLimit))
	if d := t.index.OverLimitTotal - t.overLimit; d > 0 {
		m.overLimitTotal.Add(float64(d))
		t.log.Warn("archive bound reached: repositories matched by an identifier entry or GRASP_ARCHIVE_ALL are stored but not synced",
			"left_out", d, "not_synced_now", st.OverLimit, "archived", st.Archived, "GRASP_ARCHIVE_MAX_REPOS", t.index.rules.MaxArchived)
	}
	t.overLimit = t.index.OverLimitTotal
	for reason, n := range t.index.Refused {
		if d := n - t.refused[reason]; d > 0 {
			m.refused.WithLabelValues(reason).Add(float64(d))
		}
		t.refused[reason] = n
	}
}
