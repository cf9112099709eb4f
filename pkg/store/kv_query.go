package store

import (
	"bytes"
	"container/heap"
	"context"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/nbd-wtf/go-nostr"
)

// kvLookup finds the stored event with this id: nil if there is none.
func kvLookup(r kvReader, id []byte) (uint64, *nostr.Event, error) {
	serial, found, err := kvSerial(r, id)
	if err != nil || !found {
		return 0, nil, err
	}
	evt, err := kvLoad(r, serial)
	return serial, evt, err
}

// kvSerial reads the serial an id is stored under.
func kvSerial(r kvReader, id []byte) (serial uint64, found bool, err error) {
	found, err = r.get(kvIDKey(id), func(v []byte) error {
		if len(v) != 8 {
			return fmt.Errorf("id %x: serial of %d bytes", id, len(v))
		}
		serial = binary.BigEndian.Uint64(v)
		return nil
	})
	return serial, found, err
}

// kvLoad reads the event stored under serial: nil if there is none.
func kvLoad(r kvReader, serial uint64) (*nostr.Event, error) {
	evt := new(nostr.Event)
	found, err := r.get(kvRawKey(serial), evt.UnmarshalJSON)
	if err != nil {
		return nil, fmt.Errorf("load event %d: %w", serial, err)
	}
	if !found {
		return nil, nil
	}
	return evt, nil
}

// query returns up to f.Limit events matching f, newest first (ties: the
// later write first).
func (k *kv) query(ctx context.Context, f nostr.Filter) ([]*nostr.Event, error) {
	done, err := k.enter()
	if err != nil {
		return nil, err
	}
	defer done()
	var out []*nostr.Event
	err = k.eng.view(func(r kvReader) error {
		if f.IDs != nil {
			out, err = kvByIDs(r, f, k.ids.load())
		} else {
			out, err = kvScan(ctx, r, f, k.kinds.all(), k.layout())
		}
		return err
	})
	return out, err
}

// kvByIDs looks the ids up, skipping those the id filter has never seen.
func kvByIDs(r kvReader, f nostr.Filter, ids *idFilter) ([]*nostr.Event, error) {
	var out []*nostr.Event
	for _, s := range slices.Compact(slices.Sorted(slices.Values(f.IDs))) {
		id, ok := decode32(s)
		if !ok || !ids.mayHave(id) {
			continue
		}
		_, evt, err := kvLookup(r, id)
		if err != nil {
			return nil, err
		}
		if evt != nil && f.Matches(evt) {
			out = append(out, evt)
		}
	}
	slices.SortStableFunc(out, func(a, b *nostr.Event) int { return int(b.CreatedAt - a.CreatedAt) })
	if len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out, nil
}

// kvLayout says how a directory's tag keys are written: v2 (format v2's,
// tests only), or v3 with, if legacy, v2's keys from before (see kv).
type kvLayout struct {
	v2, legacy bool
	// tags, when set, has every stored tag prefix: the others are not
	// read.
	tags *idFilter
}

// layout is how k's keys are laid out for a query now.
func (k *kv) layout() kvLayout {
	return kvLayout{v2: k.tagsV2, legacy: k.legacyTags, tags: k.tags.load()}
}

// kvPrefix is one index prefix a query reads, and for a v3 tag prefix the
// case its entries must carry (0: every entry matches).
type kvPrefix struct {
	key  []byte
	want byte
}

// matches reports whether key (under p) is an entry the query wants: in a
// v3 tag prefix, one whose cases hold the wanted case (a v2 entry there,
// 16 bytes after the prefix rather than 17, stands for the lowercase one).
func (p kvPrefix) matches(key []byte) bool {
	switch {
	case p.want == 0:
		return true
	case len(key) == len(p.key)+17:
		return key[len(key)-1]&p.want != 0
	}
	return p.want == kvCaseLower
}

