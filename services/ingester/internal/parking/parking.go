// Package parking keeps synced events that the write policy refused only
// because something they reference has not been stored yet (a comment before
// its issue, an issue before its repository's announcement, a maintainer's
// announcement before the owner's, a state before its announcement), and
// finds them again when an event they could depend on is stored.
//
// Synced data arrives in any order (negentropy, parallel relays, several
// ingester replicas), so this is required for completeness. The lot lives in
// JetStream, not in process memory, so every ingester replica sees every
// parked event and a restart loses nothing:
//
//   - stream <PREFIX>_PARKED, one message per parked event on
//     <prefix>.parked.event.<id> (the event and why it waits);
//   - stream <PREFIX>_PARKED_WAKE, one empty message per (reference, parked
//     event) on <prefix>.parked.wake.<token>.<id>, so the events waiting for
//     a reference are found with one subject-filtered stream-info request.
//
// Plain streams rather than a KV bucket, because a KV bucket discards new
// writes when full while the lot must evict its oldest entries first, which
// a stream with MaxMsgs and DiscardOld does by itself. Expiry is swept by
// Run on the injected clock (so it is counted, and testable without sleeping);
// the streams' MaxAge is only a backstop.
package parking

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nbd-wtf/go-nostr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/config"
	"github.com/grasp-sync/grasp-sync/pkg/nip34"
)

// Config bounds the lot. Services embed it anonymously in their own
// configuration, so its variables read GRASP_PARKING_*. Fields tagged
// ignored:"true" are not read from the environment: the default tag is the
// value, and tests set them in code.
type Config struct {
	// MaxEvents bounds the parked events; parking beyond it evicts the
	// oldest first.
	MaxEvents int `envconfig:"PARKING_MAX_EVENTS" default:"100000"`
	// MaxAge is how long an event stays parked.
	MaxAge time.Duration `envconfig:"PARKING_MAX_AGE" default:"1h"`
	// MaxWakeKeys bounds the references one parked event waits on (its own
	// id and coordinate included): a hostile event naming hundreds of
	// unknown ids cannot make the wake index grow with it.
	MaxWakeKeys int `ignored:"true" default:"16"`
	// MaxSignals bounds the references of a stored event that are looked up
	// (one request each) to find the parked events it unblocks.
	MaxSignals int `ignored:"true" default:"32"`
	// SweepInterval is how often Run removes expired events.
	SweepInterval time.Duration `ignored:"true" default:"1m"`
	// Replicas of the two streams (3 in a cluster).
	Replicas int `envconfig:"PARKING_REPLICAS" default:"1"`
}

// DefaultConfig returns the defaults: 100,000 events for 1 h.
func DefaultConfig() Config { return Config{}.withDefaults() }

// withDefaults fills zero fields from their default tags. Fewer than two
// wake keys or signals cannot hold an event's own id and coordinate, so
// those take the default too.
func (c Config) withDefaults() Config {
	if c.MaxWakeKeys < 2 {
		c.MaxWakeKeys = 0
	}
	if c.MaxSignals < 2 {
		c.MaxSignals = 0
	}
	config.FillDefaults(&c)
	return c
}

// backstop is added to MaxAge for the streams' own expiry, which only
// catches what Run did not sweep (no ingester running).
const backstop = 10 * time.Minute

// Parked is one parked event.
type Parked struct {
	// Event is the event as received.
	Event *nostr.Event
	// Reason is the policy's machine-readable refusal reason.
	Reason string
	// Missing lists what the refusal said was missing.
	Missing []string
	// Relay is where the event was fetched from (for logs).
	Relay string
	// ParkedAt is when it was first parked (the lot's clock).
	ParkedAt time.Time

	seq uint64
}

// record is the stored form of a parked event.
type record struct {
	Event    json.RawMessage `json:"event"`
	Reason   string          `json:"reason"`
	Missing  []string        `json:"missing,omitempty"`
	Relay    string          `json:"relay,omitempty"`
	ParkedAt int64           `json:"parked_at"` // Unix nanoseconds
}

