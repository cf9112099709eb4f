// Package discovery builds the RepoSyncIndex: it subscribes to the own relay
// like any nostr client (so it works in front of any GRASP relay), pages
// through its history, stays live, and writes the repositories this service
// hosts — with their relays and root events — to the grasp_repo_index KV
// bucket, one batch window at a time. It also takes the stored-event
// announcements the writers publish on NATS (grasp.stored.<kind>), so what
// is stored while its websocket to the relay is down still reaches the index
// (see storedFeed). One instance is active at a time
// (pkg/leader); the others stand by.
package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nbd-wtf/go-nostr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/debounce"
	"github.com/grasp-sync/grasp-sync/pkg/history"
	"github.com/grasp-sync/grasp-sync/pkg/leader"
	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
	"github.com/grasp-sync/grasp-sync/pkg/relayurl"
)

// Kinds is what discovery subscribes to: announcements, root events, user
// grasp lists and relay lists (where an archive's whitelisted maintainers
// publish), and NIP-09 deletions (which remove repositories and roots).
var Kinds = []int{nip34.KindRepoAnnouncement, nip34.KindPatch, nip34.KindPullRequest, nip34.KindIssue, nip34.KindUserGraspList, nip34.KindRelayList, nip34.KindDeletion}

// LeaseKey is discovery's key in the lease bucket.
const LeaseKey = "discovery"

// Discovery is the discovery service.
type Discovery struct {
	cfg          Config
	bus          *bus.Bus
	rules        RelayRules
	clock        clock.Clock
	log          *slog.Logger
	metrics      *metrics
	listsService func(*nostr.Event) bool
	// storedQueue bounds the stored feed (DefaultStoredQueue; tests lower
	// it).
	storedQueue int
	// seen receives what the self-subscription reads (WithSeen); nil when
	// nobody asked.
	seen func(context.Context, []*nostr.Event)

	// state is what Ready reports: one of the state* constants.
	state atomic.Int32
	// applied counts events folded into the index (tests wait on it).
	applied atomic.Int64
	// sessions and batches number connections and index batches, for logs.
	sessions atomic.Uint64
	batches  uint64 // owned by the active session's goroutine
}

const (
	stateStarting  int32 = iota // campaigning, nothing decided yet
	stateStandby                // another instance is active
	stateActive                 // active, self-subscription down
	stateConnected              // active, self-subscription live
)

// New builds discovery. serviceURL is this service's public relay URL;
// listsService is the policy's "announcement lists this service" rule.
func New(cfg Config, b *bus.Bus, serviceURL string, listsService func(*nostr.Event) bool, clk clock.Clock, log *slog.Logger, reg prometheus.Registerer) *Discovery {
	cfg = cfg.withDefaults()
	d := &Discovery{
		cfg: cfg,
		bus: b,
		rules: RelayRules{
			ServiceURL:         serviceURL,
			Guard:              relayurl.Guard{Allow: cfg.RelayAllowlist},
			MaxPerAnnouncement: cfg.MaxRelaysPerAnnouncement,
			ListsService:       listsService,
			Archive:            cfg.Archive,
			MaxArchived:        cfg.ArchiveMaxRepos,
		},
		clock:       clk,
		log:         log.With("service", "discovery", "relay", cfg.RelayURL, "instance", cfg.InstanceID),
		metrics:     newMetrics(reg),
		storedQueue: DefaultStoredQueue,
	}
	return d
}

// Ready is false while this instance is the active one and its
// self-subscription is down or still catching up on history (and before it
// knows whether it is active). A standby is ready: it is healthy and
// waiting.
func (d *Discovery) Ready() error {
	switch d.state.Load() {
	case stateStandby, stateConnected:
		return nil
	case stateStarting:
		return errors.New("campaigning for the discovery lease")
	default:
		return errors.New("not subscribed to the own relay")
	}
}

