// Package discovery builds the RepoSyncIndex: it subscribes to the own relay
// like any nostr client (so it works in front of any GRASP relay), pages
// through its history, stays live, and writes the repositories this service
// hosts — with their relays and root events — to the grasp_repo_index KV
// bucket, one batch window at a time.
package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nbd-wtf/go-nostr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/history"
	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
	"github.com/grasp-sync/grasp-sync/pkg/relayurl"
)

// Kinds is what discovery subscribes to: announcements, root events and
// user grasp lists.
var Kinds = []int{nip34.KindRepoAnnouncement, nip34.KindPatch, nip34.KindPullRequest, nip34.KindIssue, nip34.KindUserGraspList}

// Config is discovery's configuration (GRASP_* variables).
type Config struct {
	// RelayURL is the own relay discovery subscribes to.
	RelayURL string `envconfig:"DISCOVERY_RELAY_URL"`
	// BatchWindow starts at the first event after a flush and does not
	// reset; one index update is written per window.
	BatchWindow time.Duration `envconfig:"DISCOVERY_BATCH_WINDOW" default:"5s"`
	// PageSize is the limit of each history page.
	PageSize int `envconfig:"DISCOVERY_PAGE_SIZE" default:"500"`
	// MaxPages bounds one history read.
	MaxPages int `envconfig:"DISCOVERY_MAX_PAGES" default:"100000"`
	// ReconnectBuffer is subtracted from the moment the live stream was lost
	// to get the since of the catch-up after a reconnect.
	ReconnectBuffer time.Duration `envconfig:"DISCOVERY_RECONNECT_BUFFER" default:"15m"`
	// MaxRelaysPerAnnouncement bounds the relays one announcement adds.
	MaxRelaysPerAnnouncement int `envconfig:"MAX_RELAYS_PER_ANNOUNCEMENT" default:"20"`
	// RelayAllowlist names internal hosts (or host:port) sync may dial
	// anyway, for tests and local demos.
	RelayAllowlist []string `envconfig:"RELAY_ALLOWLIST"`
}

// Discovery is the discovery service.
type Discovery struct {
	cfg       Config
	bus       *bus.Bus
	index     *RepoSyncIndex
	clock     clock.Clock
	log       *slog.Logger
	connected atomic.Bool

	kv      jetstream.KeyValue
	written map[string][]byte // key → value last written, to write only changes
	pending map[nip34.RepoRef]struct{}

	batches prometheus.Counter
	writes  prometheus.Counter
	repos   prometheus.Gauge
}

// New builds discovery. serviceURL is this service's public relay URL;
// listsService is the policy's "announcement lists this service" rule.
func New(cfg Config, b *bus.Bus, serviceURL string, listsService func(*nostr.Event) bool, clk clock.Clock, log *slog.Logger, reg prometheus.Registerer) *Discovery {
	d := &Discovery{
		cfg: cfg,
		bus: b,
		index: NewRepoSyncIndex(RelayRules{
			ServiceURL:         serviceURL,
			Guard:              relayurl.Guard{Allow: cfg.RelayAllowlist},
			MaxPerAnnouncement: cfg.MaxRelaysPerAnnouncement,
			ListsService:       listsService,
		}),
		clock:   clk,
		log:     log.With("service", "discovery", "relay", cfg.RelayURL),
		written: map[string][]byte{},
		pending: map[nip34.RepoRef]struct{}{},
		batches: prometheus.NewCounter(prometheus.CounterOpts{Name: "grasp_discovery_batches_total", Help: "Index update batches written."}),
		writes:  prometheus.NewCounter(prometheus.CounterOpts{Name: "grasp_discovery_index_writes_total", Help: "Keys written or deleted in the repo index."}),
		repos:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "grasp_discovery_repos_indexed", Help: "Repositories in the RepoSyncIndex."}),
	}
	if reg != nil {
		reg.MustRegister(d.batches, d.writes, d.repos)
	}
	return d
}

// Ready is false while the self-subscription is down.
func (d *Discovery) Ready() error {
	if !d.connected.Load() {
		return errors.New("not subscribed to the own relay")
	}
	return nil
}

// Run subscribes until ctx is done, reconnecting with backoff.
func (d *Discovery) Run(ctx context.Context) error {
	kv, err := d.bus.JS.KeyValue(ctx, d.bus.Names.RepoIndexBucket())
	if err != nil {
		return fmt.Errorf("open %s: %w", d.bus.Names.RepoIndexBucket(), err)
	}
	d.kv = kv
	var since *nostr.Timestamp
	reconciled := false
	backoff := time.Second
	for ctx.Err() == nil {
		lost, err := d.session(ctx, since, &reconciled)
		d.connected.Store(false)
		if ctx.Err() != nil {
			return nil
		}
		if !lost.IsZero() {
			s := nostr.Timestamp(lost.Add(-d.cfg.ReconnectBuffer).Unix())
			since = &s
			backoff = time.Second
		}
		d.log.Warn("self-subscription lost, reconnecting", "err", err, "backoff", backoff.String())
		select {
		case <-ctx.Done():
		case <-d.clock.After(backoff):
		}
		backoff = min(backoff*2, time.Minute)
	}
	return nil
}

