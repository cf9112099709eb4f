package ingester

import (
	"encoding/hex"
	"sync"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
)

// refCacheMax bounds the memory of stored events: two generations of
// refCacheMax/2 entries each, the older dropped when the newer fills, so
// it holds the last 32,768 to 65,536 events this replica stored. An entry
// is a 32-byte id, a kind and a time (48 bytes in the map's slot): 7 MB of
// heap once both maps have held a generation (measured with go1.26: ~110
// bytes per entry of capacity; clear keeps a map's capacity). A sync
// stores a layer of roots (issues, patches) before the comments on them
// (the comments layer is asked for by the roots' ids), so the memory must
// span a layer: 16,384 entries caught 11 % of the lookups of make bench's
// remote world (24,000 roots), 65,536 all of them.
const refCacheMax = 65536

// refCacheTTL bounds how long an entry is trusted without a notice: a
// deletion notice another writer failed to send (core NATS, at most once;
// losses on this side are detected, see watchAnnouncements) leaves a
// deleted event "stored" no longer than this. Long enough to span a sync's
// layer of roots; the parking sweep's interval, the bound the ingester
// already keeps for a lost wake-up.
const refCacheTTL = 30 * time.Second

// refCache remembers the ids and kinds of the events this replica has just
// stored, so that the policy's rule 5 lookup of a referenced event (a
// comment's issue, stored a batch or a pass earlier) is answered without a
// store read (policy.KindLookup; docs/decisions/0054-ingester-memory-of-stored-events.md). It only ever says "stored": a miss reads the
// store, so events other writers stored are found as before.
//
// Only events whose id stays stored until a deletion names it are kept:
// regular kinds (a replaceable or addressable version is replaced without
// notice) without a NIP-40 expiration (expired events are removed without
// notice). A deletion, stored by this replica (publishStored) or by any
// other writer (its grasp.stored.5 notice, watchAnnouncements), drops the
// ids it names; an entry put from a write that began before an
// invalidation is not kept (gen). Entries expire after refCacheTTL.
type refCache struct {
	mu      sync.Mutex
	enabled bool
	gen     uint64
	// cur fills up to refCacheMax/2 entries, then becomes old.
	cur, old map[[32]byte]refEntry
}

type refEntry struct {
	kind int32
	at   int64 // unix nanoseconds
}

func newRefCache() *refCache {
	return &refCache{cur: map[[32]byte]refEntry{}, old: map[[32]byte]refEntry{}}
}

// refKey decodes an event id (64 lower-case hex characters, as the policy
// takes them); ok is false for anything else.
func refKey(id string) (k [32]byte, ok bool) {
	if !nip34.IsEventID(id) {
		return k, false
	}
	_, err := hex.Decode(k[:], []byte(id))
	return k, err == nil
}

// keeps reports whether evt may be remembered once stored.
func keeps(evt *nostr.Event) bool {
	return nostr.IsRegularKind(evt.Kind) && evt.Tags.Find("expiration") == nil
}

// generation returns the generation a write must pass to put.
func (c *refCache) generation() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// put remembers evts, stored by a write that began at generation gen,
// unless something was invalidated since.
func (c *refCache) put(evts []*nostr.Event, gen uint64, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.enabled || gen != c.gen {
		return
	}
	for _, e := range evts {
		k, ok := refKey(e.ID)
		if !ok || !keeps(e) {
			continue
		}
		if len(c.cur) >= refCacheMax/2 {
			c.old, c.cur = c.cur, c.old
			clear(c.cur)
		}
		c.cur[k] = refEntry{kind: int32(e.Kind), at: now.UnixNano()}
	}
}

// kind returns the kind of the stored event id, if it is remembered.
func (c *refCache) kind(id string, now time.Time) (int, bool) {
	k, ok := refKey(id)
	if !ok {
		return 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.enabled {
		return 0, false
	}
	e, ok := c.cur[k]
	if !ok {
		e, ok = c.old[k]
	}
	if !ok || now.UnixNano()-e.at >= int64(refCacheTTL) {
		return 0, false
	}
	return int(e.kind), true
}

// stored drops what storing evt may have removed: for a deletion, the ids
// it names (only its author's events are removed, but which author an
// entry's event has is not kept; dropping more is harmless).
func (c *refCache) stored(evt *nostr.Event) {
	if evt.Kind != nip34.KindDeletion {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	for _, t := range evt.Tags {
		if len(t) >= 2 && t[0] == "e" {
			if k, ok := refKey(t[1]); ok {
				delete(c.cur, k)
				delete(c.old, k)
			}
		}
	}
}

// clearAll drops every entry.
func (c *refCache) clearAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	clear(c.cur)
	clear(c.old)
}

// reset drops every entry and sets whether the cache is in use.
func (c *refCache) reset(enabled bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.enabled = enabled
	clear(c.cur)
	clear(c.old)
}
