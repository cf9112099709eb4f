// Package ingester turns raw events fetched from remote relays into stored
// events: it verifies each event's id and signature, applies the GRASP write
// policy, stores what is accepted, and publishes it on grasp.stored.<kind> so
// relay replicas broadcast it and discovery sees new roots.
//
// Every replica attaches to one durable pull consumer on GRASP_EVENTS, so the
// replicas share the stream. Messages are handled in batches (see
// pipeline.go): signatures, the dominant cost, are verified in parallel
// (copies of stored events skip it), then the policy decides the batch in
// order and the accepted events are written with one SaveBatch; each message
// is acked only once its event is stored or definitively refused.
// Store outages hold messages in flight (no ack, no redelivery count) until
// the store answers again; a message that fails while the store is healthy
// is redelivered, and after MaxDeliver deliveries moved to the dead-letter
// stream.
package ingester

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nbd-wtf/go-nostr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/config"
	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/policy"
	"github.com/grasp-sync/grasp-sync/pkg/rejected"
	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/services/ingester/internal/parking"
	"github.com/grasp-sync/grasp-sync/services/ingester/target"
)

// Config is the ingester's configuration (GRASP_* variables). Fields
// tagged ignored:"true" are not read from the environment: their default
// tag is the value (filled by withDefaults), and tests set them in code.
// They were variables once; docs/configuration.md, "No longer read", lists
// them.
type Config struct {
	// Consumer is the durable consumer name shared by all ingester replicas.
	Consumer string `ignored:"true" default:"ingester"`
	// MaxDeliver bounds the deliveries of a message that keeps failing for
	// infrastructure reasons while the store is otherwise healthy; the last
	// failure moves it to the dead-letter stream. Deliveries during a store
	// outage do not count: those messages are held, not redelivered.
	MaxDeliver int `envconfig:"INGESTER_MAX_DELIVER" default:"20"`
	// AckWait is how long one event may take before it is redelivered.
	AckWait time.Duration `envconfig:"INGESTER_ACK_WAIT" default:"30s"`
	// Workers verify the signatures of a batch in parallel; 0 means two
	// per CPU (at least four). At most one per core is used: verification
	// is CPU-bound, and store and NATS waits happen in another stage.
	Workers int `envconfig:"INGESTER_WORKERS" default:"0"`
	// FetchBatch is the most events decided and written together (one
	// verify and one decide batch); the memory this replica holds is
	// bounded by MaxBytes.
	FetchBatch int `envconfig:"INGESTER_FETCH_BATCH" default:"256"`
	// MaxBytes bounds the bytes of events-stream messages this replica holds at once, from the pull to their acknowledgement (pulled, waiting, being verified, decided or written), such as 8MiB: a message carries from one event to a batch of 64, so a count of messages bounds nothing. A pull asks for at most a quarter of it; it must be at least 4 × the NATS server's max payload (1MiB by default), or the replica would stall on a message larger than a pull. The stream holds the backlog, so more does not ingest faster (docs/decisions/0065-work-in-flight-bounded-by-bytes.md).
	MaxBytes config.ByteSize `envconfig:"INGESTER_MAX_BYTES" default:"8MiB"`
	// RetryDelay is how long a message that failed while the store was
	// healthy waits before its redelivery.
	RetryDelay time.Duration `ignored:"true" default:"1s"`
	// OutageBackoffMax caps the wait between store probes during an outage
	// (the wait starts at 50 ms and doubles).
	OutageBackoffMax time.Duration `ignored:"true" default:"5s"`
	// LagInterval is how often the consumer lag gauges are refreshed.
	LagInterval time.Duration `envconfig:"INGESTER_LAG_INTERVAL" default:"5s"`
	// ParkSweep is how often every parked event is re-evaluated whatever
	// the wake-ups said: the safety net for a wake-up that was lost (a
	// grasp.stored notice buffered in a replica that died, an event stored
	// by a writer that died before announcing it), so no parked event waits
	// longer than about this (times lot size / ParkSweepMax) for a
	// dependency that is stored.
	ParkSweep time.Duration `ignored:"true" default:"30s"`
	// ParkSweepMax bounds the parked events one sweep re-evaluates; a
	// larger lot is covered over several sweeps, resuming where the last
	// one stopped.
	ParkSweepMax int `ignored:"true" default:"1000"`
	// Parking bounds the lot of events waiting for what they reference
	// (GRASP_PARKING_*).
	parking.Config
	// Limits are the write policy's limits (GRASP_POLICY_*), the same the
	// relay applies to client events.
	policy.Limits
	// Archive names the repositories accepted although their
	// announcements do not list us (GRASP_ARCHIVE_*, GRASP-05), the same
	// settings the relay, discovery and the planner use.
	policy.Archive
	// Settings, when GRASP_TARGET_RELAY is set, make the ingester publish
	// accepted events to that relay and keep its store as a mirror of what
	// the target holds (bolt-on mode, services/ingester/target).
	target.Settings
}

