package ingester

import (
	"context"
	"errors"
	"fmt"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/store"
)

// batch is the decide stage's view of the store for one batch: the policy
// reads the store through it, and accepted events wait in pending until the
// batch is written.
type batch struct {
	i       *Ingester
	pending *pendingSet
	// deferred are the events of this pass waiting for the next one:
	// events depending on them wait too.
	deferred *pendingSet
	// inflight are the events the previous batch is writing while this one
	// is decided (see write): until that write is settled they count as
	// pending here, so a decision that would see one of them waits for the
	// next pass, which comes after the write. nil once it is settled.
	inflight *pendingSet
	// cache holds lookup results (by filterKey) until the batch writes an
	// event that could change them (see flush): only other writers can
	// change the rest, which is no different from the lookup having been
	// made a moment earlier. Most events of a batch ask for the same few
	// announcements, and the events deferred to a later pass ask again
	// what the prefetch answered. Bounded by the lookups of one batch.
	cache map[string]lookup
}

// lookup is a cached answer and the filter it answers.
type lookup struct {
	f    nostr.Filter
	evts []*nostr.Event
}

// errDeferred fails a lookup that an event of the batch not written yet
// would answer: the decision waits for the next pass (see decide).
var errDeferred = errors.New("depends on an event of this batch not written yet")

// Query implements policy.Lookup. A lookup that an accepted, not yet
// written event of this batch (or one deferred) would answer fails with
// errDeferred: a decision that depends on an event is made only once that
// event is stored (or refused).
func (b *batch) Query(ctx context.Context, f nostr.Filter) ([]*nostr.Event, error) {
	if b.pending.matches(f) || b.deferred.matches(f) || b.inflight.matches(f) {
		return nil, errDeferred
	}
	key := filterKey(f)
	if l, ok := b.cache[key]; ok {
		return l.evts, nil
	}
	shared := cacheable(f)
	var gen uint64
	if shared {
		var r []*nostr.Event
		var hit bool
		if r, gen, hit = b.i.anns.get(key, b.i.clk.Now()); hit {
			b.cache[key] = lookup{f, r}
			return r, nil
		}
	}
	r, err := b.i.store.Query(ctx, f)
	if err != nil {
		return nil, err
	}
	if shared {
		b.i.anns.put(key, f, r, gen, b.i.clk.Now())
	}
	b.cache[key] = lookup{f, r}
	return r, nil
}

// StoredKinds implements policy.KindLookup, for rule 5's lookup of the
// events an event references: the ids this replica stored a moment ago
// are answered from its memory of them (refCache), those the batch has
// read already (prefetchReferences, or an earlier event's lookup) from its
// cache, the others by the store, and remembered for the batch, found or
// not (rememberIDs).
func (b *batch) StoredKinds(ctx context.Context, ids []string) ([]int, error) {
	kinds := make([]int, len(ids))
	var miss []string
	now := b.i.clk.Now()
	for n, id := range ids {
		if b.pending.has(id) || b.deferred.has(id) || b.inflight.has(id) {
			// As Query: the decision waits for the event's write.
			return nil, errDeferred
		}
		if k, ok := b.i.refs.kind(id, now); ok {
			kinds[n] = k
			continue
		}
		kinds[n] = -1
		if l, ok := b.cache[filterKey(idFilter(id))]; ok {
			if len(l.evts) > 0 {
				kinds[n] = l.evts[0].Kind
			}
			continue
		}
		miss = append(miss, id)
	}
	if len(miss) == 0 {
		return kinds, nil
	}
	found, err := b.i.store.Query(ctx, nostr.Filter{IDs: miss, Limit: len(miss)})
	if err != nil {
		return nil, err
	}
	b.rememberIDs(miss, found)
	for _, e := range found {
		for n, id := range ids {
			if id == e.ID {
				kinds[n] = e.Kind
			}
		}
	}
	return kinds, nil
}