// Run campaigns for the discovery lease and, while it holds it, keeps the
// index, until ctx is done.
func (d *Discovery) Run(ctx context.Context) error {
	if d.cfg.RelayURL == "" {
		return errors.New("discovery: no relay URL (GRASP_DISCOVERY_RELAY_URL, or GRASP_TARGET_RELAY in bolt-on mode)")
	}
	kv, err := d.bus.JS.KeyValue(ctx, d.bus.Names.RepoIndexBucket())
	if err != nil {
		return fmt.Errorf("open %s: %w", d.bus.Names.RepoIndexBucket(), err)
	}
	leases, err := d.bus.JS.KeyValue(ctx, d.bus.Names.LeaseBucket())
	if err != nil {
		return fmt.Errorf("open %s: %w", d.bus.Names.LeaseBucket(), err)
	}
	d.state.Store(stateStarting)
	mctx, stop := context.WithCancel(ctx)
	marked := make(chan struct{})
	go func() {
		defer close(marked)
		d.markStandby(mctx)
	}()
	defer func() {
		stop()
		<-marked
	}()
	// The lease runs on real time whatever d.clock is: the NATS server
	// expires it on its own clock.
	return leader.Run(ctx, leader.Config{KV: leases, Key: LeaseKey, ID: d.cfg.InstanceID, Clock: clock.Real{}, Log: d.log},
		func(ctx context.Context, epoch uint64) error {
			d.metrics.leader.Set(1)
			defer d.metrics.leader.Set(0)
			defer d.state.Store(stateStandby)
			d.state.Store(stateActive)
			return d.active(ctx, kv, d.log.With("epoch", epoch))
		})
}

// markStandby turns "starting" into "standby" once the lease is known to be
// held by another instance, so a standby reports ready.
func (d *Discovery) markStandby(ctx context.Context) {
	leases, err := d.bus.JS.KeyValue(ctx, d.bus.Names.LeaseBucket())
	if err != nil {
		return
	}
	for ctx.Err() == nil && d.state.Load() == stateStarting {
		if l, ok, err := leader.Current(ctx, leases, LeaseKey); err == nil && ok && l.Holder != d.cfg.InstanceID {
			d.state.CompareAndSwap(stateStarting, stateStandby)
			return
		}
		// A status poll on real time, not d.clock: it is not sync logic,
		// and it must not hold a timer of a test's fake clock.
		timer := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
		case <-timer.C:
		}
		timer.Stop()
	}
}

// errResync ends a session so the index is rebuilt from the whole history.
var errResync = errors.New("periodic resync")

// errFeedGap ends a live session during which NATS reconnected, so the next
// one reads the whole history (docs/decisions/0068-discovery-feed-gap-rereads.md).
var errFeedGap = errors.New("NATS reconnected while live")

// feedGapCheck is how often a live session looks for a gap in the stored
// feed (Config.FeedGapMinLive says when one ends the session).
const feedGapCheck = time.Second

// term is the state of one leadership term: a fresh index rebuilt from the
// relay's history (another instance may have written the bucket meanwhile).
type term struct {
	index   *RepoSyncIndex
	writer  *IndexWriter
	pending map[nip34.RepoRef]struct{}
	// since is the catch-up bound of the next session (nil: whole history).
	since *nostr.Timestamp
	// loaded is set once the bucket has been read and reconciled.
	loaded bool
	// window fires when the pending changes are due to be written, or a
	// failed write is retried (nil: none); it outlives a session, so what
	// the stored feed brings between sessions is written too.
	window <-chan time.Time
	// burst decides when the pending changes are due: BatchQuiet after the
	// last, at most BatchWindow after the first.
	burst debounce.Burst
	// gap, when set, is the stored feed's mark from which what the feed
	// loses matters: the start of the last session whose history read
	// completed (or, before any, the moment the first was lost). If the
	// feed may have lost something since (see storedFeed), the catch-up of
	// the next session reads the whole history instead of using since: the
	// live stream that was lost may not have delivered it either (the own
	// relay broadcasts the ingester's events from the same core-NATS
	// announcements, and drops a client that stops reading).
	gap     *gapMark
	refused map[string]int // Refused counts already exported
	// overLimit is the index's OverLimitTotal already exported.
	overLimit int
	// bootDirty is set when the archive relays may have changed and the
	// bootstrap relays are to be published again.
	bootDirty bool
	log       *slog.Logger
}

