package fetcher

import (
	"context"
	"fmt"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/negsync"
	"github.com/grasp-sync/grasp-sync/pkg/store"
)

// LocalSet is what this service already holds for a filter: the local side
// of a NIP-77 reconciliation. It must be complete for the filter (not capped
// by a store query limit), or ids beyond the cap are fetched again.
type LocalSet interface {
	Items(ctx context.Context, f nostr.Filter) ([]negsync.Item, error)
}

// LocalSetFunc adapts a function to LocalSet (for example the event store's
// Items method, whose item type converts field by field).
type LocalSetFunc func(ctx context.Context, f nostr.Filter) ([]negsync.Item, error)

// Items calls fn.
func (fn LocalSetFunc) Items(ctx context.Context, f nostr.Filter) ([]negsync.Item, error) {
	return fn(ctx, f)
}

// EventQuerier is what QueryLocalSet needs of an event store.
type EventQuerier interface {
	Query(ctx context.Context, f nostr.Filter) ([]*nostr.Event, error)
}

// QueryLocalSet builds the local set from an event store's Query. It is the
// stopgap until the store offers a complete id listing: Query is capped by
// the store's query limit (pkg/store: 100,000), beyond which ids are
// fetched again (harmless: publishing dedups by id), never missed.
type QueryLocalSet struct{ Store EventQuerier }

// Items lists the ids and timestamps of the stored events matching f.
func (q QueryLocalSet) Items(ctx context.Context, f nostr.Filter) ([]negsync.Item, error) {
	f.Limit, f.LimitZero = 0, false
	evts, err := q.Store.Query(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("local set for %s: %w", f, err)
	}
	out := make([]negsync.Item, len(evts))
	for i, e := range evts {
		out[i] = negsync.Item{ID: e.ID, CreatedAt: e.CreatedAt}
	}
	return out, nil
}

// HeldChecker is a LocalSet that can tell which of some ids it holds more
// cheaply than listing their items (the event store: an id key lookup, no
// event read). Held answers what Items(Filter{IDs: ids}) would list, as
// ids, each once, in any order.
type HeldChecker interface {
	Held(ctx context.Context, ids []string) ([]string, error)
}

// heldIn returns those of ids that ls holds: through Held where ls offers
// it, else its items for a filter of the ids.
func heldIn(ctx context.Context, ls LocalSet, ids []string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil // a filter without ids would match everything
	}
	if hc, ok := ls.(HeldChecker); ok {
		return hc.Held(ctx, ids)
	}
	items, err := ls.Items(ctx, nostr.Filter{IDs: ids})
	if err != nil {
		return nil, err
	}
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.ID
	}
	return out, nil
}

// UnionLocalSet is the union of several sets: the store's ids and the ids
// the policy has already rejected, so rejected events are not fetched again.
type UnionLocalSet []LocalSet

// Held returns the ids any of the sets holds (a refused id counts as held,
// as in Items), asking each set the cheapest way it offers.
func (u UnionLocalSet) Held(ctx context.Context, ids []string) ([]string, error) {
	var out []string
	for _, s := range u {
		if s == nil {
			continue
		}
		held, err := heldIn(ctx, s, ids)
		if err != nil {
			return nil, err
		}
		out = append(out, held...)
	}
	return out, nil
}

// Items concatenates the sets (negsync deduplicates).
func (u UnionLocalSet) Items(ctx context.Context, f nostr.Filter) ([]negsync.Item, error) {
	var out []negsync.Item
	for _, s := range u {
		if s == nil {
			continue
		}
		items, err := s.Items(ctx, f)
		if err != nil {
			return nil, err
		}
		out = append(out, items...)
	}
	return out, nil
}

// StoreLocalSet is the local set of an event store that lists ids
// completely (pkg/store's Items: not capped by the query limit).
type StoreLocalSet struct {
	Store interface {
		Items(ctx context.Context, f nostr.Filter) ([]store.Item, error)
	}
}

// Held returns those of ids the store holds: without reading the events
// when the store offers Held (pkg/store), else through Items.
func (s StoreLocalSet) Held(ctx context.Context, ids []string) ([]string, error) {
	hc, ok := s.Store.(HeldChecker)
	if !ok {
		return heldIn(ctx, LocalSetFunc(s.Items), ids)
	}
	return hc.Held(ctx, ids)
}

// Items lists the store's ids and timestamps for f.
func (s StoreLocalSet) Items(ctx context.Context, f nostr.Filter) ([]negsync.Item, error) {
	items, err := s.Store.Items(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("local set for %s: %w", f, err)
	}
	out := make([]negsync.Item, len(items))
	for i, it := range items {
		out[i] = negsync.Item{ID: it.ID, CreatedAt: it.CreatedAt}
	}
	return out, nil
}