// Lot is the parking lot. Safe for concurrent use by any number of
// goroutines and processes.
type Lot struct {
	cfg    Config
	names  bus.Names
	events jetstream.Stream
	wake   jetstream.Stream
	js     jetstream.JetStream
	clock  clock.Clock
	log    *slog.Logger

	parked   prometheus.Counter
	evicted  prometheus.Counter
	expired  prometheus.Counter
	unparked *prometheus.CounterVec
	size     prometheus.Gauge
}

// Open creates (or updates) the lot's streams and returns the lot. reg may
// be nil.
func Open(ctx context.Context, b *bus.Bus, cfg Config, clk clock.Clock, log *slog.Logger, reg prometheus.Registerer) (*Lot, error) {
	cfg = cfg.withDefaults()
	if clk == nil {
		clk = clock.Real{}
	}
	if log == nil {
		log = slog.Default()
	}
	l := &Lot{
		cfg: cfg, names: b.Names, js: b.JS, clock: clk, log: log.With("component", "parking"),
		parked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "grasp_parking_parked_total", Help: "Events parked because something they reference had not arrived.",
		}),
		evicted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "grasp_parking_evicted_total", Help: "Parked events evicted (oldest first) to stay within the count limit.",
		}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "grasp_parking_expired_total", Help: "Parked events dropped after waiting longer than the age limit.",
		}),
		unparked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grasp_parking_unparked_total", Help: "Parked events taken out of the lot after re-evaluation, by outcome.",
		}, []string{"outcome"}),
		size: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "grasp_parking_events", Help: "Events currently parked (as last seen by this process).",
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{l.parked, l.evicted, l.expired, l.unparked, l.size} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("parking metrics: %w", err)
			}
		}
	}
	maxAge := cfg.MaxAge + backstop
	// EnsureStream: replicas starting together in a cluster race on these
	// creates, and a lost answer must not end the process.
	var err error
	l.events, err = bus.EnsureStream(ctx, b.JS, jetstream.StreamConfig{
		Name:        b.Names.ParkedStream(),
		Description: "events waiting for something they reference (pkg/parking)",
		Subjects:    []string{b.Names.ParkedSubjects()},
		// A small slack over MaxEvents: Park evicts (and counts) first, the
		// stream limit only guards against races between replicas.
		MaxMsgs:           int64(cfg.MaxEvents) + int64(cfg.MaxEvents/100) + 10,
		MaxMsgsPerSubject: 1,
		Discard:           jetstream.DiscardOld,
		MaxAge:            maxAge,
		Replicas:          cfg.Replicas,
		Storage:           jetstream.FileStorage,
	})
	if err != nil {
		return nil, err // EnsureStream names the stream
	}
	l.wake, err = bus.EnsureStream(ctx, b.JS, jetstream.StreamConfig{
		Name:              b.Names.ParkedWakeStream(),
		Description:       "wake-up index of parked events: reference token → parked event id (pkg/parking)",
		Subjects:          []string{b.Names.ParkedWakeSubjects("")},
		MaxMsgs:           int64(cfg.MaxEvents) * int64(cfg.MaxWakeKeys),
		MaxMsgsPerSubject: 1,
		Discard:           jetstream.DiscardOld,
		MaxAge:            maxAge,
		Replicas:          cfg.Replicas,
		Storage:           jetstream.FileStorage,
	})
	if err != nil {
		return nil, err
	}
	return l, nil
}

