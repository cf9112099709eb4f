package fetcher

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"unique"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
)

// liveFilter is a live subscription's filter as the fetcher keeps it for as
// long as the subscription lives: tag values that are event ids or keys
// (64 lowercase hex digits) as 32 bytes, sorted, instead of the command's
// decoded strings (80 bytes each plus the slices naming them). A relay's
// live filters name every root of every repository it serves, so at the
// design's scale this is most of the fetcher's state (docs/decisions/0041-live-filters-compact.md). The REQ is built from it again when the
// subscription is (re)opened. A batch waiting for its turn keeps its
// history filters the same way (batchSpecOf).
type liveFilter struct {
	// base is the filter without its tags.
	base nostr.Filter
	tags []liveTag
}

// liveTag is one tag condition: an event matches when it has a tag named
// name whose value is one of hexes or others.
type liveTag struct {
	name  string
	hexes [][32]byte // sorted
	// others are the values that are not ids or keys (#a coordinates, #d
	// names), each kept once for the whole fetcher: a repository's
	// coordinate is named under #a and #A, by its live filters and its
	// waiting batches, on every relay that lists it, and the decoded
	// command's own strings kept a copy each time (16 MB of the upper
	// world's heap at rest; docs/measurements/2026-12-06-issue32-local-set-reads.md).
	// unique drops a value once no filter holds it.
	others []unique.Handle[string]
}

// hexShare holds the sorted id lists of the live filters compacted
// together, by their SHA-256, so equal lists are kept once: the planner's
// layer-3 filters ask for the same chunk of root ids under #e, #E and #q
// (pkg/filters.Layer3), which kept every live root three times
// (docs/measurements/2026-12-04-design-scale-memory.md). The lists
// are never modified once made, so sharing them is safe.
type hexShare map[[sha256.Size]byte][][32]byte

// intern returns a list equal to h made before, or h.
func (s hexShare) intern(h [][32]byte) [][32]byte {
	if s == nil || len(h) == 0 {
		return h
	}
	d := sha256.New()
	for i := range h {
		d.Write(h[i][:])
	}
	var key [sha256.Size]byte
	d.Sum(key[:0])
	if prev, ok := s[key]; ok && slices.Equal(prev, h) {
		return prev
	}
	s[key] = h
	return h
}

// compactFilter keeps f as a liveFilter; equal id lists are shared
// through share (nil: none).
func compactFilter(f nostr.Filter, share hexShare) liveFilter {
	lf := liveFilter{base: f, tags: make([]liveTag, 0, len(f.Tags))}
	lf.base.Tags = nil
	names := make([]string, 0, len(f.Tags))
	for name, vs := range f.Tags {
		if vs != nil { // a nil list does not constrain (nostr.Filter.Matches)
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		// Sized for the values as long as an id: the group keeps these for
		// its whole life, so no growth slack (append's doubling would keep
		// up to twice the size). Counting by length, not by decoding, reads
		// each value once: at 1,000 relays compacting filters was ~4 % of
		// graspd's CPU, most of it checking every id twice.
		nhex := 0
		for _, v := range f.Tags[name] {
			if len(v) == 64 {
				nhex++
			}
		}
		t := liveTag{name: name, hexes: make([][32]byte, 0, nhex)}
		if n := len(f.Tags[name]) - nhex; n > 0 {
			t.others = make([]unique.Handle[string], 0, n)
		}
		for _, v := range f.Tags[name] {
			if b, ok := nip34.DecodeID(v); ok {
				t.hexes = append(t.hexes, b)
			} else {
				t.others = append(t.others, unique.Make(v))
			}
		}
		slices.SortFunc(t.hexes, func(a, b [32]byte) int { return bytes.Compare(a[:], b[:]) })
		t.hexes = share.intern(slices.Compact(t.hexes))
		lf.tags = append(lf.tags, t)
	}
	return lf
}

// filter builds the nostr filter again (for a REQ).
func (lf liveFilter) filter() nostr.Filter {
	f := lf.base
	if len(lf.tags) > 0 {
		f.Tags = make(nostr.TagMap, len(lf.tags))
		for _, t := range lf.tags {
			vs := make([]string, 0, len(t.hexes)+len(t.others))
			for _, h := range t.hexes {
				vs = append(vs, hex.EncodeToString(h[:]))
			}
			for _, o := range t.others {
				vs = append(vs, o.Value())
			}
			f.Tags[t.name] = vs
		}
	}
	return f
}

// matches is nostr.Filter.Matches of the filter this was made from.
func (lf liveFilter) matches(evt *nostr.Event) bool {
	if !lf.base.Matches(evt) {
		return false
	}
	for _, t := range lf.tags {
		if !t.matches(evt.Tags) {
			return false
		}
	}
	return true
}

func (t liveTag) matches(tags nostr.Tags) bool {
	for _, tag := range tags {
		if len(tag) < 2 || tag[0] != t.name {
			continue
		}
		if b, ok := nip34.DecodeID(tag[1]); ok {
			if _, found := slices.BinarySearchFunc(t.hexes, b, func(a, b [32]byte) int { return bytes.Compare(a[:], b[:]) }); found {
				return true
			}
			continue
		}
		for _, o := range t.others {
			if o.Value() == tag[1] {
				return true
			}
		}
	}
	return false
}

// liveFilters is a live group's filters.
type liveFilters []liveFilter

func compactFilters(fs []nostr.Filter, share hexShare) liveFilters {
	out := make(liveFilters, len(fs))
	for i, f := range fs {
		out[i] = compactFilter(f, share)
	}
	return out
}

// filters builds the REQ's filters again.
func (lfs liveFilters) filters() nostr.Filters {
	out := make(nostr.Filters, len(lfs))
	for i, lf := range lfs {
		out[i] = lf.filter()
	}
	return out
}

// matches reports whether evt matches any of the filters.
func (lfs liveFilters) matches(evt *nostr.Event) bool {
	for _, lf := range lfs {
		if lf.matches(evt) {
			return true
		}
	}
	return false
}
