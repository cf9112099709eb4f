package fetcher_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/negsync"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/services/fetcher"
)

// TestUnionLocalSetHeld: the ids the union holds (what dropHeld asks after
// a reconciliation) are exactly those its items by id list: the store's,
// answered from its id keys, and the refusals', which count as held as
// they do in the local set's items, so a refused event is not fetched
// again.
func TestUnionLocalSetHeld(t *testing.T) {
	evts := notes(testkit.NewKey(), 60, 2, 1000)
	stored, refused, unknown := evts[:30], evts[30:40], evts[40:]
	// The refusals: an in-memory set answering Items as pkg/rejected's
	// cache does (every remembered event that matches the filter).
	refusals := fetcher.LocalSetFunc(func(_ context.Context, f nostr.Filter) ([]negsync.Item, error) {
		var out []negsync.Item
		for _, e := range refused {
			if f.Matches(e) {
				out = append(out, negsync.Item{ID: e.ID, CreatedAt: e.CreatedAt})
			}
		}
		return out, nil
	})
	union := append(localStore(t, stored).(fetcher.UnionLocalSet), refusals)
	ids := func(evts []*nostr.Event) []string {
		var out []string
		for _, e := range evts {
			out = append(out, e.ID)
		}
		return out
	}
	for _, c := range []struct {
		name string
		ask  []string
	}{
		{"stored", ids(stored)},
		{"refused", ids(refused)},
		{"unknown", ids(unknown)},
		{"all, repeated", append(ids(evts), ids(evts[:5])...)},
		{"malformed and uppercase", []string{"x", strings.ToUpper(stored[0].ID), fmt.Sprintf("%064x", 3)}},
		{"none", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			held, err := union.Held(ctx, c.ask)
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			if len(c.ask) > 0 {
				items, err := union.Items(ctx, nostr.Filter{IDs: c.ask})
				if err != nil {
					t.Fatal(err)
				}
				for _, it := range items {
					want = append(want, it.ID)
				}
			}
			slices.Sort(held)
			slices.Sort(want)
			if !slices.Equal(slices.Compact(held), slices.Compact(want)) {
				t.Fatalf("Held = %d ids, items by id %d", len(held), len(want))
			}
		})
	}
}