// kvPrefixes picks the index a filter without ids is answered from and
// returns its prefixes: a tag (the letter with the fewest values), authors
// with kinds (for authors alone, every stored kind), or kinds (for time
// alone, every stored kind). nil means nothing can match.
func kvPrefixes(f nostr.Filter, stored []int, layout kvLayout) []kvPrefix {
	letter, values := "", []string(nil)
	for name, vals := range f.Tags {
		if len(name) == 1 && (values == nil || len(vals) < len(values) || len(vals) == len(values) && name < letter) {
			letter, values = name, vals
		}
	}
	var out []kvPrefix
	if values != nil {
		folded, want := kvFold(letter[0])
		add := func(p kvPrefix) {
			if layout.tags == nil || layout.tags.mayHaveWords(tagWords(p.key)) {
				out = append(out, p)
			}
		}
		for _, v := range slices.Compact(slices.Sorted(slices.Values(values))) {
			if layout.v2 {
				add(kvPrefix{key: kvTagPrefix(letter[0], v)})
				continue
			}
			add(kvPrefix{key: kvTagPrefix(folded, v), want: want})
			if layout.legacy && want == kvCaseUpper {
				// v2 kept the uppercase letter's keys apart.
				add(kvPrefix{key: kvTagPrefix(letter[0], v)})
			}
		}
		return out
	}
	var pks [][]byte
	for _, a := range slices.Compact(slices.Sorted(slices.Values(f.Authors))) {
		if pk, ok := decode32(a); ok {
			pks = append(pks, pk)
		}
	}
	kinds := slices.Compact(slices.Sorted(slices.Values(f.Kinds)))
	switch {
	case f.Authors != nil && len(pks) == 0, f.Kinds != nil && len(kinds) == 0:
		return nil
	}
	if len(kinds) == 0 {
		kinds = stored
	}
	if len(pks) > 0 {
		// Hundreds of prefixes at worst (the authors limit × the kinds
		// stored), read in turn by one iterator (kvScanEach).
		for _, pk := range pks {
			for _, kind := range kinds {
				out = append(out, kvPrefix{key: append(append([]byte{kvAuthKind}, pk...), kvKindBytes(kind)...)})
			}
		}
		return out
	}
	for _, kind := range kinds {
		out = append(out, kvPrefix{key: append([]byte{kvKind}, kvKindBytes(kind)...)})
	}
	return out
}

// kvCursor walks one index prefix from the newest entry back.
type kvCursor struct {
	it     kvIter
	prefix kvPrefix
}

// suffix is the current entry's ts and serial, which order the merge.
func (c *kvCursor) suffix() []byte {
	key := c.it.key()
	return key[len(c.prefix.key) : len(c.prefix.key)+16]
}

// valid moves past entries of the prefix the query does not want and
// reports whether the cursor is on one it wants.
func (c *kvCursor) valid() bool {
	for ; c.it.validFor(c.prefix.key); c.it.next() {
		if c.prefix.matches(c.it.key()) {
			return true
		}
	}
	return false
}

type kvCursors []*kvCursor

func (h kvCursors) Len() int           { return len(h) }
func (h kvCursors) Less(i, j int) bool { return bytes.Compare(h[i].suffix(), h[j].suffix()) > 0 }
func (h kvCursors) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *kvCursors) Push(x any)        { *h = append(*h, x.(*kvCursor)) }
func (h *kvCursors) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}

// kvEachMin is how many prefixes a query must have before kvScan first
// tries reading them one after another with a single iterator: an engine
// iterator costs microseconds to open (badger several), and a lookup like "which of
// these 256 ids has a deletion" has hundreds of mostly empty prefixes.
const kvEachMin = 8

// kvScan answers f from the filter's index prefixes newest first, loading
// each candidate once and keeping those that match, until f.Limit.
func kvScan(ctx context.Context, r kvReader, f nostr.Filter, kinds []int, layout kvLayout) ([]*nostr.Event, error) {
	prefixes := kvPrefixes(f, kinds, layout)
	upper, lower := kvBounds(f)
	if len(prefixes) >= kvEachMin {
		if out, ok, err := kvScanEach(ctx, r, f, prefixes, upper, lower); err != nil || ok {
			return out, err
		}
	}
	return kvMerge(ctx, r, f, prefixes, upper, lower)
}

// kvScanEach reads every prefix in turn with one iterator, collecting the
// entries in [since, until], then loads them newest first. It gives up
// (ok false) as soon as one prefix holds more than f.Limit entries there,
// where the merge, which stops at the limit, reads less.
func kvScanEach(ctx context.Context, r kvReader, f nostr.Filter, prefixes []kvPrefix, upper []byte, lower uint64) (out []*nostr.Event, ok bool, err error) {
	suffixes, ok, err := kvEntries(ctx, r, prefixes, upper, lower, f.Limit)
	if err != nil || !ok {
		return nil, false, err
	}
	for _, sfx := range suffixes {
		if len(out) >= f.Limit {
			break
		}
		evt, err := kvLoad(r, binary.BigEndian.Uint64(sfx[8:]))
		if err != nil {
			return nil, false, err
		}
		if evt != nil && f.Matches(evt) {
			out = append(out, evt)
		}
	}
	return out, true, nil
}