// active runs while this instance holds the lease: sessions against the own
// relay, reconnecting with backoff, until ctx ends.
func (d *Discovery) active(ctx context.Context, kv jetstream.KeyValue, log *slog.Logger) error {
	t := d.newTerm(kv, log)
	if _, err := t.writer.SyncBootstrap(ctx, d.bootstrap(t)); err != nil {
		log.Warn("bootstrap relays not published yet", "err", err)
	} else {
		log.Info("bootstrap relays published", "relays", len(d.cfg.BootstrapRelays))
	}
	// The stored feed is opened before the first history read and kept for
	// the whole term, across sessions: it is what covers the gaps between
	// them.
	feed, err := d.subscribeStored(log)
	if err != nil {
		return err
	}
	defer feed.stop()
	backoff := d.cfg.BackoffBase
	resyncAt := d.resyncTimer()
	for ctx.Err() == nil {
		lost, live, err := d.session(ctx, t, feed, resyncAt)
		d.state.Store(stateActive)
		d.metrics.connected.Set(0)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, errResync) {
			log.Info("periodic resync: rebuilding the index from the whole history")
			t = d.newTerm(kv, log)
			resyncAt = d.resyncTimer()
			continue
		}
		if errors.Is(err, errFeedGap) {
			// At once, and the whole history: what the feed lost is
			// stored, whatever its created_at.
			t.since, t.gap = nil, nil
			continue
		}
		if live {
			backoff = d.cfg.BackoffBase
		}
		if t.gap == nil {
			m := d.mark(feed)
			t.gap = &m
		}
		if !lost.IsZero() {
			s := nostr.Timestamp(lost.Add(-d.cfg.ReconnectBuffer).Unix())
			t.since = &s
		}
		log.Warn("self-subscription lost, reconnecting", "err", err, "backoff", backoff.String(), "since", t.since)
		if !d.between(ctx, t, feed, backoff) {
			return nil
		}
		backoff = min(backoff*2, d.cfg.BackoffMax)
	}
	return nil
}

// between waits out the reconnect backoff while keeping the index current
// from the stored feed (the relay may be down for long). It reports false
// when ctx ended.
func (d *Discovery) between(ctx context.Context, t *term, feed *storedFeed, backoff time.Duration) bool {
	wait := d.clock.After(backoff)
	for {
		select {
		case <-ctx.Done():
			return false
		case <-wait:
			return true
		case evt := <-feed.events:
			d.applyStored(t, evt)
		case <-t.window:
			t.window = nil
			if !d.due(t) {
				continue
			}
			// Not loaded yet: the first history read has not completed,
			// the entries stay pending until it has.
			if t.loaded && !d.flush(ctx, t) {
				t.window = d.clock.After(d.cfg.BatchWindow)
			}
		}
	}
}

func (d *Discovery) newTerm(kv jetstream.KeyValue, log *slog.Logger) *term {
	t := &term{
		index:   NewRepoSyncIndex(d.rules),
		writer:  NewIndexWriter(kv, d.clock),
		pending: map[nip34.RepoRef]struct{}{},
		burst:   debounce.New(d.cfg.BatchQuiet, d.cfg.BatchWindow),
		refused: map[string]int{},
		log:     log,
	}
	return t
}

func (d *Discovery) resyncTimer() <-chan time.Time {
	if d.cfg.ResyncInterval <= 0 {
		return nil
	}
	return d.clock.After(d.cfg.ResyncInterval)
}

