package syncbaseline

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/nbd-wtf/go-nostr"
	"golang.org/x/sync/errgroup"

	"github.com/grasp-sync/grasp-sync/pkg/filters"
	"github.com/grasp-sync/grasp-sync/pkg/history"
	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
	"github.com/grasp-sync/grasp-sync/pkg/store"
)

// Relay is one remote relay the baseline reads and the
// repositories (30617 addresses) that list it.
type Relay struct {
	URL   string   `json:"url"`
	Repos []string `json:"repos"`
}

// PageSize is the limit of every REQ the baseline sends (the
// strfry-like cap of the benchmark's relays).
const PageSize = 500

// Stats counts what one baseline sync did.
type Stats struct {
	// Received counts events the relays sent (every copy, from every
	// relay, duplicates included); Verified those whose signature was
	// checked (all received: the baseline checks every copy); Stored
	// those the store did not hold yet.
	Received, Verified, Stored int64
}

// Sync syncs the relays' NIP-34 history into st: per relay, one
// connection, the layer-2 filters of the repositories listing it and their
// states (30618), then the layer-3 filters of the roots (issues, patches,
// pull requests) found there, each read completely with until-pagination
// (pkg/history); every event's signature is checked and it is saved. No policy, no NATS, no persistence of
// progress, no NIP-77. The relays are read concurrently.
func Sync(ctx context.Context, st *store.Store, relays []Relay) (Stats, error) {
	var received, verified, stored atomic.Int64
	g, ctx := errgroup.WithContext(ctx)
	for _, rel := range relays {
		g.Go(func() error {
			c, err := relayconn.Dial(ctx, rel.URL, relayconn.Options{})
			if err != nil {
				return fmt.Errorf("baseline: dial %s: %w", rel.URL, err)
			}
			defer c.Close()
			var mu sync.Mutex
			var roots []string
			save := func(page []*nostr.Event) error {
				for _, e := range page {
					received.Add(1)
					verified.Add(1)
					if ok, err := e.CheckSignature(); err != nil || !ok {
						continue
					}
					ok, err := st.Save(ctx, e)
					if err != nil {
						return fmt.Errorf("baseline: save %s: %w", e.ID, err)
					}
					if ok {
						stored.Add(1)
					}
					if nip34.IsRootKind(e.Kind) {
						mu.Lock()
						roots = append(roots, e.ID)
						mu.Unlock()
					}
				}
				return nil
			}
			// Layer 2 and the repositories' states (30618 events carry no
			// "a" tag), as the pipeline's items ask (filters.Items).
			var identifiers []string
			for _, ref := range rel.Repos {
				if r, ok := nip34.ParseRepoRef(ref); ok {
					identifiers = append(identifiers, r.Identifier)
				}
			}
			for _, f := range filters.Items(rel.Repos, identifiers, nil) {
				f.Limit = PageSize
				if _, err := history.Read(ctx, c, f, 100, 100000, save); err != nil {
					return fmt.Errorf("baseline: layer 2 on %s: %w", rel.URL, err)
				}
			}
			for _, f := range filters.Layer3(slices.Compact(slices.Sorted(slices.Values(roots)))) {
				f.Limit = PageSize
				if _, err := history.Read(ctx, c, f, 100, 100000, save); err != nil {
					return fmt.Errorf("baseline: layer 3 on %s: %w", rel.URL, err)
				}
			}
			return nil
		})
	}
	err := g.Wait()
	return Stats{Received: received.Load(), Verified: verified.Load(), Stored: stored.Load()}, err
}