// Validate checks the bolt-on settings: among them that the wait for the
// target's OK ends well before the message would be redelivered.
func (c *Config) Validate() error {
	if err := c.Settings.Validate(); err != nil {
		return err
	}
	d := c.withDefaults()
	if d.Settings.Enabled() && d.Settings.Timeout > d.AckWait/2 {
		return config.Invalid("TARGET_TIMEOUT", d.Settings.Timeout, fmt.Sprintf("must be at most half of GRASP_INGESTER_ACK_WAIT (%s)", d.AckWait))
	}
	return nil
}

// withDefaults fills zero fields (the parking and policy ones too) from their
// default tags, so a Config built in code (tests, graspd) behaves like one
// read from the environment; Workers' default depends on the CPUs.
func (c Config) withDefaults() Config {
	config.FillDefaults(&c)
	if c.Workers <= 0 {
		c.Workers = max(4, 2*runtime.GOMAXPROCS(0))
	}
	return c
}

// Store is what the ingester needs from pkg/store (*store.Store implements
// it); an interface so tests can put a failing wrapper around a real store.
type Store interface {
	policy.Lookup
	Save(ctx context.Context, evt *nostr.Event) (stored bool, err error)
	// SaveBatch stores several events as Save would each, in order.
	SaveBatch(ctx context.Context, evts []*nostr.Event) []store.SaveResult
	Delete(ctx context.Context, evt *nostr.Event) error
	// Held returns those of ids whose events are stored, without reading
	// the events where the backend can (store.Store.Held): the duplicate
	// pre-check of every batch.
	Held(ctx context.Context, ids []string) ([]string, error)
}

// Ingester consumes grasp.events.* and stores what the policy accepts.
type Ingester struct {
	cfg    Config
	bus    *bus.Bus
	store  Store
	policy *policy.Policy
	log    *slog.Logger
	reg    prometheus.Registerer
	clk    clock.Clock
	m      *metrics
	// inFlight bounds the bytes of messages between the read stage and
	// their settlement (Config.MaxBytes; set by consume).
	inFlight *bus.ByteGate
	// deletions serialises deletion requests against everything else in
	// this replica: a deletion evaluated and applied while one of its
	// targets is being evaluated and saved could miss it (the target's
	// "deleted by its author" check ran before the deletion was stored).
	// A batch holding a deletion takes it exclusively; other batches and
	// wake-ups of parked events share it.
	deletions sync.RWMutex
	// outage is set while the store is unreachable, for logs and the gauge.
	outage outageState
	// lot holds parked events; set by Run.
	lot *parking.Lot
	// target publishes accepted events in bolt-on mode (nil otherwise).
	target *target.Publisher
	// refresh reconciles the mirror with the target in bolt-on mode (nil
	// otherwise).
	refresh *target.Refresher
	// rejected is the bucket of events refused for good (pkg/rejected);
	// set by Run, nil when the deployment has none.
	rejected jetstream.KeyValue
	// manyDeletions is set once the store held fewDeletions deletions: the
	// batch prefetch then asks the tag index only (see batch.deletions).
	manyDeletions atomic.Bool
	// anns caches the policy's announcement lookups across decide batches
	// (see annCache); in use while Run watches the stored notices.
	anns *annCache
	// refs remembers the events this replica just stored, for the
	// policy's lookups of referenced events (refcache.go).
	refs *refCache
}

// New builds an ingester. serviceURL is this GRASP server's public relay URL,
// which announcements must list. reg may be nil. In bolt-on mode
// (cfg.Settings.Relay set) st becomes the mirror behind a target.Store that
// publishes every accepted event to the target relay first.
func New(cfg Config, b *bus.Bus, st Store, serviceURL string, log *slog.Logger, reg prometheus.Registerer) *Ingester {
	cfg = cfg.withDefaults()
	var pub *target.Publisher
	var refresh *target.Refresher
	if cfg.Settings.Enabled() {
		pub = target.NewPublisher(cfg.Settings, clock.Real{}, log.With("service", "ingester"), reg)
		refresh = target.NewRefresher(cfg.Settings, st, clock.Real{}, log.With("service", "ingester"), reg)
		st = &target.Store{Mirror: st, Pub: pub}
	}
	i := &Ingester{
		target:  pub,
		refresh: refresh,
		cfg:     cfg,
		bus:     b,
		store:   st,
		policy:  &policy.Policy{ServiceURL: serviceURL, Store: st, Limits: cfg.Limits, Archive: cfg.Archive},
		log:     log.With("service", "ingester"),
		reg:     reg,
		clk:     clock.Real{},
		m:       newMetrics(reg),
		anns:    newAnnCache(),
		refs:    newRefCache(),
	}
	return i
}

// WithClock replaces the clock that paces outage backoff, lag polling,
// the parking sweeps and the mirror refresh (tests pass a clock.Fake). Call
// before Run.
func (i *Ingester) WithClock(c clock.Clock) *Ingester {
	i.clk = c
	if i.refresh != nil {
		i.refresh.WithClock(c)
	}
	return i
}