// Park puts a refused event in the lot with what its refusal said was
// missing, and returns its handle for Unpark. It reports false when the
// event is parked already (its age is not reset). Parking beyond MaxEvents first evicts the oldest parked
// events.
//
// A caller must re-evaluate the event once after Park returns: an event it
// waits for may have been stored between the refusal and the park, and that
// event's wake-up looked before the park was visible.
func (l *Lot) Park(ctx context.Context, evt *nostr.Event, reason string, missing []string, relay string) (Parked, bool, error) {
	if !nip34.IsEventID(evt.ID) {
		return Parked{}, false, fmt.Errorf("park: invalid event id %q", evt.ID)
	}
	raw, err := json.Marshal(evt)
	if err != nil {
		return Parked{}, false, fmt.Errorf("park %s: %w", evt.ID, err)
	}
	if len(missing) > l.cfg.MaxWakeKeys {
		missing = missing[:l.cfg.MaxWakeKeys]
	}
	p := Parked{Event: evt, Reason: reason, Missing: missing, Relay: relay, ParkedAt: time.Unix(0, l.clock.Now().UnixNano())}
	data, err := json.Marshal(record{Event: raw, Reason: reason, Missing: missing, Relay: relay, ParkedAt: p.ParkedAt.UnixNano()})
	if err != nil {
		return Parked{}, false, fmt.Errorf("park %s: %w", evt.ID, err)
	}
	if err := l.makeRoom(ctx); err != nil {
		return Parked{}, false, err
	}
	// Wake entries first: an event entry without its wake entries could not
	// be found, wake entries without an event are pruned when hit.
	for _, t := range WakeTokens(evt, missing, l.cfg.MaxWakeKeys) {
		if _, err := l.js.Publish(ctx, l.names.ParkedWakeSubject(t, evt.ID), nil); err != nil {
			return Parked{}, false, fmt.Errorf("park %s: wake entry %s: %w", evt.ID, t, err)
		}
	}
	ack, err := l.js.Publish(ctx, l.names.ParkedSubject(evt.ID), data, jetstream.WithExpectLastSequencePerSubject(0))
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return Parked{}, false, nil
	}
	if err != nil {
		return Parked{}, false, fmt.Errorf("park %s: %w", evt.ID, err)
	}
	l.parked.Inc()
	p.seq = ack.Sequence
	return p, true, nil
}

// makeRoom evicts the oldest parked events while the lot is full.
func (l *Lot) makeRoom(ctx context.Context) error {
	for {
		info, err := l.events.Info(ctx)
		if err != nil {
			return fmt.Errorf("parking: stream info: %w", err)
		}
		l.size.Set(float64(info.State.Msgs))
		if info.State.Msgs < uint64(l.cfg.MaxEvents) {
			return nil
		}
		p, err := l.oldest(ctx)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if l.remove(ctx, p) {
			l.evicted.Inc()
			l.log.Debug("parked event evicted", "id", p.Event.ID, "kind", p.Event.Kind, "relay", p.Relay)
		}
	}
}

// oldest returns the first parked event in the stream.
func (l *Lot) oldest(ctx context.Context) (Parked, error) {
	msg, err := l.events.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(l.names.ParkedSubjects()))
	if err != nil {
		return Parked{}, err
	}
	return l.decode(msg)
}

func (l *Lot) decode(msg *jetstream.RawStreamMsg) (Parked, error) {
	var r record
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		return Parked{seq: msg.Sequence, Event: &nostr.Event{ID: strings.TrimPrefix(msg.Subject, l.names.ParkedSubject(""))}},
			fmt.Errorf("parked message %d: %w", msg.Sequence, err)
	}
	var evt nostr.Event
	if err := json.Unmarshal(r.Event, &evt); err != nil {
		return Parked{seq: msg.Sequence, Event: &nostr.Event{ID: strings.TrimPrefix(msg.Subject, l.names.ParkedSubject(""))}},
			fmt.Errorf("parked message %d: event: %w", msg.Sequence, err)
	}
	return Parked{Event: &evt, Reason: r.Reason, Missing: r.Missing, Relay: r.Relay, ParkedAt: time.Unix(0, r.ParkedAt), seq: msg.Sequence}, nil
}

// remove deletes a parked event and its wake entries; false when another
// process removed it first.
func (l *Lot) remove(ctx context.Context, p Parked) bool {
	// An error here is almost always another replica having removed the
	// event first; the wake entries are purged either way.
	err := l.events.DeleteMsg(ctx, p.seq)
	if err != nil {
		l.log.Debug("remove parked event", "id", p.Event.ID, "seq", p.seq, "err", err)
	}
	if p.Event != nil && nip34.IsEventID(p.Event.ID) {
		if err := l.wake.Purge(ctx, jetstream.WithPurgeSubject(l.names.ParkedWakeSubject("*", p.Event.ID))); err != nil {
			l.log.Warn("purge wake entries", "id", p.Event.ID, "err", err)
		}
	}
	return err == nil
}