// idFilter is the policy's lookup of one id (rule 0's duplicate check):
// the batch caches what it knows of an id under that filter, which both
// Query and StoredKinds read.
func idFilter(id string) nostr.Filter { return nostr.Filter{IDs: []string{id}, Limit: 1} }

// rememberIDs caches, for each of ids, the event found for it or that none
// is stored: a complete read of ids (found is what the store returned for
// them all, unlimited by anything but their number).
func (b *batch) rememberIDs(ids []string, found []*nostr.Event) {
	byID := make(map[string]*nostr.Event, len(found))
	for _, e := range found {
		byID[e.ID] = e
	}
	for _, id := range ids {
		var r []*nostr.Event
		if e := byID[id]; e != nil {
			r = []*nostr.Event{e}
		}
		f := idFilter(id)
		b.cache[filterKey(f)] = lookup{f, r}
	}
}

// prefetch answers the lookups the policy makes for every event (is its id
// stored, is it deleted by its author) for the whole batch with one query
// each (none for ids the verify stage just found unstored), into the
// cache, and then rule 5's reads of the events' references
// (prefetchReferences). The filters are built as the policy builds
// them; should they differ, the cache simply misses. A failed or truncated
// read leaves the cache empty: the policy then asks for itself.
func (b *batch) prefetch(ctx context.Context, items []*item) {
	var evts []*nostr.Event
	var ids, ask []string
	for _, it := range items {
		if it.check == checkVerified && !b.pending.has(it.evt.ID) {
			evts = append(evts, it.evt)
			ids = append(ids, it.evt.ID)
			if !it.unstored {
				ask = append(ask, it.evt.ID)
			}
		}
	}
	if len(evts) < 2 {
		return
	}
	var found []*nostr.Event
	if len(ask) > 0 {
		var err error
		if found, err = b.i.store.Query(ctx, nostr.Filter{IDs: ask, Limit: len(ask)}); err != nil {
			return
		}
	}
	// The ids the verify stage found unstored are not stored either.
	b.rememberIDs(ids, found)
	b.prefetchDeletions(ctx, evts, ids)
	b.prefetchReferences(ctx, evts)
}

// prefetchDeletions answers rule 0's "deleted by its author" lookup of
// each of evts (whose ids are ids).
func (b *batch) prefetchDeletions(ctx context.Context, evts []*nostr.Event, ids []string) {
	dels, ok := b.deletions(ctx, ids)
	if !ok {
		return
	}
	for _, e := range evts {
		if e.Kind == nip34.KindDeletion {
			continue // a deletion cannot be deleted: the policy does not ask
		}
		f := nostr.Filter{Kinds: []int{nip34.KindDeletion}, Authors: []string{e.PubKey}, Tags: nostr.TagMap{"e": {e.ID}}, Limit: 1}
		var r []*nostr.Event
		for _, d := range dels {
			if f.Matches(d) {
				r = []*nostr.Event{d}
				break
			}
		}
		b.cache[filterKey(f)] = lookup{f, r}
	}
}

// fewDeletions bounds the stored deletions prefetch reads all of (see
// deletions).
const fewDeletions = 64

// deletions returns stored deletions among which are all those tagging one
// of ids, ok false when it could not tell. While the store holds fewer than
// fewDeletions deletions it reads them all from the kind index (one prefix;
// nothing at all to load on a store without deletions) instead of asking
// the "e" tag index for each id, which costs one index seek per id (~5
// cpu-µs per event in BenchmarkIngest; docs/measurements/2026-12-02-ingester-where-the-us-go-acks-in-order.md).
// The caller matches each event's filter against the result, so a superset
// is as good. Once the store is found holding fewDeletions, that read is
// never tried again (Ingester.manyDeletions): deletions are never removed.
func (b *batch) deletions(ctx context.Context, ids []string) ([]*nostr.Event, bool) {
	if !b.i.manyDeletions.Load() {
		all, err := b.i.store.Query(ctx, nostr.Filter{Kinds: []int{nip34.KindDeletion}, Limit: fewDeletions})
		if err == nil && len(all) < fewDeletions {
			return all, true
		}
		if err == nil {
			b.i.manyDeletions.Store(true)
		}
	}
	limit := 4 * len(ids)
	dels, err := b.i.store.Query(ctx, nostr.Filter{Kinds: []int{nip34.KindDeletion}, Tags: nostr.TagMap{"e": ids}, Limit: limit})
	return dels, err == nil && len(dels) < limit
}

