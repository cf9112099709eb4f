package fetcher

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/filters"
)

// A live filter kept compact matches exactly the events the filter it was
// made from matches, and builds the same filter again (values as sets).
func TestLiveFilterIsTheFilter(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	hexID := func() string { return randomHexIDs(rng, 1)[0] }
	pool := []string{"30617:" + hexID() + ":repo", "not-hex", "ABCDEF" + hexID()[6:], hexID()[:63]}
	for range 20 {
		pool = append(pool, hexID())
	}
	pick := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = pool[rng.IntN(len(pool))]
		}
		return out
	}
	share := hexShare{} // shared across cases: lists that differ must not merge
	for i := range 500 {
		f := nostr.Filter{Kinds: []int{1, 1111}[:1+rng.IntN(2)], Tags: nostr.TagMap{}}
		switch rng.IntN(4) {
		case 0:
			f.Tags["e"] = pick(1 + rng.IntN(5))
		case 1:
			f.Tags["e"] = pick(1 + rng.IntN(5))
			f.Tags["a"] = pick(1 + rng.IntN(3))
		case 2:
			f.Tags["E"] = []string{} // constrains to nothing
		case 3:
			f.Tags["q"] = nil // does not constrain
		}
		if rng.IntN(3) == 0 {
			since := nostr.Timestamp(1000)
			f.Since = &since
		}
		evt := &nostr.Event{Kind: []int{1, 1111, 7}[rng.IntN(3)], CreatedAt: nostr.Timestamp(500 + rng.IntN(1000))}
		for range rng.IntN(4) {
			evt.Tags = append(evt.Tags, nostr.Tag{[]string{"e", "a", "E", "q"}[rng.IntN(4)], pool[rng.IntN(len(pool))]})
		}
		lf := compactFilter(f, share)
		if got, want := lf.matches(evt), f.Matches(evt); got != want {
			t.Fatalf("case %d: compact matches %v, filter %v\nfilter %v\nevent tags %v", i, got, want, f, evt.Tags)
		}
		back := lf.filter()
		for name, vs := range f.Tags {
			if vs == nil {
				if back.Tags[name] != nil {
					t.Fatalf("case %d: nil %q came back as %v", i, name, back.Tags[name])
				}
				continue
			}
			a, b := slices.Clone(vs), slices.Clone(back.Tags[name])
			slices.Sort(a)
			slices.Sort(b)
			if !slices.Equal(slices.Compact(a), slices.Compact(b)) || back.Tags[name] == nil {
				t.Fatalf("case %d: %q built again as %v, was %v", i, name, back.Tags[name], vs)
			}
		}
		if !slices.Equal(back.Kinds, f.Kinds) || back.Since != f.Since {
			t.Fatalf("case %d: built again as %v, was %v", i, back, f)
		}
	}
}

// Live filters compacted together keep an id list once however many tags
// name it: layer 3 asks for each chunk of roots under #e, #E and #q, and a
// relay's live filters name every root it serves.
func TestLiveFiltersShareEqualIDLists(t *testing.T) {
	ids := randomHexIDs(rand.New(rand.NewPCG(3, 4)), 250)
	fs := filters.Live(filters.Layer3(ids))
	lfs := compactFilters(fs, hexShare{})
	lists := map[*[32]byte]int{}
	n := 0
	for _, lf := range lfs {
		for _, tag := range lf.tags {
			lists[&tag.hexes[0]]++
			n += len(tag.hexes)
		}
	}
	if n != 3*len(ids) {
		t.Fatalf("%d ids in the compact filters, want %d (each under e, E and q)", n, 3*len(ids))
	}
	if want := (len(ids) + filters.ChunkSize - 1) / filters.ChunkSize; len(lists) != want {
		t.Errorf("%d id lists kept for %d filters, want %d (one per chunk)", len(lists), len(fs), want)
	}
	for i, lf := range lfs {
		if got := lf.filter(); !slices.Equal(got.Tags[lf.tags[0].name], sortedCopy(fs[i].Tags[lf.tags[0].name])) {
			t.Fatalf("filter %d built again differs", i)
		}
	}
}

func sortedCopy(vs []string) []string {
	out := slices.Clone(vs)
	slices.Sort(out)
	return slices.Compact(out)
}

