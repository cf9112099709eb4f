package ingester

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
)

// annCacheMax bounds the announcement cache: past it the cache starts
// over. Each entry is one identifier's (or one coordinate lookup's)
// announcements; a deployment serves far fewer repositories per second of
// TTL than this.
const annCacheMax = 4096

// annCacheTTL bounds how long an entry is trusted without a notice: the
// stored-event notices are core NATS, at most once, so one lost (a
// reconnect, a slow consumer) must not leave an entry stale for longer.
const annCacheTTL = 2 * time.Second

// annCache keeps the answers to the policy's announcement lookups (kind
// 30617 by identifier, optionally by author) across decide batches: most
// events of a sync name the same few repositories, and each asks for their
// announcements (rules 1, 2 and 5). docs/decisions/0052-ingester-announcement-cache.md.
//
// An entry is dropped when an announcement with one of its identifiers is
// stored (by this ingester, synchronously in publishStored, and by any
// other writer through its grasp.stored.30617 notice), and every entry when
// a deletion is stored (it may remove announcements). A lookup that read
// the store before an invalidation is not cached after it (gen). Only the
// decide stage reads through it; re-evaluations of parked events read the
// store directly, so an event parked on a stale "not a maintainer" is
// re-evaluated against the store right after it is parked.
type annCache struct {
	mu      sync.Mutex
	enabled bool
	// gen counts invalidations; an answer read at an older gen is not kept.
	gen     uint64
	entries map[string]annEntry
	byD     map[string][]string // identifier → keys of the entries naming it
	// notices counts the stored notices taken (watchAnnouncements).
	notices int64
}

type annEntry struct {
	evts []*nostr.Event
	at   time.Time
}

func newAnnCache() *annCache {
	return &annCache{entries: map[string]annEntry{}, byD: map[string][]string{}}
}

// cacheable reports whether f is an announcement lookup the cache keeps:
// kind 30617 only, by non-empty identifiers, optionally by authors, with no
// ids or time bounds.
func cacheable(f nostr.Filter) bool {
	if len(f.IDs) > 0 || len(f.Kinds) == 0 || f.Since != nil || f.Until != nil || f.Search != "" || f.LimitZero {
		return false
	}
	for _, k := range f.Kinds {
		if k != nip34.KindRepoAnnouncement {
			return false
		}
	}
	ds, ok := f.Tags["d"]
	if len(f.Tags) != 1 || !ok || len(ds) == 0 {
		return false
	}
	return !slices.Contains(ds, "")
}

// get returns the cached answer for key, and the generation a miss must
// pass to put.
func (c *annCache) get(key string, now time.Time) ([]*nostr.Event, uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.enabled {
		return nil, 0, false
	}
	e, ok := c.entries[key]
	if ok && now.Sub(e.at) < annCacheTTL {
		return e.evts, c.gen, true
	}
	return nil, c.gen, false
}

// put keeps an answer read at generation gen, unless something was
// invalidated since.
func (c *annCache) put(key string, f nostr.Filter, evts []*nostr.Event, gen uint64, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.enabled || gen != c.gen {
		return
	}
	if len(c.entries) >= annCacheMax {
		clear(c.entries)
		clear(c.byD)
	}
	if _, had := c.entries[key]; !had {
		for _, d := range f.Tags["d"] {
			c.byD[d] = append(c.byD[d], key)
		}
	}
	c.entries[key] = annEntry{evts: evts, at: now}
}

// stored drops what storing evt may have changed: for an announcement the
// entries of its identifier, for a deletion everything.
func (c *annCache) stored(evt *nostr.Event) {
	switch evt.Kind {
	case nip34.KindRepoAnnouncement:
		c.invalidate(evt.Tags.GetD())
	case nip34.KindDeletion:
		c.clearAll()
	}
}

// clearAll drops every entry.
func (c *annCache) clearAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	clear(c.entries)
	clear(c.byD)
}

// invalidate drops the entries naming identifier d.
func (c *annCache) invalidate(d string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	for _, key := range c.byD[d] {
		delete(c.entries, key)
	}
	delete(c.byD, d)
}

// reset drops every entry and sets whether the cache is in use.
func (c *annCache) reset(enabled bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.enabled = enabled
	clear(c.entries)
	clear(c.byD)
}

