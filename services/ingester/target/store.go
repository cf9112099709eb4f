package target

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/store"
)

// Mirror is the local store bolt-on mode keeps as its record of what is on
// the target: what the ingester needs of a store (*store.Store implements
// it).
type Mirror interface {
	Query(ctx context.Context, f nostr.Filter) ([]*nostr.Event, error)
	Save(ctx context.Context, evt *nostr.Event) (stored bool, err error)
	SaveBatch(ctx context.Context, evts []*nostr.Event) []store.SaveResult
	Delete(ctx context.Context, evt *nostr.Event) error
	Held(ctx context.Context, ids []string) ([]string, error)
}

// Store is the ingester's store in bolt-on mode: reads go to the mirror;
// a write publishes the event to the target and, once the target answered
// OK or "duplicate:", saves it in the mirror. A refusal is a *RefusedError
// (errors.Is store.ErrUnstorable); an error wrapping ErrUnavailable means
// the target could not be asked now. Deletions (NIP-09) are applied to the
// mirror only: the target applies the kind-5 event it was sent itself.
type Store struct {
	Mirror
	Pub *Publisher
}

// Save publishes evt, then mirrors it. stored is the mirror's answer:
// false when the mirror held it already (a duplicate to the ingester).
func (s *Store) Save(ctx context.Context, evt *nostr.Event) (bool, error) {
	if _, err := s.Pub.Publish(ctx, evt); err != nil {
		return false, err
	}
	stored, err := s.Mirror.Save(ctx, evt)
	if err != nil {
		return false, fmt.Errorf("mirror %s after the target took it: %w", evt.ID, err)
	}
	return stored, nil
}

// SaveBatch publishes the events concurrently, bounded by the publisher's
// concurrency and rate, then mirrors those the target took with one write,
// in order. An event that references an earlier event of the batch (its id
// in an e, E or q tag, its coordinate in an a, A or q tag) is sent only
// once that one has its answer: a relay handles the EVENTs of a connection
// concurrently, and one whose policy admits no forward reference would
// refuse a comment that overtook its root. (Our own policy already defers
// most such events to a later write; not those it accepts on another tag.)
func (s *Store) SaveBatch(ctx context.Context, evts []*nostr.Event) []store.SaveResult {
	out := make([]store.SaveResult, len(evts))
	took := make([]bool, len(evts))
	answered := make([]chan struct{}, len(evts))
	for n := range evts {
		answered[n] = make(chan struct{})
	}
	deps := dependencies(evts)
	var wg sync.WaitGroup
	for n, e := range evts {
		wg.Go(func() {
			defer close(answered[n])
			for _, d := range deps[n] {
				select {
				case <-answered[d]:
				case <-ctx.Done():
					out[n].Err = ctx.Err()
					return
				}
				if !took[d] && errors.Is(out[d].Err, ErrUnavailable) {
					// Sent now it would overtake what it references:
					// held with it.
					out[n].Err = fmt.Errorf("%w: waits for %s, which the target has not taken yet", ErrUnavailable, evts[d].ID)
					return
				}
			}
			if _, err := s.Pub.Publish(ctx, e); err != nil {
				out[n].Err = err
				return
			}
			took[n] = true
		})
	}
	wg.Wait()
	var mirror []*nostr.Event
	var at []int
	for n, ok := range took {
		if ok {
			mirror = append(mirror, evts[n])
			at = append(at, n)
		}
	}
	if len(mirror) == 0 {
		return out
	}
	for k, r := range s.Mirror.SaveBatch(ctx, mirror) {
		if r.Err != nil && !errors.Is(r.Err, store.ErrUnstorable) {
			r.Err = fmt.Errorf("mirror %s after the target took it: %w", mirror[k].ID, r.Err)
		}
		out[at[k]] = r
	}
	return out
}

// dependencies lists, for each event, the earlier events of evts it
// references by id or coordinate.
func dependencies(evts []*nostr.Event) [][]int {
	byRef := make(map[string]int, 2*len(evts))
	deps := make([][]int, len(evts))
	for n, e := range evts {
		for _, t := range e.Tags {
			if len(t) < 2 {
				continue
			}
			switch t[0] {
			case "e", "E", "a", "A", "q":
				if d, ok := byRef[t[1]]; ok && !slices.Contains(deps[n], d) {
					deps[n] = append(deps[n], d)
				}
			}
		}
		byRef[e.ID] = n
		if nostr.IsAddressableKind(e.Kind) || nostr.IsReplaceableKind(e.Kind) {
			byRef[fmt.Sprintf("%d:%s:%s", e.Kind, e.PubKey, e.Tags.GetD())] = n
		}
	}
	return deps
}

// Reachable reports why a write now would not be tried (nil: it would):
// see Publisher.Reachable.
func (s *Store) Reachable(ctx context.Context) error { return s.Pub.Reachable(ctx) }

// SetBacklog forwards the ingester's consumer lag to the publisher.
func (s *Store) SetBacklog(n int64) { s.Pub.SetBacklog(n) }
