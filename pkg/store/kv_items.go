package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/mailru/easyjson/jlexer"
	"github.com/nbd-wtf/go-nostr"
)

// items lists every item matching f in one pass (itemLister): the index
// entries in f's time range, then each candidate's stored JSON read for the
// fields Filter.Matches looks at (kvItemCheck) without decoding the event.
// It is the NIP-77 local set (issue 24): the paged scan through query
// decoded every candidate in full, content, signature and all tags, to keep
// its id and created_at. The answer is the scan's, in its order: newest
// first, ties by the later write (by id for an id list, as Query sorts).
func (k *kv) items(ctx context.Context, f nostr.Filter) ([]Item, error) {
	for name, v := range f.Tags {
		if len(v) == 0 {
			return nil, fmt.Errorf("query %s: tag #%s has no values", f, name)
		}
	}
	done, err := k.enter()
	if err != nil {
		return nil, err
	}
	defer done()
	check := newKVItemCheck(f)
	var out []Item
	err = k.eng.view(func(r kvReader) error {
		var err error
		if f.IDs != nil {
			out, err = kvItemsByIDs(ctx, r, check, f.IDs, k.ids.load())
		} else {
			out, err = kvItemsScan(ctx, r, check, f, k.kinds.all(), k.layout())
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, ctx.Err()
}

// kvItemsScan reads the entries of f's index prefixes and checks each
// candidate's stored JSON.
func kvItemsScan(ctx context.Context, r kvReader, check *kvItemCheck, f nostr.Filter, kinds []int, layout kvLayout) ([]Item, error) {
	prefixes := kvPrefixes(f, kinds, layout)
	if len(prefixes) == 0 {
		return nil, nil
	}
	upper, lower := kvBounds(f)
	suffixes, _, err := kvEntries(ctx, r, prefixes, upper, lower, -1)
	if err != nil {
		return nil, err
	}
	if check.byItem(prefixes) {
		return kvItemsByItemKeys(ctx, r, check, suffixes)
	}
	if sg, ok := r.(kvSortedGetter); ok {
		return kvItemsSorted(ctx, sg, check, suffixes)
	}
	var out []Item
	for n, sfx := range suffixes {
		if n%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		it, ok, err := kvLoadItem(r, binary.BigEndian.Uint64(sfx[8:]), check)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, it)
		}
	}
	return out, nil
}

// kvSortedGetter is a kvReader that reads many keys, given in ascending
// order, more cheaply than a get each (pebble: one iterator, each seek
// going on from the last instead of a point lookup through every level).
type kvSortedGetter interface {
	// getSorted calls fn with the index and value of each of keys that is
	// stored (v valid only during the call). keys are ascending and share
	// prefix.
	getSorted(prefix []byte, keys [][]byte, fn func(n int, v []byte) error) error
}

// kvBySerial orders candidates (index suffixes: ts, serial) by serial, as
// one iterator reads the keys keyOf gives each (ascending): order holds
// their positions in suffixes, keys their keys in that order.
func kvBySerial(suffixes [][16]byte, keyOf func(serial uint64) []byte) (order []int, keys [][]byte) {
	order = make([]int, len(suffixes))
	for n := range order {
		order[n] = n
	}
	slices.SortFunc(order, func(a, b int) int { return bytes.Compare(suffixes[a][8:], suffixes[b][8:]) })
	keys = make([][]byte, len(order))
	for n, at := range order {
		keys[n] = keyOf(binary.BigEndian.Uint64(suffixes[at][8:]))
	}
	return order, keys
}

// kvItemsSorted loads the candidates (suffixes, newest first) in serial
// order and returns the matching items newest first.
func kvItemsSorted(ctx context.Context, sg kvSortedGetter, check *kvItemCheck, suffixes [][16]byte) ([]Item, error) {
	order, keys := kvBySerial(suffixes, kvRawKey)
	found := make([]Item, len(suffixes))
	matched := make([]bool, len(suffixes))
	err := sg.getSorted([]byte{kvRaw}, keys, func(n int, raw []byte) error {
		if n%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		it, ok, err := check.match(raw)
		if err != nil {
			return fmt.Errorf("load event %d: %w", binary.BigEndian.Uint64(keys[n][1:]), err)
		}
		found[order[n]], matched[order[n]] = it, ok
		return nil
	})
	if err != nil {
		return nil, err
	}
	return kvMatched(found, matched), nil
}

// kvItemsByItemKeys is kvItemsScan for a filter its index entries already
// narrow to the events whose tag matches (byItem): each candidate's item key
// (id, pubkey, kind; ~80 bytes) is read instead of its JSON, which at scale
// is mostly a block the cache does not hold (at 1,000 relays the local sets
// reading events were 23 % of graspd's CPU,
// docs/decisions/0077-local-set-item-keys.md). A candidate stored before
// item keys were written has none and is checked from its JSON. Newest
// first, as kvItemsScan.
func kvItemsByItemKeys(ctx context.Context, r kvReader, check *kvItemCheck, suffixes [][16]byte) ([]Item, error) {
	order, keys := kvBySerial(suffixes, kvItemKey)
	found := make([]Item, len(suffixes))
	matched := make([]bool, len(suffixes))
	read := make([]bool, len(suffixes))
	each := func(n int, v []byte) error {
		if n%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		at := order[n]
		it, ok, err := check.matchItem(v, suffixes[at])
		if err != nil {
			return fmt.Errorf("load item %d: %w", binary.BigEndian.Uint64(keys[n][1:]), err)
		}
		found[at], matched[at], read[at] = it, ok, true
		return nil
	}
	if sg, ok := r.(kvSortedGetter); ok {
		if err := sg.getSorted([]byte{kvItem}, keys, each); err != nil {
			return nil, err
		}
	} else {
		for n, key := range keys {
			if _, err := r.get(key, func(v []byte) error { return each(n, v) }); err != nil {
				return nil, err
			}
		}
	}
	for at, sfx := range suffixes {
		if read[at] {
			continue
		}
		it, ok, err := kvLoadItem(r, binary.BigEndian.Uint64(sfx[8:]), check)
		if err != nil {
			return nil, err
		}
		found[at], matched[at] = it, ok
	}
	return kvMatched(found, matched), nil
}

// kvMatched keeps the found items that matched, in place and in order.
func kvMatched(found []Item, matched []bool) []Item {
	out := found[:0]
	for n, it := range found {
		if matched[n] {
			out = append(out, it)
		}
	}
	return out
}

// kvItemsByIDs looks the ids up and checks each stored event's JSON:
// newest first, ties by id (kvByIDs's order).
func kvItemsByIDs(ctx context.Context, r kvReader, check *kvItemCheck, ids []string, filter *idFilter) ([]Item, error) {
	var out []Item
	for n, s := range slices.Compact(slices.Sorted(slices.Values(ids))) {
		if n%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		id, ok := decode32(s)
		if !ok || !filter.mayHave(id) {
			continue
		}
		serial, found, err := kvSerial(r, id)
		if err != nil || !found {
			if err != nil {
				return nil, err
			}
			continue
		}
		it, ok, err := kvLoadItem(r, serial, check)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, it)
		}
	}
	slices.SortStableFunc(out, func(a, b Item) int { return int(b.CreatedAt - a.CreatedAt) })
	return out, nil
}

