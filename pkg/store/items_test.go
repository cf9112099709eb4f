package store_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/filters"
	"github.com/grasp-sync/grasp-sync/pkg/store"
)

// itemsLayout is one kv directory layout the item lister must read: the
// engines with format v3, a v2 directory, and a v2 directory upgraded to v3
// with events written both ways.
type itemsLayout struct {
	name string
	// build stores evts in a fresh directory and returns it open.
	build func(t *testing.T, evts []*nostr.Event) *store.Store
}

func itemsLayouts() []itemsLayout {
	save := func(t *testing.T, s *store.Store, evts []*nostr.Event) {
		t.Helper()
		for _, e := range evts {
			if _, err := s.Save(context.Background(), e); err != nil {
				t.Fatal(err)
			}
		}
	}
	open := func(t *testing.T, url string, opts ...store.Option) *store.Store {
		t.Helper()
		s, err := store.Open(url, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	fresh := func(scheme string, opts ...store.Option) func(t *testing.T, evts []*nostr.Event) *store.Store {
		return func(t *testing.T, evts []*nostr.Event) *store.Store {
			s := open(t, scheme+"://"+t.TempDir(), opts...)
			save(t, s, evts)
			return s
		}
	}
	// upgraded stores half the events as the code before did (before),
	// then reopens the directory and stores the rest.
	upgraded := func(scheme string, before store.Option) func(t *testing.T, evts []*nostr.Event) *store.Store {
		return func(t *testing.T, evts []*nostr.Event) *store.Store {
			dir := t.TempDir()
			s := open(t, scheme+"://"+dir, before)
			save(t, s, evts[:len(evts)/2])
			s.Close()
			s = open(t, scheme+"://"+dir)
			save(t, s, evts[len(evts)/2:])
			return s
		}
	}
	return []itemsLayout{
		{"kv+pebble", fresh("kv+pebble")},
		{"kv+badger", fresh("kv+badger")},
		{"kv+pebble v2", fresh("kv+pebble", store.WithKVTagsV2())},
		{"kv+pebble v2 upgraded", upgraded("kv+pebble", store.WithKVTagsV2())},
		{"kv+pebble without item keys", fresh("kv+pebble", store.WithKVNoItemKeys())},
		// Half the events stored by the code before item keys, half after:
		// a local set reads item keys where there are some, events where not.
		{"kv+pebble item keys added", upgraded("kv+pebble", store.WithKVNoItemKeys())},
		{"kv+badger item keys added", upgraded("kv+badger", store.WithKVNoItemKeys())},
	}
}

// itemsWorld is the e2e world in small: the benchmark corpus (repositories,
// issues and patches with a tags, comments with E/e, A, K/k, statuses) plus
// events whose tags test what the JSON reader must get right: one case of
// a letter only, escaped strings, short and long tags, a second full of
// events.
func itemsWorld(t *testing.T) (*corpus, []*nostr.Event) {
	t.Helper()
	c := newCorpus(30)
	var evts []*nostr.Event
	for range 3000 {
		evts = append(evts, c.next())
	}
	sk := nostr.GeneratePrivateKey()
	root, coord := c.roots[0], c.coord(0)
	odd := []nostr.Tags{
		{{"E", root}},                     // uppercase only
		{{"e", root}, {"E", c.roots[1]}},  // cases name different events
		{{"A", coord}, {"k", "1621"}},     // uppercase A, lowercase k
		{{"a", coord, "wss://r.example"}}, // a longer tag
		{{"e"}, {"a"}, {}},                // tags without a value
		{{"a", `quote " and \ back`}, {"t", "caf\u00e9 \u2603"}, {"q", root}},
		{{"subject", "an issue"}, {"e", root, "", "root"}},
		{{"Q", root}, {"q", coord}},
	}
	for n, tags := range odd {
		e := &nostr.Event{Kind: 1111, CreatedAt: c.ts, Tags: tags, Content: "odd \"event\"\n\t\\ " + strconv.Itoa(n)}
		if n%2 == 1 {
			e.Kind = 1630
		}
		if err := e.Sign(sk); err != nil {
			t.Fatal(err)
		}
		evts = append(evts, e) // all at c.ts: one crowded second
	}
	return c, evts
}

// itemsFilters are the filters the fetcher builds (pkg/filters: every layer,
// with and without since), the ids of a dropHeld call, and the edges:
// tag cases, since and until at an event's second, an empty range, several
// tag conditions, a tag name that is not a letter.
func itemsFilters(c *corpus, evts []*nostr.Event) []nostr.Filter {
	var coords, idents []string
	for r := range c.repos {
		coords = append(coords, c.coord(r))
		idents = append(idents, "repo-"+strconv.Itoa(r))
	}
	var fs []nostr.Filter
	fs = append(fs, filters.Layer1(idents)...)
	fs = append(fs, filters.Items(coords, idents, c.roots)...)
	fs = append(fs, filters.Maintained(c.owners, idents)...)
	mid := evts[len(evts)/2].CreatedAt
	fs = append(fs, filters.Since(fs, mid)...)
	last := evts[len(evts)-1].CreatedAt
	root, coord := c.roots[0], c.coord(0)
	ts := func(t nostr.Timestamp) *nostr.Timestamp { return &t }
	fs = append(fs,
		nostr.Filter{},
		nostr.Filter{Kinds: []int{1111}},
		nostr.Filter{Kinds: []int{1111, 1630}, Since: ts(mid), Until: ts(mid)},
		nostr.Filter{Since: ts(last)},
		nostr.Filter{Until: ts(mid)},
		nostr.Filter{Since: ts(mid + 1), Until: ts(mid)},
		nostr.Filter{Until: ts(evts[0].CreatedAt - 1)},
		nostr.Filter{Authors: []string{c.owners[0], c.owners[1]}},
		nostr.Filter{Authors: []string{"not hex"}},
		nostr.Filter{Tags: nostr.TagMap{"e": {root}}},
		nostr.Filter{Tags: nostr.TagMap{"E": {root}}},
		nostr.Filter{Tags: nostr.TagMap{"E": {root}}, Since: ts(last), Until: ts(last)},
		nostr.Filter{Tags: nostr.TagMap{"a": {coord}}},
		nostr.Filter{Tags: nostr.TagMap{"A": {coord}}},
		nostr.Filter{Tags: nostr.TagMap{"k": {"1621"}}},
		nostr.Filter{Tags: nostr.TagMap{"K": {"1621"}}},
		nostr.Filter{Tags: nostr.TagMap{"q": {root, coord}}},
		nostr.Filter{Tags: nostr.TagMap{"Q": {root}}},
		nostr.Filter{Tags: nostr.TagMap{"e": {root}, "k": {"1621"}}},
		nostr.Filter{Tags: nostr.TagMap{"E": {root}, "A": {coord}}, Kinds: []int{1111}},
		nostr.Filter{Tags: nostr.TagMap{"e": {root}, "subject": {"an issue"}}},
		nostr.Filter{Tags: nostr.TagMap{"a": {`quote " and \ back`}}},
		nostr.Filter{Tags: nostr.TagMap{"t": {"caf\u00e9 \u2603"}}},
		nostr.Filter{Tags: nostr.TagMap{"a": {coord}}, Authors: []string{c.owners[0]}},
	)
	// By id, as dropHeld asks: a chunk of 500 (held, unknown, uppercase),
	// more than one query's worth, with since.
	var all []string
	for _, e := range evts {
		all = append(all, e.ID)
	}
	upper := ""
	for _, e := range evts[500:] {
		if e.Kind == 1111 {
			upper = strings.ToUpper(e.ID) // stored, but not under this spelling
			break
		}
	}
	chunk := append(slices.Clone(all[:480]), fmt.Sprintf("%064x", 5), "short", upper)
	fs = append(fs,
		nostr.Filter{IDs: chunk},
		nostr.Filter{IDs: all[:1200]},
		nostr.Filter{IDs: all, Since: ts(mid)},
		nostr.Filter{IDs: all[:10], Kinds: []int{1111}},
		nostr.Filter{IDs: []string{}},
	)
	return fs
}

// TestItemsWithoutDecoding: the kv item lister, which reads only the
// fields a filter checks, lists exactly what the paged scan through Query
// listed (every event decoded), in the same order, for every filter the
// fetcher's local set asks, on every kv layout; and Held names exactly the
// ids such a listing by id holds.
func TestItemsWithoutDecoding(t *testing.T) {
	ctx := context.Background()
	for _, l := range itemsLayouts() {
		t.Run(l.name, func(t *testing.T) {
			c, evts := itemsWorld(t)
			s := l.build(t, evts)
			// Deleted events must not be listed by either path.
			for _, e := range evts[100:110] {
				if err := s.Delete(ctx, e); err != nil {
					t.Fatal(err)
				}
			}
			for n, f := range itemsFilters(c, evts) {
				want, err := store.ItemsByScan(ctx, s, f)
				if err != nil {
					t.Fatalf("filter %d %s: scan: %v", n, f, err)
				}
				got, err := s.Items(ctx, f)
				if err != nil {
					t.Fatalf("filter %d %s: %v", n, f, err)
				}
				if !slices.Equal(got, want) {
					t.Errorf("filter %d %s: %d items, the scan %d (or another order)", n, f, len(got), len(want))
				}
				var matching int
				for _, e := range evts {
					if f.Matches(e) {
						matching++
					}
				}
				if f.IDs == nil && len(want) > matching {
					t.Errorf("filter %d %s: %d items, %d events match", n, f, len(want), matching)
				}
				if f.IDs == nil || f.Since != nil || f.Kinds != nil {
					continue
				}
				held, err := s.Held(ctx, f.IDs)
				if err != nil {
					t.Fatal(err)
				}
				var wantIDs []string
				for _, it := range want {
					wantIDs = append(wantIDs, it.ID)
				}
				if slices.Sort(held); !slices.Equal(held, slices.Sorted(slices.Values(wantIDs))) {
					t.Errorf("filter %d: Held = %d ids, the listing by id %d", n, len(held), len(wantIDs))
				}
			}
			// A tag condition without values is an error either way.
			bad := nostr.Filter{Tags: nostr.TagMap{"e": {}}}
			if _, err := s.Items(ctx, bad); err == nil {
				t.Error("Items with an empty tag list: no error")
			}
			if _, err := store.ItemsByScan(ctx, s, bad); err == nil {
				t.Error("the scan with an empty tag list: no error")
			}
		})
	}
}