// kvBounds is the seek key after a prefix for f.Until (the newest entry a
// query reads: ts and serial) and the flipped f.Since (the oldest ts).
func kvBounds(f nostr.Filter) (upper []byte, lower uint64) {
	upper = binary.BigEndian.AppendUint64(nil, ^uint64(0))
	if f.Until != nil {
		upper = binary.BigEndian.AppendUint64(nil, flip(int64(*f.Until)))
	}
	upper = binary.BigEndian.AppendUint64(upper, ^uint64(0))
	if f.Since != nil {
		lower = flip(int64(*f.Since))
	}
	return upper, lower
}

// kvEntries reads every prefix in turn with one iterator and returns the
// (ts, serial) suffixes of the entries it wants in [lower, upper], newest
// first and each once (an event under two of the prefixes is one entry).
// It gives up (ok false) as soon as one prefix holds more than limit
// entries there; limit < 0 reads them all.
func kvEntries(ctx context.Context, r kvReader, prefixes []kvPrefix, upper []byte, lower uint64, limit int) (suffixes [][16]byte, ok bool, err error) {
	common := prefixes[0].key
	for _, p := range prefixes[1:] {
		n := 0
		for n < len(common) && n < len(p.key) && common[n] == p.key[n] {
			n++
		}
		common = common[:n]
	}
	it, err := r.iter(slices.Clip(common))
	if err != nil {
		return nil, false, err
	}
	for _, p := range prefixes {
		if err := ctx.Err(); err != nil {
			it.close()
			return nil, false, err
		}
		n := 0
		for it.seek(append(slices.Clip(p.key), upper...)); it.validFor(p.key); it.next() {
			key := it.key()
			if !p.matches(key) {
				continue
			}
			var sfx [16]byte
			copy(sfx[:], key[len(p.key):])
			if binary.BigEndian.Uint64(sfx[:8]) < lower {
				break
			}
			if n++; limit >= 0 && n > limit {
				return nil, false, it.close()
			}
			suffixes = append(suffixes, sfx)
		}
	}
	if err := it.close(); err != nil {
		return nil, false, err
	}
	slices.SortFunc(suffixes, func(a, b [16]byte) int { return bytes.Compare(b[:], a[:]) })
	return slices.Compact(suffixes), true, nil
}

// kvMerge merges the prefixes through a heap of iterators, newest first,
// and stops at f.Limit matches.
func kvMerge(ctx context.Context, r kvReader, f nostr.Filter, prefixes []kvPrefix, upper []byte, lower uint64) (_ []*nostr.Event, err error) {
	h := make(kvCursors, 0, len(prefixes))
	// done closes an iterator, keeping the first error that cut a walk
	// short: an error, not a shorter answer.
	done := func(it kvIter) {
		if cerr := it.close(); err == nil {
			err = cerr
		}
	}
	defer func() {
		for _, c := range h {
			done(c.it)
		}
	}()
	for _, p := range prefixes {
		it, err := r.iter(p.key)
		if err != nil {
			return nil, err
		}
		c := &kvCursor{it: it, prefix: p}
		c.it.seek(append(slices.Clip(p.key), upper...))
		if !c.valid() {
			done(c.it)
			continue
		}
		h = append(h, c)
	}
	heap.Init(&h)
	var out []*nostr.Event
	seen := make(map[uint64]struct{})
	for steps := 0; len(h) > 0 && len(out) < f.Limit; steps++ {
		if steps%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		c := h[0]
		suffix := c.suffix()
		ts, serial := binary.BigEndian.Uint64(suffix), binary.BigEndian.Uint64(suffix[8:])
		if ts < lower {
			// Older than since: this prefix is done.
			done(c.it)
			heap.Pop(&h)
			continue
		}
		if c.it.next(); c.valid() {
			heap.Fix(&h, 0)
		} else {
			done(c.it)
			heap.Pop(&h)
		}
		if _, dup := seen[serial]; dup {
			continue
		}
		seen[serial] = struct{}{}
		evt, err := kvLoad(r, serial)
		if err != nil {
			return nil, err
		}
		if evt != nil && f.Matches(evt) {
			out = append(out, evt)
		}
	}
	return out, err
}
