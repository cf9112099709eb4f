package ingester

import (
	"context"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
)

// Outcomes of one event that are not policy reasons.
const (
	outcomeStored     = "stored"
	outcomeDuplicate  = "duplicate"
	outcomeParked     = "parked"
	outcomeMalformed  = "malformed"  // not nostr event JSON
	outcomeUnstorable = "unstorable" // accepted, but the backend cannot hold it
)

// Stats is a snapshot of the ingester's counters.
type Stats struct {
	Consumed     int64
	Verified     int64
	Stored       int64
	Duplicates   int64
	Parked       int64
	Unparked     int64
	DeadLettered int64
	// Refused counts refusals by reason (policy reasons, malformed,
	// unstorable); duplicates and parked events are not refusals here.
	Refused map[string]int64
}

// metrics are the ingester's Prometheus metrics plus the same counts kept
// for Stats.
type metrics struct {
	consumed, verified, stored, duplicates, parked prometheus.Counter
	// sweepStored counts parked events stored by a sweep rather than a
	// wake-up: each one is a wake-up that was lost.
	sweepStored                     prometheus.Counter
	unparked, refused, deadLettered *prometheus.CounterVec
	pending, ackPending, outage     prometheus.Gauge
	// inFlight is the bytes of messages between the read stage and their
	// settlement (Config.MaxBytes' pipeline share).
	inFlight prometheus.Gauge
	latency  prometheus.Histogram
	// stage is where an event's time goes on its way to the store, one
	// series per hop (the stage* constants): one look at it names the slow
	// hop (docs/metrics.md, "Where events wait").
	stage *prometheus.HistogramVec

	nConsumed, nVerified, nStored, nDuplicates, nParked, nUnparked, nDead atomic.Int64

	mu       sync.Mutex
	nRefused map[string]int64
}

func newMetrics(reg prometheus.Registerer) *metrics {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "grasp_ingester_" + name, Help: help})
	}
	m := &metrics{
		consumed:   counter("consumed_total", "Events taken from the events stream, each event of a batch message counted (redeliveries included)."),
		verified:   counter("verified_total", "Events whose id and signature verified."),
		stored:     counter("stored_total", "Events stored (and published on grasp.stored.<kind>)."),
		duplicates: counter("duplicates_total", "Events skipped because they were already stored."),
		parked:     counter("parked_total", "Events parked because something they reference had not arrived."),
		sweepStored: counter("park_sweep_stored_total",
			"Parked events stored by the periodic sweep rather than a wake-up (each is a wake-up that was lost)."),
		unparked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grasp_ingester_unparked_total", Help: "Parked events re-evaluated and taken out of the lot, by outcome.",
		}, []string{"outcome"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "grasp_ingester_in_flight_bytes",
			Help: "Bytes of events-stream messages read and not yet settled (acked, nak'ed or dead-lettered): the pipeline's share of GRASP_INGESTER_MAX_BYTES."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grasp_ingester_refused_total", Help: "Events refused, by reason (policy reason, malformed or unstorable).",
		}, []string{"reason"}),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grasp_ingester_dead_lettered_total", Help: "Messages moved to the dead-letter stream after MaxDeliver failed deliveries, by subject family.",
		}, []string{"reason"}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "grasp_ingester_consumer_pending", Help: "Consumer lag: events in the stream not yet delivered to any ingester.",
		}),
		ackPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "grasp_ingester_consumer_ack_pending", Help: "Events delivered to ingesters and not yet acknowledged.",
		}),
		outage: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "grasp_ingester_store_outage", Help: "1 while this replica holds messages because the store is unreachable.",
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "grasp_ingester_fetch_to_stored_seconds",
			Help:    "Time from the fetcher publishing an event to the events stream (the message's stream timestamp) to its storage.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18), // 1 ms … ~2 min
		}),
		stage: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "grasp_ingester_stage_seconds",
			Help: "Time spent in each hop on the way to the store, by stage: fetch (read off the relay to the stream's timestamp, per message), " +
				"queue (the stream and this replica's read buffer, per message), verify (decode and signatures, per ingest batch), " +
				"handoff (a verified batch waiting for the decide stage), decide (policy, store write, acks, per ingest batch), store (the write alone).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 20), // 0.5 ms … ~4 min
		}, []string{"stage"}),
		nRefused: map[string]int64{},
	}
	if reg != nil {
		reg.MustRegister(m.inFlight, m.consumed, m.verified, m.stored, m.duplicates, m.parked, m.unparked, m.refused,
			m.deadLettered, m.pending, m.ackPending, m.outage, m.latency, m.sweepStored, m.stage)
	}
	return m
}