// flush writes the pending events (see write) and forgets the cached
// answers the write may change. An error means at least one event was not
// written (its item carries the error).
func (b *batch) flush(ctx context.Context) error {
	items := b.pending.items
	if len(items) == 0 {
		return nil
	}
	b.forget(b.pending)
	b.pending = newPendingSet()
	return b.i.write(ctx, items)
}

// afterWrite is called once the previous batch's write, which this batch's
// decisions so far treated as pending (inflight), is settled: its events are
// stored or failed, so the cached answers they may change are dropped, all
// of them when some failed (their retry may have stored, parked or refused
// anything of theirs), and later lookups read the store.
func (b *batch) afterWrite(w *write) {
	if len(w.failed) > 0 {
		clear(b.cache)
	} else {
		b.forget(w.pending)
	}
	b.inflight = nil
}

// write writes the accepted events of items with one SaveBatch, then
// applies stored deletions, publishes what was stored and settles each
// item. An error means at least one event was not written (its item carries
// the error). It touches nothing of a batch but items: the decide stage runs
// it for a batch's last pass while it decides the next batch (see write in
// decide.go).
func (i *Ingester) write(ctx context.Context, items []*item) error {
	evts := make([]*nostr.Event, len(items))
	for n, it := range items {
		evts[n] = it.evt
	}
	var failed error
	// Read before the write: a deletion noticed after it began may have
	// removed what it stored, which is then not remembered.
	gen := i.refs.generation()
	var stored []*nostr.Event
	start := i.clk.Now()
	results := i.store.SaveBatch(ctx, evts)
	i.m.observeStage(stageStore, i.clk.Now().Sub(start))
	for n, r := range results {
		it := items[n]
		switch {
		case i.targetRefused(ctx, it.evt, it.relay, r.Err):
			i.done(it, outcomeTargetRefused)
		case errors.Is(r.Err, store.ErrUnstorable):
			i.log.Debug("accepted event cannot be stored", "id", it.evt.ID, "kind", it.evt.Kind, "relay", it.relay, "err", r.Err)
			i.done(it, outcomeUnstorable)
		case r.Err != nil:
			it.err = fmt.Errorf("store %s: %w", it.evt.ID, r.Err)
			failed = it.err
		case !r.Stored:
			// Stored by another writer since the lookups: a redelivery
			// still owes the announcement (see duplicate).
			if i.duplicate(ctx, it); it.err != nil {
				failed = it.err
			}
		default:
			if err := store.Settle(ctx, i.store, it.evt, func(e *nostr.Event) { i.publishStored(e, it.data) }); err != nil {
				// The deletion is stored; its retry finds it a
				// duplicate and applies it again (see duplicate).
				it.err, failed = err, err
				continue
			}
			i.done(it, outcomeStored)
			stored = append(stored, it.evt)
		}
	}
	i.refs.put(stored, gen, i.clk.Now())
	return failed
}

// forget drops the cached answers that writing events may change: those
// whose filter one of them matches or, when one of them replaces or deletes
// stored events (which any filter may have found), all of them.
func (b *batch) forget(events *pendingSet) {
	for _, it := range events.items {
		if k := it.evt.Kind; k == nip34.KindDeletion || nostr.IsReplaceableKind(k) || nostr.IsAddressableKind(k) {
			clear(b.cache)
			return
		}
	}
	for key, l := range b.cache {
		if events.matches(l.f) {
			delete(b.cache, key)
		}
	}
}
