package testrelay

import (
	"cmp"
	"context"
	"slices"
	"sync"

	"github.com/fiatjaf/eventstore"
	"github.com/nbd-wtf/go-nostr"
)

// MemStore is an in-memory eventstore.Store indexed by id, author and tag
// value, for relay farms that run hundreds of relays in one process: a
// badger store per relay (what testrelay.Start uses) costs a directory, caches
// and goroutines each, which at farm scale took more of the box than the
// system under test. Queries answer newest first (created_at descending,
// then id), like khatru's stores. Limit is applied as given: a relay's REQ
// cap is the relay's business (an OverwriteFilter hook), and a filter
// without a limit (a NIP-77 session) gets every match.
//
// IgnoreTagLetter stands for plain khatru over a store that matches tag
// filters by value only: {"#A": [x]} also returns events tagged ["a", x]
// (see e2e.StrictTags). It ignores the letter for every value, as
// eventstore's sqlite3 and postgresql do; eventstore's badger, which
// ngit-relay uses, does so only for coordinates and keeps it for event ids
// (docs/dependencies.md, "eventstore v0.17.2"), so against it the quirk costs less
// than here.
type MemStore struct {
	// IgnoreTagLetter matches tag filters by value whatever the letter.
	IgnoreTagLetter bool

	mu       sync.RWMutex
	byID     map[string]*nostr.Event
	all      []*nostr.Event
	byAuthor map[string][]*nostr.Event
	byTag    map[string][]*nostr.Event
	// dirty lists were appended to since they were last sorted (key "" is
	// all, "p:" prefixes authors, "t:" tags).
	dirty map[string]struct{}
}

var _ eventstore.Store = (*MemStore)(nil)

// Init prepares the indexes; it is safe to call more than once.
func (s *MemStore) Init() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byID == nil {
		s.byID = map[string]*nostr.Event{}
		s.byAuthor = map[string][]*nostr.Event{}
		s.byTag = map[string][]*nostr.Event{}
		s.dirty = map[string]struct{}{}
	}
	return nil
}

// Close does nothing: the store is memory only.
func (s *MemStore) Close() {}

// Len is the number of stored events.
func (s *MemStore) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.byID)
}

// tagKey is the index key of one tag value.
func (s *MemStore) tagKey(letter, value string) string {
	if s.IgnoreTagLetter {
		return value
	}
	return letter + "\x00" + value
}

// newestFirst orders events as relays return them.
func newestFirst(a, b *nostr.Event) int {
	if c := cmp.Compare(b.CreatedAt, a.CreatedAt); c != 0 {
		return c
	}
	return cmp.Compare(a.ID, b.ID)
}