// The stages of grasp_ingester_stage_seconds, in the order an event meets
// them.
const (
	stageFetch   = "fetch"
	stageQueue   = "queue"
	stageVerify  = "verify"
	stageHandoff = "handoff"
	stageDecide  = "decide"
	stageStore   = "store"
)

// observeStage records d for stage; a negative d (clocks of two hosts
// disagreeing) counts as zero rather than vanishing.
func (m *metrics) observeStage(stage string, d time.Duration) {
	m.stage.WithLabelValues(stage).Observe(max(d, 0).Seconds())
}

// observeArrival records a delivered message's fetch and queue stages: from
// the fetcher reading its first event to the stream's timestamp, and from
// there to taken, when the verify stage took it.
func (m *metrics) observeArrival(msg jetstream.Msg, taken time.Time) {
	md, err := msg.Metadata()
	if err != nil {
		return
	}
	if read, ok := bus.ReadAt(msg.Headers()); ok {
		m.observeStage(stageFetch, md.Timestamp.Sub(read))
	}
	m.observeStage(stageQueue, taken.Sub(md.Timestamp))
}

func (m *metrics) incConsumed() { m.consumed.Inc(); m.nConsumed.Add(1) }
func (m *metrics) incVerified() { m.verified.Inc(); m.nVerified.Add(1) }

func (m *metrics) storedAfter(d time.Duration) {
	m.stored.Inc()
	m.nStored.Add(1)
	if d >= 0 {
		m.latency.Observe(d.Seconds())
	}
}

func (m *metrics) incStoredNoLatency() { m.stored.Inc(); m.nStored.Add(1) }
func (m *metrics) incDuplicate()       { m.duplicates.Inc(); m.nDuplicates.Add(1) }
func (m *metrics) incParked()          { m.parked.Inc(); m.nParked.Add(1) }

func (m *metrics) incUnparked(outcome string) {
	m.unparked.WithLabelValues(outcome).Inc()
	m.nUnparked.Add(1)
}

func (m *metrics) incRefused(reason string) {
	m.refused.WithLabelValues(reason).Inc()
	m.mu.Lock()
	m.nRefused[reason]++
	m.mu.Unlock()
}

func (m *metrics) incDeadLettered(reason string) {
	m.deadLettered.WithLabelValues(reason).Inc()
	m.nDead.Add(1)
}

func (m *metrics) snapshot() Stats {
	m.mu.Lock()
	refused := maps.Clone(m.nRefused)
	m.mu.Unlock()
	return Stats{
		Consumed: m.nConsumed.Load(), Verified: m.nVerified.Load(), Stored: m.nStored.Load(),
		Duplicates: m.nDuplicates.Load(), Parked: m.nParked.Load(), Unparked: m.nUnparked.Load(),
		DeadLettered: m.nDead.Load(), Refused: refused,
	}
}

// publishedAt is when the fetcher published the message's event to the
// events stream: the stream's timestamp of the message, milliseconds after
// the fetcher read it from the relay (a page or a live burst is published
// as soon as it ends). No header carries an earlier time.
func publishedAt(msg jetstream.Msg) time.Time {
	if md, err := msg.Metadata(); err == nil {
		return md.Timestamp
	}
	return time.Time{}
}

// watchLag refreshes the consumer lag gauges every LagInterval.
func (i *Ingester) watchLag(ctx context.Context, cons jetstream.Consumer) {
	for {
		if info, err := cons.Info(ctx); err == nil {
			i.m.pending.Set(float64(info.NumPending))
			i.m.ackPending.Set(float64(info.NumAckPending))
			if i.target != nil {
				i.target.SetBacklog(int64(info.NumPending) + int64(info.NumAckPending))
			}
		} else if ctx.Err() == nil {
			i.log.Debug("consumer info failed", "consumer", i.cfg.Consumer, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-i.clk.After(i.cfg.LagInterval):
		}
	}
}