// AnnouncementNotices is how many grasp.stored.30617 and grasp.stored.5
// notices (this replica's own included) the announcement cache has taken:
// tests wait on it to know a notice has been taken.
func (i *Ingester) AnnouncementNotices() int64 {
	i.anns.mu.Lock()
	defer i.anns.mu.Unlock()
	return i.anns.notices
}

// WatchingStoredNotices reports whether Run has subscribed to the stored
// notices and turned the lookup caches on: a notice published before that
// is not taken, so tests that count notices wait for this first.
func (i *Ingester) WatchingStoredNotices() bool {
	i.anns.mu.Lock()
	defer i.anns.mu.Unlock()
	return i.anns.enabled
}

// noticeLossCheck is how often watchAnnouncements looks for notices NATS
// dropped on their way here.
const noticeLossCheck = time.Second

// watchAnnouncements keeps the announcement cache and the memory of stored
// events in step with other writers (relay replicas, other ingesters) from
// their grasp.stored.30617 and grasp.stored.5 notices, until ctx is done.
// Every replica takes every notice (no queue group). The caches are in use
// only while the subscription is: enabled once subscribed and disabled on
// return. Notices this side can tell it lost (the subscription dropped
// some as a slow consumer, or the connection was re-established) drop
// everything both caches hold, within noticeLossCheck; a notice its writer
// failed to send is covered by the caches' TTLs only.
func (i *Ingester) watchAnnouncements(ctx context.Context) error {
	ch := make(chan *nats.Msg, wakeQueue)
	var subs []*nats.Subscription
	defer func() {
		i.lookupCaches(false)
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}()
	for _, kind := range []int{nip34.KindRepoAnnouncement, nip34.KindDeletion} {
		s, err := i.bus.Conn.ChanSubscribe(i.bus.Names.StoredSubject(kind), ch)
		if err != nil {
			return fmt.Errorf("subscribe %s: %w", i.bus.Names.StoredSubject(kind), err)
		}
		subs = append(subs, s)
	}
	// Subscribed before the first lookup is kept: no notice after this
	// point is missed (short of NATS dropping it, which the TTL covers).
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err := i.bus.Conn.FlushWithContext(fctx)
	cancel()
	if ctx.Err() != nil {
		return nil
	}
	if err != nil {
		return fmt.Errorf("subscribe stored announcements: %w", err)
	}
	i.lookupCaches(true)
	// Real time, not i.clk: this is no timer of the ingester's logic, and
	// a fake clock in a test must not be made to fire it.
	tick := time.NewTicker(noticeLossCheck)
	defer tick.Stop()
	lost := i.noticesLost(subs)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if n := i.noticesLost(subs); n != lost {
				lost = n
				i.log.Warn("stored notices lost (slow consumer or reconnect): dropping the cached lookups", "consumer", i.cfg.Consumer)
				i.forgetLookups()
			}
		case msg := <-ch:
			if evt, err := decode(msg.Data); err == nil {
				i.noteStored(evt)
			} else {
				// Cannot tell which identifier: drop everything.
				i.forgetLookups()
			}
			i.anns.mu.Lock()
			i.anns.notices++
			i.anns.mu.Unlock()
		}
	}
}

// The decide stage's cross-batch lookup caches (anns, refs) follow the
// stored events together: every place that learns of a store, of a
// possible loss of notices, or of the notices starting or stopping tells
// both through these.

// noteStored updates the lookup caches for an event just stored.
func (i *Ingester) noteStored(evt *nostr.Event) {
	i.anns.stored(evt)
	i.refs.stored(evt)
}

// forgetLookups empties the lookup caches.
func (i *Ingester) forgetLookups() {
	i.anns.clearAll()
	i.refs.clearAll()
}

// lookupCaches empties the lookup caches and turns them on or off.
func (i *Ingester) lookupCaches(on bool) {
	i.anns.reset(on)
	i.refs.reset(on)
}

// noticesLost counts what says notices may have been lost: messages the
// subscriptions dropped and reconnections of the connection.
func (i *Ingester) noticesLost(subs []*nats.Subscription) uint64 {
	n := i.bus.Conn.Stats().Reconnects
	for _, s := range subs {
		if d, err := s.Dropped(); err == nil {
			n += uint64(d)
		}
	}
	return n
}