// Target is the publisher to the target relay in bolt-on mode, nil
// otherwise: graspd's status page reads its Status.
func (i *Ingester) Target() *target.Publisher { return i.target }

// Stats returns the counters so far (the same numbers as the metrics).
func (i *Ingester) Stats() Stats { return i.m.snapshot() }

// reviveArchivable forgets the remembered refusals of announcements and
// states that the archive settings now accept (an entry added to
// GRASP_ARCHIVE_WHITELIST, GRASP_ARCHIVE_ALL switched on since they were
// refused), so the next NIP-77 reconciliation of layer 1 — the catch-up
// after this restart, or the daily resync — fetches them again instead of
// counting them as held. It runs before consuming, once per start; a
// failure is logged and leaves them to be found only by REQ reads.
func (i *Ingester) reviveArchivable(ctx context.Context) {
	arch := i.cfg.Archive
	if !arch.Enabled() {
		return
	}
	n, err := rejected.Forget(ctx, i.rejected, func(kind int, pubkey string, tags nostr.Tags, reason string) bool {
		if kind != nip34.KindRepoAnnouncement && kind != nip34.KindRepoState {
			return false
		}
		if reason != string(policy.ReasonNotListed) && reason != string(policy.ReasonNotMaintainer) {
			return false
		}
		return arch.Match(pubkey, tags.GetD()) != policy.ArchiveNone
	})
	if err != nil {
		i.log.Warn("could not forget remembered refusals the archive settings now accept", "err", err, "forgotten", n)
		return
	}
	if n > 0 {
		i.log.Info("forgot remembered refusals the archive settings now accept; the next layer-1 reconciliation fetches them again", "forgotten", n)
	}
}

// Run consumes events until ctx is done, parking events that wait for
// something not stored yet and re-evaluating them as it arrives.
func (i *Ingester) Run(ctx context.Context) error {
	if err := i.setupDeadLetter(ctx); err != nil {
		return fmt.Errorf("ingester: %w", err)
	}
	if kv, err := rejected.Open(ctx, i.bus); err == nil {
		i.rejected = kv
		i.reviveArchivable(ctx)
	} else {
		i.log.Warn("refusals will not be remembered for NIP-77", "err", err)
	}
	lot, err := parking.Open(ctx, i.bus, i.cfg.Config, i.clk, i.log, i.reg)
	if err != nil {
		return fmt.Errorf("ingester: %w", err)
	}
	i.lot = lot
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return i.consume(gctx) })
	g.Go(func() error { return i.wake(gctx) })
	g.Go(func() error { return lot.Run(gctx) })
	g.Go(func() error { return i.sweepParked(gctx) })
	g.Go(func() error { return i.watchAnnouncements(gctx) })
	if i.target != nil {
		defer i.target.Close()
		i.log.Info("bolt-on mode: accepted events are published to the target relay", "target", i.target.URL())
		// The mirror refresh (GRASP_TARGET_REFRESH_INTERVAL): it logs its
		// failures and never ends the group.
		g.Go(func() error { return i.refresh.Run(gctx) })
	}
	return g.Wait()
}

// storeAccepted stores an event the policy accepted, applies it if it is a
// deletion, and publishes it on grasp.stored.<kind> (store.SaveAccepted).
// data is its JSON. stored is false for a duplicate.
func (i *Ingester) storeAccepted(ctx context.Context, evtp *nostr.Event, data []byte) (stored bool, err error) {
	evt := *evtp
	stored, err = store.SaveAccepted(ctx, i.store, &evt, func(e *nostr.Event) { i.publishStored(e, data) })
	if err != nil && !stored {
		return false, fmt.Errorf("store %s: %w", evt.ID, err)
	}
	// With stored true, an error is a deletion stored but not fully
	// applied: its redelivery finds it a duplicate and applies it again
	// (see duplicate).
	return stored, err
}

// publishStored announces a stored event on grasp.stored.<kind>; data is its
// JSON.
func (i *Ingester) publishStored(evt *nostr.Event, data []byte) {
	// Before the notice, and after the store committed (and applied a
	// deletion): the next decision of this replica sees the change.
	i.noteStored(evt)
	out := nats.NewMsg(i.bus.Names.StoredSubject(evt.Kind))
	out.Data = data
	out.Header.Set(bus.HeaderOrigin, "ingester")
	if err := i.bus.Conn.PublishMsg(out); err != nil {
		// Stored is stored: the broadcast is best effort, redelivery would
		// only find a duplicate.
		i.log.Warn("publish stored event", "id", evt.ID, "err", err)
	}
}

// decode parses raw event JSON with go-nostr's generated decoder, skipping
// encoding/json's validation pass over the whole (possibly large) input.
func decode(data []byte) (*nostr.Event, error) {
	var evt nostr.Event
	if err := evt.UnmarshalJSON(data); err != nil {
		return nil, err
	}
	return &evt, nil
}