// session runs one connection to the own relay. The live subscription
// (limit 0: every event stored from now on, whatever its created_at) opens
// first, on its own connection; the history since t.since is read on a
// second connection at the same time, so nothing stored while history is
// read can fall between the two. It returns when the live stream was lost
// (lost: when; zero if history was not complete, so the next catch-up must
// start from the old since) and whether the stream had become live.
func (d *Discovery) session(ctx context.Context, t *term, feed *storedFeed, resync <-chan time.Time) (lost time.Time, live bool, err error) {
	log := t.log.With("session", d.sessions.Add(1))
	defer func(parent *slog.Logger) { t.log = parent }(t.log)
	t.log = log
	conn, err := d.dial(ctx)
	if err != nil {
		return time.Time{}, false, err
	}
	defer conn.Close()
	sub, err := conn.Subscribe(ctx, nostr.Filters{{Kinds: Kinds, LimitZero: true}})
	if err != nil {
		return time.Time{}, false, fmt.Errorf("live subscription: %w", err)
	}
	defer sub.Close()
	// The live stream is up: from here on it brings everything. If the
	// stored feed may have missed something while it was down, a since
	// catch-up could miss it too (old created_at): read the whole history.
	if t.gap != nil && t.since != nil && !d.complete(feed, *t.gap) {
		t.log.Warn("stored-event feed incomplete during the disconnection; reading the whole history",
			"dropped", feed.dropped.Load()-t.gap.dropped)
		t.since = nil
	}
	// What the feed loses from here on is covered by this session's live
	// stream only while it lasts (see term.gap).
	start := d.mark(feed)
	hconn, err := d.dial(ctx)
	if err != nil {
		return time.Time{}, false, err
	}

	// History is read by a goroutine owned by this session (stopped and
	// waited for on return), which hands pages to the loop below, the only
	// writer of the index.
	pages := make(chan []*nostr.Event)
	histDone := make(chan error, 1)
	hctx, hcancel := context.WithCancel(ctx)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		defer hconn.Close()
		f := nostr.Filter{Kinds: Kinds, Since: t.since, Limit: d.cfg.PageSize}
		st, err := history.Read(hctx, hconn, f, min(d.cfg.PageSize, d.cfg.RelayMinCap), d.cfg.MaxPages, func(evts []*nostr.Event) error {
			select {
			case pages <- evts:
				return nil
			case <-hctx.Done():
				return hctx.Err()
			}
		})
		if err == nil {
			t.log.Info("self-subscription history read", "pages", st.Pages, "events", st.Events, "since", t.since)
		}
		histDone <- err
	}()
	defer func() {
		hcancel()
		<-exited
	}()

	d.metrics.connected.Set(1)
	t.log.Info("self-subscription connected", "since", t.since)

	historyDone := false
	// Real time, not d.clock, as the ingester's check of its own feed:
	// this is no timer of discovery's logic (a fake clock in a test must
	// neither be made to fire it nor see it armed).
	var caughtUp time.Time
	gapCheck := time.NewTicker(feedGapCheck)
	defer gapCheck.Stop()
	lostNow := func() time.Time {
		if historyDone {
			return d.clock.Now()
		}
		return time.Time{}
	}
	for {
		select {
		case evts := <-pages:
			d.see(ctx, evts)
			for _, e := range evts {
				d.apply(t, e)
			}
		case herr := <-histDone:
			if herr != nil {
				if errors.Is(herr, history.ErrIncomplete) {
					// Never caught up on a guess: not ready, read again
					// after the backoff (docs/decisions/0021-history-crowded-second.md).
					d.metrics.historyIncomplete.Inc()
				}
				return time.Time{}, false, fmt.Errorf("history: %w", herr)
			}
			historyDone, caughtUp = true, time.Now()
			t.gap = &start // caught up: the gap before is covered
			if !t.loaded {
				if err := d.load(ctx, t); err != nil {
					t.log.Warn("index bucket not reconciled yet, retrying at the next window", "err", err)
					t.window = d.clock.After(d.cfg.BatchWindow)
					continue
				}
			}
			d.flush(ctx, t)
			d.state.Store(stateConnected) // live and caught up: ready
		case evt := <-sub.Events():
			d.see(ctx, []*nostr.Event{evt})
			if d.apply(t, evt) {
				d.changed(t)
			}
		case evt := <-feed.events:
			d.applyStored(t, evt)
		case <-t.window:
			t.window = nil
			if !d.due(t) {
				continue
			}
			if historyDone && !t.loaded {
				if err := d.load(ctx, t); err != nil {
					t.log.Warn("index bucket not reconciled yet, retrying at the next window", "err", err)
					t.window = d.clock.After(d.cfg.BatchWindow)
					continue
				}
				d.state.Store(stateConnected)
			}
			if t.loaded && !d.flush(ctx, t) {
				t.window = d.clock.After(d.cfg.BatchWindow) // retry what failed
			}
		case <-gapCheck.C:
			// NATS reconnected while the live stream was up: the feed lost
			// what was announced meanwhile, and the own relay, which
			// broadcasts the ingester's events from the same
			// announcements, most likely did too (a NATS restart
			// disconnects every client). Nothing else would bring those
			// events (synced roots with old created_at) before the
			// periodic resync: read the whole history again. Announcements
			// dropped from a full queue are not reason enough: the live
			// stream carries them, and a busy sync drops thousands.
			if historyDone && time.Since(caughtUp) >= d.cfg.FeedGapMinLive && d.reconnected(start) {
				t.log.Warn("NATS reconnected while live: the stored-event feed lost announcements; reading the whole history again",
					"reconnects", d.bus.Conn.Stats().Reconnects-start.reconnects)
				d.metrics.feedGapRereads.Inc()
				d.flushIfLoaded(ctx, t)
				return lostNow(), historyDone, errFeedGap
			}
		case reason := <-sub.Closed():
			d.flushIfLoaded(ctx, t)
			return lostNow(), historyDone, fmt.Errorf("live subscription closed: %s", reason)
		case <-conn.Context().Done():
			d.flushIfLoaded(ctx, t)
			return lostNow(), historyDone, fmt.Errorf("connection lost: %w", context.Cause(conn.Context()))
		case <-resync:
			d.flushIfLoaded(ctx, t)
			return lostNow(), historyDone, errResync
		case <-ctx.Done():
			return lostNow(), historyDone, ctx.Err()
		}
	}
}

