package policy

import (
	"context"
	"errors"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
)

// Lookup is the policy's read-only view of the event store (implemented by
// pkg/store). Query returns the stored events matching the filter. The policy
// always sets Limit and keeps its filters small, so a store must return the
// complete result for them.
type Lookup interface {
	Query(ctx context.Context, f nostr.Filter) ([]*nostr.Event, error)
}

// KindLookup is an optional part of a Lookup: which of some ids are stored
// events, and of which kinds. Rule 5's lookup of the events an event
// references needs nothing more, and a store (or a cache in front of one)
// may answer it without loading and decoding the events. When the Lookup
// implements it, the policy asks it instead of Query; both must agree.
type KindLookup interface {
	// StoredKinds returns, for each of ids in order, the kind of the
	// stored event with that id, or -1 when none is stored.
	StoredKinds(ctx context.Context, ids []string) ([]int, error)
}

// query reads the store, dropping nil results so callers need not check.
func (p *Policy) query(ctx context.Context, f nostr.Filter) ([]*nostr.Event, error) {
	if p.Store == nil {
		return nil, errors.New("no store configured")
	}
	evts, err := p.Store.Query(ctx, f)
	if err != nil {
		return nil, err
	}
	out := evts[:0:0]
	for _, e := range evts {
		if e != nil {
			out = append(out, e)
		}
	}
	return out, nil
}

// versions returns the stored events with coordinate c.
func (p *Policy) versions(ctx context.Context, c nip34.Coordinate) ([]*nostr.Event, error) {
	f := nostr.Filter{Kinds: []int{c.Kind}, Authors: []string{c.PubKey}, Limit: maxVersions}
	if nostr.IsAddressableKind(c.Kind) && c.D != "" {
		// Stores do not index empty tag values, so "d":"" cannot be
		// queried; those are matched below instead.
		f.Tags = nostr.TagMap{"d": {c.D}}
	}
	evts, err := p.query(ctx, f)
	if err != nil {
		return nil, err
	}
	out := evts[:0]
	for _, e := range evts {
		if c.Matches(e) {
			out = append(out, e)
		}
	}
	return out, nil
}