// kvLoadItem reads the event stored under serial and reports its item if
// it matches (not if there is none).
func kvLoadItem(r kvReader, serial uint64, check *kvItemCheck) (it Item, ok bool, err error) {
	_, err = r.get(kvRawKey(serial), func(raw []byte) error {
		it, ok, err = check.match(raw)
		return err
	})
	if err != nil {
		return Item{}, false, fmt.Errorf("load event %d: %w", serial, err)
	}
	return it, ok, nil
}

// kvItemCheck is Filter.Matches on an event's stored JSON: it reads id,
// pubkey, created_at and kind, and the tags only when the filter has tag
// conditions, checking each tag's name and first value in place (no Tags
// are built); content and signature are skipped. The index already
// narrowed the candidates, but not exactly (a tag key is a hash of the
// value), so every condition is checked again.
type kvItemCheck struct {
	f nostr.Filter
	// ids: f.IDs as a set (nil when f has none).
	ids map[string]struct{}
	// tags are f's tag conditions; met has bit n set when a tag satisfies
	// tags[n].
	tags []kvTagCheck
	// full: more tag conditions than the bit set holds; decode the event
	// and use Filter.Matches.
	full bool
	// need is the itemField bits of what match must read before it stops.
	need uint8
}

// kvTagCheck is one tag condition: a tag named name whose first value is
// one of values.
type kvTagCheck struct {
	name   string
	values map[string]struct{}
}