// WithSeen makes discovery hand every event its self-subscription reads
// (history pages and live events) to fn before folding them in: in bolt-on
// mode graspd mirrors them, so the write policy and the fetcher's NIP-77
// local set know what others wrote to the target (docs/decisions/0035-bolt-on-target-relay.md). fn
// runs on discovery's loop: it must be quick and must not fail it. Call
// before Run.
func (d *Discovery) WithSeen(fn func(ctx context.Context, evts []*nostr.Event)) *Discovery {
	d.seen = fn
	return d
}

func (d *Discovery) see(ctx context.Context, evts []*nostr.Event) {
	if d.seen != nil && len(evts) > 0 {
		d.seen(ctx, evts)
	}
}

func (d *Discovery) dial(ctx context.Context) (*relayconn.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// khatru answers a REQ whose store query failed with a NOTICE and an
	// EOSE, which a history read cannot tell from the end of what is
	// stored: the NOTICE is logged so that such a short read shows.
	c, err := relayconn.Dial(dctx, d.cfg.RelayURL, relayconn.Options{OnNotice: func(msg string) {
		d.log.Warn("own relay sent a NOTICE", "notice", msg)
	}})
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", d.cfg.RelayURL, err)
	}
	return c, nil
}

// bootstrap is what discovery publishes as the bootstrap relays: the
// configured ones plus the GRASP servers the archived maintainers list
// (RepoSyncIndex.ArchiveRelays), sorted, each once.
func (d *Discovery) bootstrap(t *term) []string {
	out := slices.Clone(d.cfg.BootstrapRelays)
	for _, u := range t.index.ArchiveRelays() {
		if !slices.Contains(out, u) {
			out = append(out, u)
		}
	}
	if len(out) > len(d.cfg.BootstrapRelays) {
		slices.Sort(out)
	}
	return out
}

