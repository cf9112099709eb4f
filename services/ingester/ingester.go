// Package ingester turns raw events fetched from remote relays into stored
// events: it verifies each event's id and signature, applies the GRASP write
// policy, stores what is accepted, and publishes it on grasp.stored.<kind> so
// relay replicas broadcast it and discovery sees new roots.
package ingester

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nbd-wtf/go-nostr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/parking"
	"github.com/grasp-sync/grasp-sync/pkg/policy"
	"github.com/grasp-sync/grasp-sync/pkg/store"
)

// Config is the ingester's configuration (GRASP_* variables).
type Config struct {
	// Consumer is the durable consumer name shared by all ingester replicas.
	Consumer string `envconfig:"INGESTER_CONSUMER" default:"ingester"`
	// MaxDeliver bounds redeliveries of a message that keeps failing for
	// infrastructure reasons (store errors).
	MaxDeliver int `envconfig:"INGESTER_MAX_DELIVER" default:"20"`
	// AckWait is how long one event may take before it is redelivered.
	AckWait time.Duration `envconfig:"INGESTER_ACK_WAIT" default:"30s"`
	// Parking bounds the lot of events waiting for what they reference
	// (GRASP_PARKING_*).
	parking.Config
}

// Ingester consumes grasp.events.* and stores what the policy accepts.
type Ingester struct {
	cfg     Config
	bus     *bus.Bus
	store   *store.Store
	policy  *policy.Policy
	log     *slog.Logger
	outcome *prometheus.CounterVec
	reg     prometheus.Registerer
	// lot holds parked events; set by Run.
	lot *parking.Lot
}

// New builds an ingester. serviceURL is this GRASP server's public relay URL,
// which announcements must list.
func New(cfg Config, b *bus.Bus, st *store.Store, serviceURL string, log *slog.Logger, reg prometheus.Registerer) *Ingester {
	i := &Ingester{
		cfg:    cfg,
		bus:    b,
		store:  st,
		policy: &policy.Policy{ServiceURL: serviceURL, Store: st, Limits: policy.DefaultLimits()},
		log:    log.With("service", "ingester"),
		outcome: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grasp_ingester_events_total",
			Help: "Events consumed by the ingester, by policy outcome (accepted or the refusal reason).",
		}, []string{"outcome"}),
	}
	if reg != nil {
		reg.MustRegister(i.outcome)
	}
	i.reg = reg
	return i
}

// Run consumes events until ctx is done, parking events that wait for
// something not stored yet and re-evaluating them as it arrives.
func (i *Ingester) Run(ctx context.Context) error {
	lot, err := parking.Open(ctx, i.bus, i.cfg.Config, clock.Real{}, i.log, i.reg)
	if err != nil {
		return fmt.Errorf("ingester: %w", err)
	}
	i.lot = lot
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return i.consume(gctx) })
	g.Go(func() error { return i.wake(gctx) })
	g.Go(func() error { return lot.Run(gctx) })
	return g.Wait()
}

// consume runs the durable consumer on the events stream.
func (i *Ingester) consume(ctx context.Context) error {
	return i.bus.Consume(ctx, bus.ConsumeConfig{
		Stream: i.bus.Names.EventsStream(),
		Consumer: jetstream.ConsumerConfig{
			Durable:       i.cfg.Consumer,
			FilterSubject: i.bus.Names.EventsSubjects(),
			MaxDeliver:    i.cfg.MaxDeliver,
			AckWait:       i.cfg.AckWait,
		},
		RetryDelay: time.Second,
		Log:        i.log,
	}, i.handle)
}

func (i *Ingester) handle(ctx context.Context, msg jetstream.Msg) error {
	var evt nostr.Event
	if err := json.Unmarshal(msg.Data(), &evt); err != nil {
		i.outcome.WithLabelValues("malformed").Inc()
		return fmt.Errorf("%w: malformed event from %s: %v", bus.ErrPermanent, msg.Headers().Get(bus.HeaderRelay), err)
	}
	d := i.policy.Evaluate(ctx, &evt)
	if !d.Accept {
		if d.Reason == policy.ReasonStoreError {
			return fmt.Errorf("evaluate %s: %s", evt.ID, d.Message)
		}
		i.outcome.WithLabelValues(string(d.Reason)).Inc()
		i.log.Debug("event refused", "id", evt.ID, "kind", evt.Kind, "reason", string(d.Reason),
			"relay", msg.Headers().Get(bus.HeaderRelay))
		if d.Parkable() {
			return i.park(ctx, &evt, d, msg.Headers().Get(bus.HeaderRelay))
		}
		return nil
	}
	_, err := i.storeAccepted(ctx, &evt, msg.Data())
	return err
}

// storeAccepted stores an event the policy accepted, applies it if it is a
// deletion, and publishes it on grasp.stored.<kind>. data is its JSON.
// stored is false for a duplicate.
func (i *Ingester) storeAccepted(ctx context.Context, evtp *nostr.Event, data []byte) (stored bool, err error) {
	evt := *evtp
	stored, err = i.store.Save(ctx, &evt)
	if err != nil {
		return false, fmt.Errorf("store %s: %w", evt.ID, err)
	}
	if !stored {
		i.outcome.WithLabelValues(string(policy.ReasonDuplicate)).Inc()
		return false, nil
	}
	if evt.Kind == 5 {
		if err := i.applyDeletion(ctx, &evt); err != nil {
			return true, err
		}
	}
	i.outcome.WithLabelValues(string(policy.ReasonAccepted)).Inc()
	out := nats.NewMsg(i.bus.Names.StoredSubject(evt.Kind))
	out.Data = data
	out.Header.Set(bus.HeaderOrigin, "ingester")
	if err := i.bus.Conn.PublishMsg(out); err != nil {
		// Stored is stored: the broadcast is best effort, redelivery would
		// only find a duplicate.
		i.log.Warn("publish stored event", "id", evt.ID, "err", err)
	}
	return true, nil
}

// applyDeletion removes the deletion author's own events it names (NIP-09).
func (i *Ingester) applyDeletion(ctx context.Context, del *nostr.Event) error {
	var ids []string
	for _, tag := range del.Tags {
		if len(tag) >= 2 && tag[0] == "e" {
			ids = append(ids, tag[1])
		}
	}
	if len(ids) == 0 {
		return nil
	}
	targets, err := i.store.Query(ctx, nostr.Filter{IDs: ids, Authors: []string{del.PubKey}})
	if err != nil {
		return fmt.Errorf("deletion %s: %w", del.ID, err)
	}
	for _, t := range targets {
		if err := i.store.Delete(ctx, t); err != nil {
			return err
		}
	}
	return nil
}