func newKVItemCheck(f nostr.Filter) *kvItemCheck {
	c := &kvItemCheck{f: f}
	if f.IDs != nil {
		c.ids = make(map[string]struct{}, len(f.IDs))
		for _, id := range f.IDs {
			c.ids[id] = struct{}{}
		}
	}
	for name, vals := range f.Tags {
		if vals == nil {
			continue // Filter.Matches ignores a nil list
		}
		t := kvTagCheck{name: name, values: make(map[string]struct{}, len(vals))}
		for _, v := range vals {
			t.values[v] = struct{}{}
		}
		c.tags = append(c.tags, t)
	}
	c.full = len(c.tags) > 64
	c.need = itemFieldID | itemFieldPubkey | itemFieldCreatedAt | itemFieldKind
	if len(c.tags) > 0 {
		c.need |= itemFieldTags
	}
	return c
}

// byItem reports whether an item key is enough to check a candidate found
// under prefixes: the filter has no tag condition, or one, which the
// candidates' tag keys already hold (their prefix is the letter and the
// value's hash, their cases byte the letter's case). What is left to check
// (ids, kinds, authors, time) is in the item key and the index entry. A
// value whose hash equals an asked one's (FNV-64, not collision-proof) is
// then counted as matching: a local set may hold an item that does not
// match, never lack one that does, and an extra item in a NIP-77 local set
// only names an event the relay is not asked for.
func (c *kvItemCheck) byItem(prefixes []kvPrefix) bool {
	switch {
	case c.full, len(c.tags) > 1:
		return false
	case len(c.tags) == 1:
		return len(prefixes) > 0 && prefixes[0].key[0] == kvTag
	}
	return true
}

// matchItem is match for an item key's value v and the candidate's index
// suffix (ts, serial).
func (c *kvItemCheck) matchItem(v []byte, suffix [16]byte) (Item, bool, error) {
	if len(v) != 72 {
		return Item{}, false, fmt.Errorf("item key of %d bytes, want 72", len(v))
	}
	ts := nostr.Timestamp(int64(binary.BigEndian.Uint64(suffix[:8]) ^ 1<<63))
	kind := int(int64(binary.BigEndian.Uint64(v[64:72]) ^ 1<<63))
	id := hex.EncodeToString(v[:32])
	f := c.f
	switch {
	case c.ids != nil && !has(c.ids, id),
		f.Kinds != nil && !slices.Contains(f.Kinds, kind),
		f.Authors != nil && !slices.Contains(f.Authors, hex.EncodeToString(v[32:64])),
		f.Since != nil && ts < *f.Since,
		f.Until != nil && ts > *f.Until:
		return Item{}, false, nil
	}
	return Item{ID: id, CreatedAt: ts}, true, nil
}

