package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/nbd-wtf/go-nostr"
)

// TestQueryMatchesBruteForce runs random filters (ids, authors, kinds, tags
// with several values, since/until, limits) against every exact backend and
// against a plain scan of the saved events: the results must be the same
// events in the same order. Timestamps are distinct, so newest-first is one
// order.
func TestQueryMatchesBruteForce(t *testing.T) {
	keys := make([]string, 4)
	pubs := make([]string, len(keys))
	for i := range keys {
		keys[i] = nostr.GeneratePrivateKey()
		pubs[i], _ = nostr.GetPublicKey(keys[i])
	}
	rng := rand.New(rand.NewPCG(7, 11))
	kinds := []int{1, 7, 1621, 1111}
	values := []string{"x", "y", "", "a-value-much-longer-than-a-hundred-bytes-" + fmt.Sprint(make([]byte, 40)), "30617:abc:repo"}
	for n := range 15 {
		values = append(values, fmt.Sprint("v", n))
	}
	var evts []*nostr.Event
	for n := range 300 {
		var tags nostr.Tags
		for range rng.IntN(4) {
			letter := string("eapE"[rng.IntN(4)])
			tags = append(tags, nostr.Tag{letter, values[rng.IntN(len(values))]})
		}
		if rng.IntN(5) == 0 {
			tags = append(tags, nostr.Tag{"long", "x"}) // not a single letter: not indexed
		}
		i := rng.IntN(len(keys))
		evts = append(evts, signed(t, keys[i], kinds[rng.IntN(len(kinds))], nostr.Timestamp(1000+n*3), tags, fmt.Sprint("event ", n)))
	}
	filters := make([]nostr.Filter, 0, 200)
	for range 200 {
		var f nostr.Filter
		if rng.IntN(6) == 0 {
			for range 1 + rng.IntN(5) {
				f.IDs = append(f.IDs, evts[rng.IntN(len(evts))].ID)
			}
		}
		if rng.IntN(3) == 0 {
			f.Authors = append(f.Authors, pubs[rng.IntN(len(pubs))])
			if rng.IntN(2) == 0 {
				f.Authors = append(f.Authors, pubs[rng.IntN(len(pubs))])
			}
		}
		if rng.IntN(2) == 0 {
			f.Kinds = append(f.Kinds, kinds[rng.IntN(len(kinds))])
			if rng.IntN(2) == 0 {
				f.Kinds = append(f.Kinds, kinds[rng.IntN(len(kinds))])
			}
		}
		if rng.IntN(2) == 0 {
			f.Tags = nostr.TagMap{}
			if rng.IntN(3) == 0 {
				// Many values of one letter: one iterator reads them in turn.
				letter := string("eapE"[rng.IntN(4)])
				for range 8 + rng.IntN(8) {
					f.Tags[letter] = append(f.Tags[letter], values[rng.IntN(len(values))])
				}
			}
			for range 1 + rng.IntN(2) {
				letter := string("eapE"[rng.IntN(4)])
				f.Tags[letter] = append(f.Tags[letter], values[rng.IntN(len(values))])
			}
		}
		if rng.IntN(3) == 0 {
			s := nostr.Timestamp(1000 + rng.IntN(900))
			f.Since = &s
		}
		if rng.IntN(3) == 0 {
			u := nostr.Timestamp(1000 + rng.IntN(900))
			f.Until = &u
		}
		f.Limit = []int{0, 1, 5, 50}[rng.IntN(4)]
		filters = append(filters, f)
	}
	want := func(f nostr.Filter) []string {
		var out []string
		for _, e := range slices.Backward(evts) {
			if f.Matches(e) && !slices.Contains(out, e.ID) {
				out = append(out, e.ID)
			}
		}
		if f.Limit > 0 && len(out) > f.Limit {
			out = out[:f.Limit]
		}
		return out
	}
	for _, bc := range allBackends() {
		t.Run(bc.name, func(t *testing.T) {
			if !bc.exact {
				t.Skipf("SKIP: %s answers tag filters inexactly (see backendCase.exact)", bc.name)
			}
			s := bc.open(t)
			for _, r := range s.SaveBatch(context.Background(), evts) {
				if r.Err != nil {
					t.Fatal(r.Err)
				}
			}
			for _, f := range filters {
				got, err := s.Query(context.Background(), f)
				if err != nil {
					t.Fatalf("%s: %v", f, err)
				}
				if g, w := ids(got), want(f); !slices.Equal(g, w) {
					t.Errorf("%s:\n got %d %v\nwant %d %v", f, len(g), g, len(w), w)
				}
			}
		})
	}
}