// Waiting returns the parked events that the newly stored event stored
// could unblock: those waiting for its id or coordinate, and those it
// references (accepted by forward reference). Wake entries whose event is
// gone (expired, evicted, unparked) are pruned on the way.
func (l *Lot) Waiting(ctx context.Context, stored *nostr.Event) ([]Parked, error) {
	seen := map[string]bool{}
	var out []Parked
	for _, t := range Signals(stored, l.cfg.MaxSignals) {
		info, err := l.wake.Info(ctx, jetstream.WithSubjectFilter(l.names.ParkedWakeSubjects(t)))
		if err != nil {
			return out, fmt.Errorf("parking: look up waiters of %s: %w", t, err)
		}
		for subj := range info.State.Subjects {
			id := subj[strings.LastIndexByte(subj, '.')+1:]
			if seen[id] {
				continue
			}
			seen[id] = true
			msg, err := l.events.GetLastMsgForSubject(ctx, l.names.ParkedSubject(id))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				// Stale wake entry: the event left the lot.
				if err := l.wake.Purge(ctx, jetstream.WithPurgeSubject(l.names.ParkedWakeSubject("*", id))); err != nil {
					l.log.Warn("purge stale wake entries", "id", id, "err", err)
				}
				continue
			}
			if err != nil {
				return out, fmt.Errorf("parking: get parked %s: %w", id, err)
			}
			p, err := l.decode(msg)
			if err != nil {
				l.log.Warn("undecodable parked event dropped", "id", id, "err", err)
				l.remove(ctx, p)
				continue
			}
			out = append(out, p)
		}
	}
	return out, nil
}

// Scan returns up to limit parked events in parking order, starting at stream
// sequence from (0 or 1: the oldest), and the sequence to resume at; next is
// 0 once the end of the lot is reached. It lets a caller re-evaluate the
// whole lot a bounded slice at a time, the safety net for wake-ups that
// were lost (a core-NATS notice buffered in a replica that died). Events
// parked meanwhile get higher sequences, so a scan that wraps around sees
// every event that stays parked. Undecodable entries are dropped on the way.
func (l *Lot) Scan(ctx context.Context, from uint64, limit int) (parked []Parked, next uint64, err error) {
	seq := from
	if seq == 0 {
		seq = 1
	}
	for len(parked) < limit {
		msg, err := l.events.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(l.names.ParkedSubjects()))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return parked, 0, nil
		}
		if err != nil {
			return parked, seq, fmt.Errorf("parking: scan from %d: %w", seq, err)
		}
		seq = msg.Sequence + 1
		p, err := l.decode(msg)
		if err != nil {
			l.log.Warn("undecodable parked event dropped", "id", p.Event.ID, "err", err)
			l.remove(ctx, p)
			continue
		}
		parked = append(parked, p)
	}
	return parked, seq, nil
}

// Unpark takes a re-evaluated event out of the lot; outcome labels the
// metric ("stored", "refused", ...).
func (l *Lot) Unpark(ctx context.Context, p Parked, outcome string) {
	if l.remove(ctx, p) {
		l.unparked.WithLabelValues(outcome).Inc()
	}
}

// Len returns how many events are parked.
func (l *Lot) Len(ctx context.Context) (int, error) {
	info, err := l.events.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("parking: stream info: %w", err)
	}
	l.size.Set(float64(info.State.Msgs))
	return int(info.State.Msgs), nil
}

// Run sweeps expired events every SweepInterval until ctx is done. Every
// replica may run it; each expired event is removed and counted once.
func (l *Lot) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-l.clock.After(l.cfg.SweepInterval):
		}
		if _, err := l.Sweep(ctx); err != nil && ctx.Err() == nil {
			l.log.Warn("parking sweep failed", "err", err)
		}
	}
}

// Sweep removes the events parked longer than MaxAge ago, oldest first, and
// returns how many it removed.
func (l *Lot) Sweep(ctx context.Context) (int, error) {
	deadline := l.clock.Now().Add(-l.cfg.MaxAge)
	n := 0
	for {
		p, err := l.oldest(ctx)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil && p.seq == 0 {
			return n, err
		}
		if err == nil && p.ParkedAt.After(deadline) {
			break
		}
		if l.remove(ctx, p) {
			n++
			l.expired.Inc()
			if p.Event != nil {
				l.log.Debug("parked event expired", "id", p.Event.ID, "kind", p.Event.Kind, "relay", p.Relay, "reason", p.Reason)
			}
		}
	}
	_, err := l.Len(ctx)
	return n, err
}