// match reports whether the event whose JSON (as kvPrepare wrote it) is
// raw matches the filter, and its item. raw is read in place: the item's
// id is copied out.
func (c *kvItemCheck) match(raw []byte) (Item, bool, error) {
	if c.full {
		evt := new(nostr.Event)
		if err := evt.UnmarshalJSON(raw); err != nil {
			return Item{}, false, err
		}
		return Item{ID: evt.ID, CreatedAt: evt.CreatedAt}, c.f.Matches(evt), nil
	}
	// The fields as nostr.Event's decoder reads them: null leaves the zero
	// value. The read stops once it has every field the check needs:
	// kvPrepare wrote raw with go-nostr's encoder, which writes each key
	// once, kind, id, pubkey and created_at first, then tags, content and
	// sig. Skipping content and sig (easyjson validates what it skips) was
	// half the CPU of the NIP-77 local set at 500 relays
	// (docs/measurements/2026-12-06-issue32-local-set-reads.md).
	var (
		id, pubkey string
		ts         int64
		kind       int
		met        uint64
		seen       uint8
	)
	need := c.need
	in := jlexer.Lexer{Data: raw}
	in.Delim('{')
	for seen&need != need && !in.IsDelim('}') {
		key := in.UnsafeFieldName(true)
		in.WantColon()
		if in.IsNull() {
			in.Skip()
			in.WantComma()
			continue
		}
		switch key {
		case "id":
			id, seen = in.UnsafeString(), seen|itemFieldID
		case "pubkey":
			pubkey, seen = in.UnsafeString(), seen|itemFieldPubkey
		case "created_at":
			ts, seen = in.Int64(), seen|itemFieldCreatedAt
		case "kind":
			kind, seen = in.Int(), seen|itemFieldKind
		case "tags":
			if len(c.tags) == 0 {
				in.SkipRecursive()
			} else {
				met, seen = c.readTags(&in), seen|itemFieldTags
			}
		default:
			in.SkipRecursive()
		}
		in.WantComma()
	}
	if seen&need != need {
		in.Delim('}')
		in.Consumed()
	}
	if err := in.Error(); err != nil {
		return Item{}, false, err
	}
	f := c.f
	switch {
	case c.ids != nil && !has(c.ids, id),
		f.Kinds != nil && !slices.Contains(f.Kinds, kind),
		f.Authors != nil && !slices.Contains(f.Authors, pubkey),
		met != 1<<len(c.tags)-1,
		f.Since != nil && nostr.Timestamp(ts) < *f.Since,
		f.Until != nil && nostr.Timestamp(ts) > *f.Until:
		return Item{}, false, nil
	}
	return Item{ID: strings.Clone(id), CreatedAt: nostr.Timestamp(ts)}, true, nil
}

// The fields kvItemCheck.match reads, as bits of what it has seen.
const (
	itemFieldID = 1 << iota
	itemFieldPubkey
	itemFieldCreatedAt
	itemFieldKind
	itemFieldTags
)

// readTags reads a tags array and returns the bit set of the conditions
// some tag satisfies (Tags.ContainsAny: name and first value; tags shorter
// than two are skipped).
func (c *kvItemCheck) readTags(in *jlexer.Lexer) (met uint64) {
	in.Delim('[')
	for !in.IsDelim(']') {
		if in.IsNull() {
			in.Skip()
			in.WantComma()
			continue
		}
		in.Delim('[')
		var name string
		for n := 0; !in.IsDelim(']'); n++ {
			v := in.UnsafeString()
			switch n {
			case 0:
				name = v
			case 1:
				for i, t := range c.tags {
					if t.name == name && has(t.values, v) {
						met |= 1 << i
					}
				}
			}
			in.WantComma()
		}
		in.Delim(']')
		in.WantComma()
	}
	in.Delim(']')
	return met
}

func has(set map[string]struct{}, s string) bool {
	_, ok := set[s]
	return ok
}

// held returns those of ids that are stored: an id key lookup each (no
// event is read; in order through one iterator where the engine offers
// it), skipping ids the id filter has never seen. As with a query by ids,
// an id counts only as the event's own spelling (lowercase hex).
func (k *kv) held(ctx context.Context, ids []string) ([]string, error) {
	done, err := k.enter()
	if err != nil {
		return nil, err
	}
	defer done()
	filter := k.ids.load()
	var asked []string
	var keys [][]byte // ascending: the ids are sorted
	for _, s := range slices.Compact(slices.Sorted(slices.Values(ids))) {
		id, ok := decode32(s)
		if ok && filter.mayHave(id) && !strings.ContainsAny(s, "ABCDEF") {
			asked = append(asked, s)
			keys = append(keys, kvIDKey(id))
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []string
	err = k.eng.view(func(r kvReader) error {
		if sg, ok := r.(kvSortedGetter); ok {
			return sg.getSorted([]byte{kvID}, keys, func(n int, _ []byte) error {
				out = append(out, asked[n])
				return nil
			})
		}
		for n, key := range keys {
			if n%1024 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			found, err := r.get(key, func([]byte) error { return nil })
			if err != nil {
				return fmt.Errorf("look up id %s: %w", asked[n], err)
			}
			if found {
				out = append(out, asked[n])
			}
		}
		return nil
	})
	return out, err
}
