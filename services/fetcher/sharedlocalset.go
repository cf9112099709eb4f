package fetcher

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"golang.org/x/sync/singleflight"

	"github.com/grasp-sync/grasp-sync/pkg/negsync"
)

// Sharing a local set: every relay's layer-1 batch reconciles the same
// filter (all announcements and grasp lists), so without sharing the store
// lists every announcement once per NIP-77 relay — relays × announcements
// reads, a sixth of the upper world's sync CPU (docs/performance.md). A
// filter's items are read once, built into a negsync.Set (sorted, summed)
// once, and handed to the batches that ask for the same filter within
// sharedLocalSetTTL.
//
// A shared list may lack what was stored in the last few seconds; that only
// makes a reconciliation name those ids, which dropHeld then finds held (it
// asks the store, never the shared lists) before anything is fetched. A
// shared list may also still name an event the store has since replaced or
// deleted; nothing then fetches that event again, which is what the store
// decided anyway.
const (
	// sharedLocalSetTTL is how long a filter's items are handed out again.
	sharedLocalSetTTL = 3 * time.Second
	// sharedLocalSetMaxItems bounds the items held across filters
	// (~120 bytes each with the set's running sums: ~12 MB); a list larger
	// than the bound is not kept.
	sharedLocalSetMaxItems = 100_000
)

// sharedLocalSet is a LocalSet that keeps each filter's set for ttl and
// reads a filter's items once for the callers asking for it at the same time.
// The sets and lists it returns are shared: callers must not modify them
// (negsync and the batches only read them).
type sharedLocalSet struct {
	base     LocalSet
	ttl      time.Duration
	maxItems int
	now      func() time.Time
	// reads counts reads by source: "store" (the base set was read) or
	// "shared" (a list read for another caller was handed out); may be nil.
	reads func(source string)

	flight singleflight.Group

	mu      sync.Mutex
	entries map[string]sharedEntry
	// order is the keys in the order they were kept, which with one TTL
	// for all is the order they expire in; an element whose expiry differs
	// from its entry's was kept again later and is skipped.
	order []orderedKey
	held  int // items across entries
}

type sharedEntry struct {
	set     *negsync.Set
	expires time.Time
}

// setSource is a LocalSet that hands out sets built for reconciliation
// (sharedLocalSet), so that a set shared by many relays is built once.
type setSource interface {
	Set(ctx context.Context, f nostr.Filter) (*negsync.Set, error)
}

type orderedKey struct {
	key     string
	expires time.Time
}

func newSharedLocalSet(base LocalSet, ttl time.Duration, maxItems int, now func() time.Time, reads func(string)) *sharedLocalSet {
	if reads == nil {
		reads = func(string) {}
	}
	return &sharedLocalSet{base: base, ttl: ttl, maxItems: maxItems, now: now, reads: reads,
		entries: map[string]sharedEntry{}}
}

// Held asks the base set: dropHeld relies on an answer as fresh as the store.
func (s *sharedLocalSet) Held(ctx context.Context, ids []string) ([]string, error) {
	return heldIn(ctx, s.base, ids)
}

// Items returns f's items (in NIP-77's order, each once), read from the
// base set at most once per ttl.
func (s *sharedLocalSet) Items(ctx context.Context, f nostr.Filter) ([]negsync.Item, error) {
	set, err := s.Set(ctx, f)
	return set.Items(), err
}

// Set returns f's set, read from the base set and built at most once per
// ttl.
func (s *sharedLocalSet) Set(ctx context.Context, f nostr.Filter) (*negsync.Set, error) {
	key := f.String()
	for {
		if set, ok := s.lookup(key); ok {
			s.reads("shared")
			return set, nil
		}
		ch := s.flight.DoChan(key, func() (any, error) {
			items, err := s.base.Items(ctx, f)
			if err != nil {
				return nil, err
			}
			set := negsync.NewSet(items)
			s.keep(key, set)
			return set, nil
		})
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case r := <-ch:
			if r.Err != nil {
				// The read ran under another caller's context, which ended;
				// ours has not: read again.
				if isContextErr(r.Err) && ctx.Err() == nil {
					continue
				}
				return nil, r.Err
			}
			if r.Shared {
				s.reads("shared")
			} else {
				s.reads("store")
			}
			return r.Val.(*negsync.Set), nil
		}
	}
}

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// lookup returns key's set if it has not expired.
func (s *sharedLocalSet) lookup(key string) (*negsync.Set, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[key]
	if !ok || !s.now().Before(e.expires) {
		return nil, false
	}
	return e.set, true
}

// keep holds set for key until ttl from now, dropping expired entries
// and then the soonest to expire until they fit within maxItems. An empty
// list is not kept: a batch whose local set is empty reads the filter's
// whole history with REQ (partRead, combined reads), so an empty list
// that is no longer true would fetch again everything stored meanwhile;
// and an empty list is cheap to read.
func (s *sharedLocalSet) keep(key string, set *negsync.Set) {
	if set.Len() == 0 || set.Len() > s.maxItems {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	s.drop(key)
	for len(s.order) > 0 && (!now.Before(s.order[0].expires) || s.held+set.Len() > s.maxItems) {
		first := s.order[0]
		s.order[0] = orderedKey{}
		s.order = s.order[1:]
		if e, ok := s.entries[first.key]; ok && e.expires.Equal(first.expires) {
			s.drop(first.key)
		}
	}
	expires := now.Add(s.ttl)
	s.entries[key] = sharedEntry{set: set, expires: expires}
	s.order = append(s.order, orderedKey{key: key, expires: expires})
	s.held += set.Len()
}

func (s *sharedLocalSet) drop(key string) {
	if e, ok := s.entries[key]; ok {
		s.held -= e.set.Len()
		delete(s.entries, key)
	}
}