// apply folds one event in and reports whether any entry may have changed.
func (d *Discovery) apply(t *term, evt *nostr.Event) bool {
	d.metrics.eventsSeen.Inc()
	return d.fold(t, evt)
}

// fold applies one event, from the self-subscription or the stored feed, to
// the index and marks the entries it may have changed for the next write.
func (d *Discovery) fold(t *term, evt *nostr.Event) bool {
	d.applied.Add(1)
	d.metrics.batchEvents++
	changed := t.index.Apply(evt)
	for _, ref := range changed {
		t.pending[ref] = struct{}{}
	}
	if (evt.Kind == nip34.KindUserGraspList || evt.Kind == nip34.KindRelayList) && t.index.whitelisted[evt.PubKey] {
		// A whitelisted maintainer's grasp list may name new places to
		// look for their announcements: republish the bootstrap relays.
		t.bootDirty = true
		return true
	}
	return len(changed) > 0
}

// changed records that entries changed now and arms the timer of their
// write, unless one is armed already (due re-arms it if more changes came).
func (d *Discovery) changed(t *term) {
	now := d.clock.Now()
	t.burst.Updated(now)
	if t.window == nil {
		t.window = d.clock.After(t.burst.Due().Sub(now))
	}
}

// due is called when t.window fired: it reports whether the pending changes
// are to be written now, or re-arms the timer when changes arrived since it
// was armed and the burst is not yet due (quiet period not over, window not
// yet reached). A retry timer with no burst pending is always due.
func (d *Discovery) due(t *term) bool {
	if now := d.clock.Now(); now.Before(t.burst.Due()) {
		t.window = d.clock.After(t.burst.Due().Sub(now))
		return false
	}
	t.burst.Done()
	return true
}

// load reads the bucket once per term, so the first flush also removes
// entries of repositories that are no longer hosted (stale keys).
func (d *Discovery) load(ctx context.Context, t *term) error {
	refs, err := t.writer.Load(ctx)
	if err != nil {
		return err
	}
	for _, ref := range refs {
		t.pending[ref] = struct{}{}
	}
	// The bootstrap key was read too: publish ours if it differs.
	if _, err := t.writer.SyncBootstrap(ctx, d.bootstrap(t)); err != nil {
		return err
	}
	t.loaded = true
	t.log.Info("index bucket loaded for reconciliation", "keys", len(refs))
	return nil
}

func (d *Discovery) flushIfLoaded(ctx context.Context, t *term) {
	if t.loaded {
		d.flush(ctx, t)
	}
}

// flush writes the changed entries of this batch. Entries that could not be
// written stay pending; it reports whether all were written.
func (d *Discovery) flush(ctx context.Context, t *term) bool {
	events := d.metrics.batchEvents
	d.metrics.batchEvents = 0
	if t.bootDirty {
		if wrote, err := t.writer.SyncBootstrap(ctx, d.bootstrap(t)); err != nil {
			t.log.Warn("bootstrap relays not republished; kept for the next batch", "err", err)
		} else {
			t.bootDirty = false
			if wrote {
				t.log.Info("bootstrap relays republished with the archived maintainers' GRASP servers", "archive_relays", len(t.index.ArchiveRelays()))
			}
		}
	}
	if len(t.pending) == 0 {
		return true
	}
	n, ok := 0, true
	for ref := range t.pending {
		wrote, err := t.writer.Sync(ctx, ref, t.index.Entry(ref))
		if err != nil {
			t.log.Warn("index write failed; kept for the next batch", "repo", ref.String(), "err", err)
			ok = false
			continue
		}
		if wrote {
			n++
		}
		delete(t.pending, ref)
	}
	d.metrics.observeBatch(events, n, t)
	d.batches++
	t.log.Info("index batch written", "batch", d.batches, "events", events, "changed_keys", n, "pending", len(t.pending))
	return ok
}