// A batch waiting for its turn holds its history filters compact, each
// chunk of roots once however many tag letters name it (decoded, the
// planner's command named each root under #e, #E and #q), and runs the
// filters it was sent.
func TestWaitingBatchHoldsEachIDListOnce(t *testing.T) {
	ids := randomHexIDs(rand.New(rand.NewPCG(5, 6)), 250)
	hist := filters.Layer3(ids)
	since := int64(1234)
	spec := batchSpecOf(&graspv1.AddFilters{BatchId: "b1", HistoricFilters: filters.ToProtos(hist), Since: &since, Resync: true}, hist)
	if spec.id != "b1" || spec.since == nil || *spec.since != 1234 || !spec.resync || spec.layer1 {
		t.Fatalf("spec %+v", spec)
	}
	lists := map[*[32]byte]bool{}
	n := 0
	for _, lf := range spec.hist {
		for _, tag := range lf.tags {
			lists[&tag.hexes[0]] = true
			n += len(tag.hexes)
		}
	}
	if n != 3*len(ids) {
		t.Fatalf("%d ids in the waiting batch's filters, want %d (each under e, E and q)", n, 3*len(ids))
	}
	if want := (len(ids) + filters.ChunkSize - 1) / filters.ChunkSize; len(lists) != want {
		t.Errorf("%d id lists held for %d filters, want %d (one per chunk)", len(lists), len(hist), want)
	}
	back := spec.hist.filters()
	if len(back) != len(hist) {
		t.Fatalf("%d filters run, %d sent", len(back), len(hist))
	}
	for i := range hist {
		if !slices.Equal(back[i].Kinds, hist[i].Kinds) || len(back[i].Tags) != len(hist[i].Tags) {
			t.Fatalf("filter %d run as %v, sent %v", i, back[i], hist[i])
		}
		for name, vs := range hist[i].Tags {
			if !slices.Equal(back[i].Tags[name], sortedCopy(vs)) {
				t.Fatalf("filter %d: #%s run as %v, sent %v", i, name, back[i].Tags[name], vs)
			}
		}
	}
}

// A value that is not an id, a repository's coordinate, named by several
// filters decoded from different commands (under #a and #A, for several
// relays) is held once, and the filters built again and their matching are
// those of the filters they were made from.
func TestOtherValuesHeldOnce(t *testing.T) {
	coord := "30617:" + strings.Repeat("ab", 32) + ":repo"
	decoded := func() nostr.Filter { // each value a string of its own, as decoding makes them
		return nostr.Filter{Kinds: []int{1621}, Tags: nostr.TagMap{"a": {strings.Clone(coord)}, "A": {strings.Clone(coord)}}}
	}
	relays := []liveFilter{compactFilter(decoded(), nil), compactFilter(decoded(), hexShare{})}
	held := map[*byte]bool{}
	for _, lf := range relays {
		for _, tag := range lf.tags {
			for _, o := range tag.others {
				held[unsafe.StringData(o.Value())] = true
			}
		}
	}
	if len(held) != 1 {
		t.Errorf("one coordinate under #a and #A of two filters is held %d times, want once", len(held))
	}
	for _, lf := range relays {
		f := lf.filter()
		if !slices.Equal(f.Tags["a"], []string{coord}) || !slices.Equal(f.Tags["A"], []string{coord}) {
			t.Errorf("filter built again: %v", f)
		}
		if !lf.matches(&nostr.Event{Kind: 1621, Tags: nostr.Tags{{"A", coord}, {"a", coord}}}) {
			t.Error("an event naming the coordinate does not match")
		}
		if lf.matches(&nostr.Event{Kind: 1621, Tags: nostr.Tags{{"A", coord}, {"a", coord + "x"}}}) {
			t.Error("an event naming another coordinate under #a matches")
		}
	}
}

// randomHexIDs returns n ids of 64 lowercase hex digits drawn from rng.
func randomHexIDs(rng *rand.Rand, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		b := make([]byte, 32)
		for j := range b {
			b[j] = byte(rng.IntN(256))
		}
		ids[i] = fmt.Sprintf("%x", b)
	}
	return ids
}

// BenchmarkCompactFilters compacts a relay's live filters for 1,000 roots
// (layer 3: each chunk under #e, #E and #q), as the fetcher does for each
// live command.
func BenchmarkCompactFilters(b *testing.B) {
	fs := filters.Live(filters.Layer3(randomHexIDs(rand.New(rand.NewPCG(5, 6)), 1000)))
	b.ReportAllocs()
	for b.Loop() {
		compactFilters(fs, hexShare{})
	}
}
