package ingester

import (
	"context"

	"github.com/nbd-wtf/go-nostr"
)

// prefetchIDs bounds the referenced ids one prefetch query asks for: a
// batch of 256 events names a few hundred; more (events naming up to the
// policy's 100 references each) take a query per prefetchIDs.
const prefetchIDs = 1000

// prefetchCoordRows bounds the rows one prefetch query for coordinates may
// return: a query reaching it may be truncated, and none of its answers is
// kept (the policy then asks for itself). Its filters' own limits add up to
// at most half of it.
const prefetchCoordRows = 500

// prefetchReferences answers, for the whole batch, the reads rule 5 makes
// for each of evts (policy.ReferenceLookups) that no cache answers yet: the
// referenced ids with one query per prefetchIDs of them (the kinds
// StoredKinds asks for; ids not stored are remembered as such), and the
// referenced coordinates with one query over their kinds, authors and
// identifiers, from whose rows each event's own query is answered. Without
// it the decide stage made one store round trip per event for these (one
// per comment whose parent this replica did not store in the last
// refCacheTTL, one per repository the announcement cache did not hold), which
// on PostgreSQL was most of a batch's decide time
// (docs/decisions/0060-decide-reads-per-batch.md). The forward references
// (read only for an event nothing else anchors) are not read ahead: the
// decide stage of a sync rarely reaches them (same decision). A failed read
// leaves its part unanswered: the policy then asks for itself.
func (b *batch) prefetchReferences(ctx context.Context, evts []*nostr.Event) {
	now := b.i.clk.Now()
	seenID := map[string]bool{}
	seenF := map[string]bool{}
	var ids []string
	var coords []coordAsk
	for _, e := range evts {
		if l, ok := b.cache[filterKey(idFilter(e.ID))]; ok && len(l.evts) > 0 {
			continue // stored already: rule 0 refuses it as a duplicate
		}
		cfs, refs, _, ok := b.i.policy.ReferenceLookups(e)
		if !ok {
			continue
		}
		for _, id := range refs {
			if seenID[id] || b.pending.has(id) || b.inflight.has(id) {
				continue
			}
			seenID[id] = true
			if _, ok := b.i.refs.kind(id, now); ok {
				continue
			}
			if _, ok := b.cache[filterKey(idFilter(id))]; ok {
				continue
			}
			ids = append(ids, id)
		}
		for _, f := range cfs {
			if len(f.Tags["d"]) == 0 {
				continue // the rare empty identifier: read by the policy itself
			}
			key := filterKey(f)
			if seenF[key] {
				continue
			}
			seenF[key] = true
			if _, ok := b.cache[key]; ok {
				continue
			}
			a := coordAsk{f: f, key: key, shared: cacheable(f)}
			if a.shared {
				r, gen, hit := b.i.anns.get(key, now)
				if hit {
					b.cache[key] = lookup{f, r}
					continue
				}
				a.gen = gen
			}
			coords = append(coords, a)
		}
	}
	for start := 0; start < len(ids); start += prefetchIDs {
		part := ids[start:min(start+prefetchIDs, len(ids))]
		found, err := b.i.store.Query(ctx, nostr.Filter{IDs: part, Limit: len(part)})
		if err != nil {
			return
		}
		b.rememberIDs(part, found)
	}
	for len(coords) > 0 {
		n, rows := 0, 0
		for n < len(coords) && (n == 0 || rows+coords[n].f.Limit <= prefetchCoordRows/2) {
			rows += coords[n].f.Limit
			n++
		}
		if !b.prefetchCoordinates(ctx, coords[:n]) {
			return
		}
		coords = coords[n:]
	}
}

// coordAsk is one of rule 5's coordinate queries to answer ahead; gen is
// the announcement cache's generation before the read (see annCache.put).
type coordAsk struct {
	f      nostr.Filter
	key    string
	shared bool
	gen    uint64
}

// prefetchCoordinates answers asks with one query over the union of their
// kinds, authors and identifiers: every stored event any of them matches is
// among its rows (unless they reach prefetchCoordRows: then nothing is
// kept), so each ask's answer is its matches among them, in the store's
// order. ok is false when the store could not be read.
func (b *batch) prefetchCoordinates(ctx context.Context, asks []coordAsk) (ok bool) {
	var kinds []int
	var authors, ds []string
	seenK, seenA, seenD := map[int]bool{}, map[string]bool{}, map[string]bool{}
	for _, a := range asks {
		for _, k := range a.f.Kinds {
			if !seenK[k] {
				seenK[k] = true
				kinds = append(kinds, k)
			}
		}
		for _, p := range a.f.Authors {
			if !seenA[p] {
				seenA[p] = true
				authors = append(authors, p)
			}
		}
		for _, d := range a.f.Tags["d"] {
			if !seenD[d] {
				seenD[d] = true
				ds = append(ds, d)
			}
		}
	}
	found, err := b.i.store.Query(ctx, nostr.Filter{Kinds: kinds, Authors: authors, Tags: nostr.TagMap{"d": ds}, Limit: prefetchCoordRows})
	if err != nil {
		return false
	}
	if len(found) >= prefetchCoordRows {
		return true // perhaps truncated: the policy asks for itself
	}
	now := b.i.clk.Now()
	for _, a := range asks {
		var r []*nostr.Event
		for _, e := range found {
			if a.f.Matches(e) {
				r = append(r, e)
			}
		}
		if len(r) > a.f.Limit {
			continue // which of them the store returns is its choice
		}
		b.cache[a.key] = lookup{a.f, r}
		if a.shared {
			b.i.anns.put(a.key, a.f, r, a.gen, now)
		}
	}
	return true
}
