// Package store is grasp-sync's event store: a small layer over an
// eventstore backend that gives every writer (the own relay for client
// events, the ingester for synced ones) the same semantics: one copy per
// event id, one version per replaceable or addressable key, and queries that
// return complete result sets for the small filters the policy uses.
package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	dgbadger "github.com/dgraph-io/badger/v4"
	"github.com/fiatjaf/eventstore"
	"github.com/fiatjaf/eventstore/badger"
	"github.com/nbd-wtf/go-nostr"
)

// DefaultQueryLimit is the most events one query returns when the filter
// sets no limit. Badger allocates O(MaxLimit) per query (see
// spec/dependencies.md), so this is set deliberately, and large reads page.
const DefaultQueryLimit = 100_000

// Store holds events. It is safe for concurrent use.
type Store struct {
	backend eventstore.Store
	url     string
}

// Open opens the store named by url: "badger://<dir>" or a plain directory
// path opens the embedded badger store (single process).
func Open(url string) (*Store, error) {
	switch {
	case url == "":
		return nil, errors.New("empty store URL")
	case strings.HasPrefix(url, "postgres://"), strings.HasPrefix(url, "postgresql://"):
		return nil, fmt.Errorf("store %s: the PostgreSQL store is not available yet; use a directory for the embedded store", redact(url))
	}
	dir := strings.TrimPrefix(url, "badger://")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("store %s: %w", dir, err)
	}
	b := &badger.BadgerBackend{
		Path:     dir,
		MaxLimit: DefaultQueryLimit,
		BadgerOptionsModifier: func(o dgbadger.Options) dgbadger.Options {
			return o.WithLogger(nil) // badger's INFO lines are not structured; errors surface as errors
		},
	}
	if err := b.Init(); err != nil {
		return nil, fmt.Errorf("open badger store %s: %w", dir, err)
	}
	return &Store{backend: b, url: url}, nil
}

func redact(url string) string {
	if i := strings.Index(url, "@"); i > 0 {
		if j := strings.Index(url, "://"); j > 0 && j < i {
			return url[:j+3] + "…" + url[i:]
		}
	}
	return url
}

// Close releases the backend.
func (s *Store) Close() { s.backend.Close() }

// Save stores an event: regular events once per id; replaceable and
// addressable events only when newer than the stored version, which they
// replace. stored is false for a duplicate or an older version.
func (s *Store) Save(ctx context.Context, evt *nostr.Event) (stored bool, err error) {
	if nostr.IsReplaceableKind(evt.Kind) || nostr.IsAddressableKind(evt.Kind) {
		before, err := s.Has(ctx, evt.ID)
		if err != nil || before {
			return false, err
		}
		if err := s.backend.ReplaceEvent(ctx, evt); err != nil {
			return false, fmt.Errorf("replace %s: %w", evt.ID, err)
		}
		// The backend silently keeps a newer version; tell the caller.
		return s.Has(ctx, evt.ID)
	}
	if err := s.backend.SaveEvent(ctx, evt); err != nil {
		if errors.Is(err, eventstore.ErrDupEvent) {
			return false, nil
		}
		return false, fmt.Errorf("save %s: %w", evt.ID, err)
	}
	return true, nil
}

// Delete removes one event.
func (s *Store) Delete(ctx context.Context, evt *nostr.Event) error {
	if err := s.backend.DeleteEvent(ctx, evt); err != nil {
		return fmt.Errorf("delete %s: %w", evt.ID, err)
	}
	return nil
}

// Query returns the events matching f, newest first.
func (s *Store) Query(ctx context.Context, f nostr.Filter) ([]*nostr.Event, error) {
	ch, err := s.backend.QueryEvents(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", f, err)
	}
	var out []*nostr.Event
	for evt := range ch {
		out = append(out, evt)
	}
	return out, ctx.Err()
}

// QueryEvents streams the events matching f (khatru's query hook shape).
func (s *Store) QueryEvents(ctx context.Context, f nostr.Filter) (chan *nostr.Event, error) {
	return s.backend.QueryEvents(ctx, f)
}

// Has reports whether an event with this id is stored.
func (s *Store) Has(ctx context.Context, id string) (bool, error) {
	evts, err := s.Query(ctx, nostr.Filter{IDs: []string{id}, Limit: 1})
	return len(evts) > 0, err
}