// SaveEvent stores evt; a stored id is eventstore.ErrDupEvent.
func (s *MemStore) SaveEvent(_ context.Context, evt *nostr.Event) error {
	if err := s.Init(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.byID[evt.ID]; ok {
		return eventstore.ErrDupEvent
	}
	s.byID[evt.ID] = evt
	s.all = append(s.all, evt)
	s.dirty[""] = struct{}{}
	s.byAuthor[evt.PubKey] = append(s.byAuthor[evt.PubKey], evt)
	s.dirty["p:"+evt.PubKey] = struct{}{}
	seen := map[string]bool{}
	for _, tag := range evt.Tags {
		if len(tag) < 2 || len(tag[0]) != 1 {
			continue
		}
		k := s.tagKey(tag[0], tag[1])
		if seen[k] {
			continue
		}
		seen[k] = true
		s.byTag[k] = append(s.byTag[k], evt)
		s.dirty["t:"+k] = struct{}{}
	}
	return nil
}

// DeleteEvent removes evt (by id) from every index.
func (s *MemStore) DeleteEvent(_ context.Context, evt *nostr.Event) error {
	if err := s.Init(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.byID[evt.ID]
	if !ok {
		return nil
	}
	delete(s.byID, evt.ID)
	drop := func(l []*nostr.Event) []*nostr.Event {
		return slices.DeleteFunc(l, func(e *nostr.Event) bool { return e == old })
	}
	s.all = drop(s.all)
	s.byAuthor[old.PubKey] = drop(s.byAuthor[old.PubKey])
	for _, tag := range old.Tags {
		if len(tag) >= 2 && len(tag[0]) == 1 {
			k := s.tagKey(tag[0], tag[1])
			s.byTag[k] = drop(s.byTag[k])
		}
	}
	return nil
}

// ReplaceEvent stores a replaceable or addressable event in place of the
// older versions of the same kind, author (and d tag); an older evt than
// the stored one is dropped.
func (s *MemStore) ReplaceEvent(ctx context.Context, evt *nostr.Event) error {
	f := nostr.Filter{Kinds: []int{evt.Kind}, Authors: []string{evt.PubKey}}
	if nostr.IsAddressableKind(evt.Kind) {
		f.Tags = nostr.TagMap{"d": []string{evt.Tags.GetD()}}
	}
	for _, prev := range s.query(f) {
		if prev.CreatedAt > evt.CreatedAt || (prev.CreatedAt == evt.CreatedAt && prev.ID <= evt.ID) {
			return nil // a newer version (or, in the same second, the lower id) is stored: NIP-01
		}
		if err := s.DeleteEvent(ctx, prev); err != nil {
			return err
		}
	}
	if err := s.SaveEvent(ctx, evt); err != nil && err != eventstore.ErrDupEvent {
		return err
	}
	return nil
}

// QueryEvents answers f newest first on a channel closed at the end (or
// when ctx ends).
func (s *MemStore) QueryEvents(ctx context.Context, f nostr.Filter) (chan *nostr.Event, error) {
	res := s.query(f)
	ch := make(chan *nostr.Event)
	go func() {
		defer close(ch)
		for _, e := range res {
			select {
			case ch <- e:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}

// CountEvents counts f's matches (its limit applies).
func (s *MemStore) CountEvents(_ context.Context, f nostr.Filter) (int64, error) {
	return int64(len(s.query(f))), nil
}

// sortDirty sorts every list appended to since the last query.
func (s *MemStore) sortDirty() {
	s.mu.RLock()
	n := len(s.dirty)
	s.mu.RUnlock()
	if n == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.dirty {
		switch {
		case k == "":
			slices.SortFunc(s.all, newestFirst)
		case k[:2] == "p:":
			slices.SortFunc(s.byAuthor[k[2:]], newestFirst)
		default:
			slices.SortFunc(s.byTag[k[2:]], newestFirst)
		}
	}
	clear(s.dirty)
}

// query returns f's matches newest first, at most f.Limit (no limit when
// it is 0).
func (s *MemStore) query(f nostr.Filter) []*nostr.Event {
	if f.LimitZero {
		return nil
	}
	if err := s.Init(); err != nil {
		return nil
	}
	s.sortDirty()
	s.mu.RLock()
	defer s.mu.RUnlock()
	cands := s.candidates(f)
	var out []*nostr.Event
	for _, e := range cands {
		if f.Until != nil && e.CreatedAt > *f.Until {
			continue
		}
		if f.Since != nil && e.CreatedAt < *f.Since {
			break // newest first: the rest are older still
		}
		if !s.matches(f, e) {
			continue
		}
		out = append(out, e)
		if f.Limit > 0 && len(out) == f.Limit {
			break
		}
	}
	return out
}

// candidates is the smallest indexed list that holds every match of f,
// newest first; the caller still checks each against f.
func (s *MemStore) candidates(f nostr.Filter) []*nostr.Event {
	union := func(lists [][]*nostr.Event) []*nostr.Event {
		if len(lists) == 1 {
			return lists[0]
		}
		seen := map[*nostr.Event]bool{}
		var out []*nostr.Event
		for _, l := range lists {
			for _, e := range l {
				if !seen[e] {
					seen[e] = true
					out = append(out, e)
				}
			}
		}
		slices.SortFunc(out, newestFirst)
		return out
	}
	if len(f.IDs) > 0 {
		var out []*nostr.Event
		for _, id := range f.IDs {
			if e, ok := s.byID[id]; ok {
				out = append(out, e)
			}
		}
		slices.SortFunc(out, newestFirst)
		return slices.CompactFunc(out, func(a, b *nostr.Event) bool { return a == b })
	}
	var best [][]*nostr.Event
	bestN := -1
	consider := func(lists [][]*nostr.Event) {
		n := 0
		for _, l := range lists {
			n += len(l)
		}
		if bestN < 0 || n < bestN {
			best, bestN = lists, n
		}
	}
	for letter, values := range f.Tags {
		if values == nil {
			continue
		}
		lists := make([][]*nostr.Event, 0, len(values))
		for _, v := range values {
			lists = append(lists, s.byTag[s.tagKey(letter, v)])
		}
		consider(lists)
	}
	if len(f.Authors) > 0 {
		lists := make([][]*nostr.Event, 0, len(f.Authors))
		for _, a := range f.Authors {
			lists = append(lists, s.byAuthor[a])
		}
		consider(lists)
	}
	if bestN < 0 {
		return s.all
	}
	if bestN == 0 {
		return nil
	}
	return union(best)
}

// matches is nostr.Filter.MatchesIgnoringTimestampConstraints, with tag
// letters ignored when IgnoreTagLetter is set.
func (s *MemStore) matches(f nostr.Filter, e *nostr.Event) bool {
	if !s.IgnoreTagLetter {
		return f.MatchesIgnoringTimestampConstraints(e)
	}
	g := f
	g.Tags = nil
	if !g.MatchesIgnoringTimestampConstraints(e) {
		return false
	}
	for _, values := range f.Tags {
		if values == nil {
			continue
		}
		found := false
		for _, tag := range e.Tags {
			if len(tag) >= 2 && len(tag[0]) == 1 && slices.Contains(values, tag[1]) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}
