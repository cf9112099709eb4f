package fetcher

import "github.com/prometheus/client_golang/prometheus"

// metrics are the fetcher's Prometheus series. Per-relay series are removed
// when the relay is dropped or its shard moves, so cardinality follows the
// relays this replica serves.
type metrics struct {
	connected      *prometheus.GaugeVec
	health         *prometheus.GaugeVec
	failures       *prometheus.GaugeVec
	attempts       *prometheus.CounterVec
	failureClasses *prometheus.CounterVec
	liveSubs       *prometheus.GaugeVec
	events         *prometheus.CounterVec
	dropped        *prometheus.CounterVec
	// skippedPublished counts copies not published because the stream
	// acknowledged the same Nats-Msg-Id moments ago (recentIDs).
	skippedPublished prometheus.Counter
	// heldBack counts copies a batch held back while another publisher's
	// copy was on its way (copyClaims), by how they ended.
	heldBack *prometheus.CounterVec
	// deferredHeld counts ids a reconciliation named that were deferred
	// (another copy acknowledged moments ago) and then found stored.
	deferredHeld prometheus.Counter
	// localSetReads counts local-set lists handed to reconciliations, by
	// source: store (read) or shared (read once for several; sharedLocalSet).
	localSetReads *prometheus.CounterVec
	bytesIn       *prometheus.CounterVec
	historicBytes *prometheus.CounterVec
	cooldowns     *prometheus.CounterVec
	pages         prometheus.Histogram
	fallbacks     *prometheus.CounterVec
	batches       *prometheus.CounterVec
	subClosed     *prometheus.CounterVec
	shards        prometheus.Gauge
	// shardReleases counts shards stopped, by why (releaseLabel).
	shardReleases *prometheus.CounterVec
	// crowdedSeconds and incompleteSlices count the one-second slices read
	// apart in REQ+EOSE history and those that could not be completed
	// (docs/decisions/0021-history-crowded-second.md).
	crowdedSeconds   prometheus.Counter
	incompleteSlices prometheus.Counter
	// batchesWaiting counts historic batches waiting for a turn
	// (Config.MaxRunningBatches).
	batchesWaiting prometheus.Gauge
	// limitRefusals counts refusals of a relay's budget, by kind
	// (relaylimits.Refusal: message_size, subscriptions, filters).
	limitRefusals *prometheus.CounterVec
	// liveBreakBeforeMake counts live replacements that closed the old
	// groups before the new were open, for lack of subscription slots.
	liveBreakBeforeMake prometheus.Counter
	// readRefusals counts reads relays refused (auth_required, restricted).
	readRefusals *prometheus.CounterVec
	// reqs counts the REQs sent to relays, by purpose (live, history,
	// ids) and the kind of batch a historic one reads for (reqBatchKind).
	reqs *prometheus.CounterVec
	// publishBytes is the bytes of event messages awaiting the events
	// stream's acknowledgement (Config.PublishMaxBytes).
	publishBytes prometheus.Gauge
	// sentBytes counts the bytes of the messages sent to relays, by
	// purpose (relayconn.Options.OnSent; sentPurposes).
	sentBytes *prometheus.CounterVec
	// sentMessages counts those messages, by the same purposes: a REQ
	// sent again whole by a consolidation is one live_merge message.
	sentMessages *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		connected: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "grasp_fetcher_relay_connected",
			Help: "1 while the relay has a connection session on this replica."}, []string{"relay"}),
		health: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "grasp_fetcher_relay_health_state",
			Help: "Relay health: 1 healthy, 2 backing off, 3 dead (grasp.v1.HealthState)."}, []string{"relay"}),
		failures: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "grasp_fetcher_relay_consecutive_failures",
			Help: "Failed attempts and lost sessions in the relay's current failure streak."}, []string{"relay"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grasp_fetcher_connect_attempts_total",
			Help: "Connection attempts by result: ok or the failure class."}, []string{"relay", "result"}),
		failureClasses: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grasp_fetcher_failures_total",
			Help: "Connection failures and lost sessions by class (dns, tls, refused, timeout, protocol, http_status, closed, address_refused)."}, []string{"relay", "class"}),
		liveSubs: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "grasp_fetcher_live_subscriptions",
			Help: "Open live subscriptions (REQs) per relay."}, []string{"relay"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grasp_fetcher_events_received_total",
			Help: "Events received from remote relays, by relay and mode (live, historic), whatever the policy later decides."}, []string{"relay", "mode"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grasp_fetcher_events_dropped_total",
			Help: "Events dropped by the structural checks before publishing, by reason."}, []string{"reason"}),
		skippedPublished: prometheus.NewCounter(prometheus.CounterOpts{Name: "grasp_fetcher_events_already_published_total",
			Help: "Event copies not published because the events stream acknowledged the same id and signature moments ago."}),
		heldBack: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grasp_fetcher_copies_held_back_total",
			Help: "Event copies a historic batch held back while another relay's copy was on its way to the events stream, by outcome: dropped (that copy was acknowledged) or published (it failed, or was not acknowledged within 5 s)."}, []string{"outcome"}),
		deferredHeld: prometheus.NewCounter(prometheus.CounterOpts{Name: "grasp_fetcher_negentropy_deferred_held_total",
			Help: "Ids a reconciliation named, whose events another relay's copy was bringing, found stored by the time they were asked for (not fetched)."}),
		localSetReads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grasp_fetcher_local_set_reads_total",
			Help: "Local sets (what we hold for a filter) handed to NIP-77 reconciliations, by source: store (listed from the store and the policy's refusals) or shared (a list read moments ago for the same filter, for another relay)."}, []string{"source"}),
		bytesIn: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grasp_fetcher_bytes_in_total",
			Help: "Bytes of every message received from the relay."}, []string{"relay"}),
		historicBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grasp_fetcher_historic_bytes_total",
			Help: "Bytes received for historic sync, by method: negentropy (NIP-77 messages and the id fetches they lead to) or req (REQ+EOSE pages)."}, []string{"method"}),
		cooldowns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grasp_fetcher_rate_limit_cooldowns_total",
			Help: "Rate-limit cooldowns started, per relay."}, []string{"relay"}),
		pages: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "grasp_fetcher_batch_pages",
			Help: "REQs per historic batch (history pages and id fetches).", Buckets: prometheus.ExponentialBuckets(1, 2, 12)}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grasp_fetcher_negentropy_fallbacks_total",
			Help: "Sessions that gave up NIP-77 for REQ+EOSE, by reason."}, []string{"reason"}),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grasp_fetcher_batches_total",
			Help: "Historic batches finished, by outcome and method."}, []string{"outcome", "method"}),
		subClosed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grasp_fetcher_subscriptions_closed_total",
			Help: "Subscriptions the relay closed (CLOSED), by mode."}, []string{"mode"}),
		shards: prometheus.NewGauge(prometheus.GaugeOpts{Name: "grasp_fetcher_shards_owned",
			Help: "Shards this replica holds the lease of."}),
		shardReleases: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grasp_fetcher_shard_releases_total",
			Help: "Shards this replica stopped serving, by reason: rebalanced, stopping, taken_over, gone (lease expired or deleted on the server), not_renewed (no renewal stored before the lease could expire)."}, []string{"reason"}),
		crowdedSeconds: prometheus.NewCounter(prometheus.CounterOpts{Name: "grasp_fetcher_crowded_seconds_total",
			Help: "One-second slices of REQ+EOSE history read on their own because a capped page fell entirely inside one second."}),
		incompleteSlices: prometheus.NewCounter(prometheus.CounterOpts{Name: "grasp_fetcher_incomplete_slices_total",
			Help: "One-second slices that still filled a capped page with nothing left to split: their batch is reported INCOMPLETE and retried, never confirmed."}),
		batchesWaiting: prometheus.NewGauge(prometheus.GaugeOpts{Name: "grasp_fetcher_batches_waiting",
			Help: "Historic batches waiting for a turn: GRASP_FETCHER_MAX_RUNNING_BATCHES are running across all relays."}),
		limitRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grasp_fetcher_limit_refusals_total",
			Help: "Refusals of a relay's budget (a 1009 close, a NOTICE or CLOSED), by kind: message_size, subscriptions, filters. Each lowers that relay's budget; none counts as a failure."}, []string{"kind"}),
		liveBreakBeforeMake: prometheus.NewCounter(prometheus.CounterOpts{Name: "grasp_fetcher_live_break_before_make_total",
			Help: "Live subscriptions replaced by closing the old ones first, because the relay's subscription budget had no slot for the new ones while both were open."}),
		readRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grasp_fetcher_read_refusals_total",
			Help: "Reads a relay refused (CLOSED auth-required: or restricted:), by kind; each is remembered for the relay and filter kind and asked again a day later."}, []string{"kind"}),
		reqs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grasp_fetcher_reqs_total",
			Help: "REQs sent to remote relays, by purpose (live: a live subscription opened or reopened; history: a page of a REQ+EOSE read; ids: an id fetch after a NIP-77 reconciliation) and batch (the historic batch's kind: layer1, items, catch_up, resync; empty for live)."}, []string{"purpose", "batch"}),
		publishBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "grasp_fetcher_publish_bytes_in_flight",
			Help: "Bytes of event messages published and not yet acknowledged by the events stream, all batches and live subscriptions together: bounded by GRASP_FETCHER_PUBLISH_MAX_BYTES."}),
		sentBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grasp_fetcher_sent_bytes_total",
			Help: "Bytes of the messages sent to remote relays, by purpose: REQs by what they read (history: a page of a REQ+EOSE read; ids: an id fetch after a NIP-77 reconciliation; live_new: a live set an items batch opens, with the history it carries (docs/decisions/0076-history-in-the-live-req.md); live_merge: a consolidation's merged set; live_replace: a ReplaceLive's whole set; live_repack: a live REQ opened again within a lowered budget; live_reopen: a live REQ opened again after the relay closed it; req_resent: a REQ sent again after a refusal of the relay's subscription count), other messages by their label (close, neg_open, neg_msg, neg_close, auth)."}, []string{"purpose"}),
		sentMessages: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grasp_fetcher_sent_messages_total",
			Help: "Messages sent to remote relays, by the purposes of grasp_fetcher_sent_bytes_total: how many live REQs were new sets and how many sent again what was already live (live_merge, live_replace, live_repack, live_reopen)."}, []string{"purpose"}),
	}
	if reg != nil {
		reg.MustRegister(m.connected, m.health, m.failures, m.attempts, m.failureClasses, m.liveSubs, m.events,
			m.dropped, m.skippedPublished, m.heldBack, m.deferredHeld, m.localSetReads, m.bytesIn, m.historicBytes, m.cooldowns, m.pages, m.fallbacks, m.batches, m.subClosed, m.shards,
			m.shardReleases, m.crowdedSeconds, m.incompleteSlices, m.batchesWaiting, m.limitRefusals, m.readRefusals, m.liveBreakBeforeMake, m.reqs, m.publishBytes, m.sentBytes, m.sentMessages)
	}
	return m
}

// forget removes a relay's series.
func (m *metrics) forget(relay string) {
	for _, v := range []*prometheus.GaugeVec{m.connected, m.health, m.failures, m.liveSubs} {
		v.DeleteLabelValues(relay)
	}
	for _, v := range []*prometheus.CounterVec{m.attempts, m.failureClasses, m.events, m.bytesIn, m.cooldowns} {
		v.DeletePartialMatch(prometheus.Labels{"relay": relay})
	}
}