// session runs one connection: history since `since`, then live. It returns
// when the live stream was lost (zero if it never became live).
func (d *Discovery) session(ctx context.Context, since *nostr.Timestamp, reconciled *bool) (time.Time, error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	r, err := relayconn.Dial(dctx, d.cfg.RelayURL, relayconn.Options{})
	cancel()
	if err != nil {
		return time.Time{}, fmt.Errorf("connect %s: %w", d.cfg.RelayURL, err)
	}
	defer r.Close()
	d.connected.Store(true)

	liveFrom := nostr.Timestamp(d.clock.Now().Unix())
	f := nostr.Filter{Kinds: Kinds, Since: since, Limit: d.cfg.PageSize}
	st, err := history.Read(ctx, r, f, d.cfg.MaxPages, func(evts []*nostr.Event) error {
		for _, e := range evts {
			d.apply(e)
		}
		return nil
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("history: %w", err)
	}
	d.log.Info("self-subscription history read", "pages", st.Pages, "events", st.Events)
	if !*reconciled {
		if err := d.reconcile(ctx); err != nil {
			return time.Time{}, err
		}
		*reconciled = true
	} else if err := d.flush(ctx); err != nil {
		return time.Time{}, err
	}

	// Live from a little before history started, so nothing stored while
	// history was read is missed (the index ignores what it already has).
	live := liveFrom - 60
	sub, err := r.Subscribe(ctx, nostr.Filters{{Kinds: Kinds, Since: &live}})
	if err != nil {
		return time.Time{}, fmt.Errorf("live subscription: %w", err)
	}
	defer sub.Close()
	var window <-chan time.Time
	for {
		select {
		case evt := <-sub.Events():
			if d.apply(evt) && window == nil {
				window = d.clock.After(d.cfg.BatchWindow)
			}
		case <-window:
			window = nil
			if err := d.flush(ctx); err != nil {
				return d.clock.Now(), err
			}
		case reason := <-sub.Closed():
			_ = d.flush(ctx)
			return d.clock.Now(), fmt.Errorf("live subscription closed: %s", reason)
		case <-r.Context().Done():
			_ = d.flush(ctx)
			return d.clock.Now(), fmt.Errorf("connection lost: %w", context.Cause(r.Context()))
		case <-ctx.Done():
			return d.clock.Now(), ctx.Err()
		}
	}
}

// apply folds one event in and reports whether any entry may have changed.
func (d *Discovery) apply(evt *nostr.Event) bool {
	changed := d.index.Apply(evt)
	for _, ref := range changed {
		d.pending[ref] = struct{}{}
	}
	return len(changed) > 0
}

// flush writes the changed entries of this batch.
func (d *Discovery) flush(ctx context.Context) error {
	if len(d.pending) == 0 {
		return nil
	}
	n := 0
	for ref := range d.pending {
		wrote, err := d.write(ctx, ref)
		if err != nil {
			return err
		}
		if wrote {
			n++
		}
		delete(d.pending, ref)
	}
	d.batches.Inc()
	d.repos.Set(float64(len(d.index.Hosted())))
	d.log.Info("index batch written", "changed_keys", n)
	return nil
}

func (d *Discovery) write(ctx context.Context, ref nip34.RepoRef) (bool, error) {
	key := ref.Key()
	entry := d.index.Entry(ref)
	if entry == nil {
		if _, ok := d.written[key]; !ok {
			return false, nil
		}
		if err := d.kv.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return false, fmt.Errorf("delete %s: %w", key, err)
		}
		delete(d.written, key)
		d.writes.Inc()
		return true, nil
	}
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(entry)
	if err != nil {
		return false, err
	}
	if prev, ok := d.written[key]; ok && string(prev) == string(data) {
		return false, nil
	}
	if _, err := d.kv.Put(ctx, key, data); err != nil {
		return false, fmt.Errorf("put %s: %w", key, err)
	}
	d.written[key] = data
	d.writes.Inc()
	return true, nil
}

// reconcile makes the bucket equal to the index after the first history
// read: entries written, keys of repositories no longer hosted removed.
func (d *Discovery) reconcile(ctx context.Context) error {
	existing := map[string][]byte{}
	keys, err := d.kv.ListKeys(ctx)
	if err != nil {
		return fmt.Errorf("list %s: %w", d.bus.Names.RepoIndexBucket(), err)
	}
	for key := range keys.Keys() {
		if e, err := d.kv.Get(ctx, key); err == nil {
			existing[key] = e.Value()
		}
	}
	d.written = existing
	for key := range existing {
		if ref, ok := nip34.ParseKey(key); ok {
			d.pending[ref] = struct{}{}
		} else if err := d.kv.Delete(ctx, key); err != nil {
			return fmt.Errorf("delete stale key %s: %w", key, err)
		}
	}
	for _, ref := range d.index.Hosted() {
		d.pending[ref] = struct{}{}
	}
	return d.flush(ctx)
}
