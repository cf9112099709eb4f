package store

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/nbd-wtf/go-nostr"
)

// This file is the store's pure logic: which version of a replaceable event
// wins, how a filter is split to fit a backend's per-query limits, and how
// results of split queries are merged. No I/O here, so it is table-tested.

// IsReplaceable reports whether events of this kind keep one version per
// key (replaceable kinds 0, 3, 10000–19999 and addressable 30000–39999).
func IsReplaceable(kind int) bool {
	return nostr.IsReplaceableKind(kind) || nostr.IsAddressableKind(kind)
}

// ReplaceKey is the key that identifies the single version a replaceable or
// addressable event occupies: "kind:pubkey:" for replaceable kinds and
// "kind:pubkey:d" for addressable ones. It is empty for other kinds.
func ReplaceKey(evt *nostr.Event) string {
	switch {
	case nostr.IsReplaceableKind(evt.Kind):
		return strconv.Itoa(evt.Kind) + ":" + evt.PubKey + ":"
	case nostr.IsAddressableKind(evt.Kind):
		return strconv.Itoa(evt.Kind) + ":" + evt.PubKey + ":" + evt.Tags.GetD()
	}
	return ""
}

// Supersedes reports whether next wins over prev as the version of one
// replaceable key: newer created_at wins, and on equal timestamps the lower id
// wins (NIP-01), so every writer, in any order, converges on the same version.
func Supersedes(next, prev *nostr.Event) bool {
	if next.CreatedAt != prev.CreatedAt {
		return next.CreatedAt > prev.CreatedAt
	}
	return next.ID < prev.ID
}

// sameKey keeps the candidates that are versions of evt's replaceable key:
// backends look versions up by kind, author and d tag, which can also match
// other keys (an author's other d values, where d is not indexed).
func sameKey(evt *nostr.Event, candidates []*nostr.Event) []*nostr.Event {
	key := ReplaceKey(evt)
	out := candidates[:0]
	for _, v := range candidates {
		if ReplaceKey(v) == key {
			out = append(out, v)
		}
	}
	return out
}

// queryLimits are how many values of each kind a backend accepts in one
// query; 0 means unlimited. eventstore's SQL backends fail a whole query that
// exceeds them, so the store splits filters instead.
type queryLimits struct {
	IDs, Authors, Kinds, TagValues int
}

// maxQueryParts bounds how many sub-queries one filter may be split into, so
// a hostile filter (thousands of values in several fields) cannot fan out
// into millions of queries.
const maxQueryParts = 4096

// splitFilter splits f into filters that each fit lim, whose union matches
// exactly what f matches (fields are ANDed and values within a field ORed, so
// splitting the values of one field partitions the result set).
func splitFilter(f nostr.Filter, lim queryLimits) ([]nostr.Filter, error) {
	// Count the parts before building any, so a hostile filter is refused
	// without allocating its fan-out.
	count := 1
	chunks := func(n, limit int) int {
		if limit <= 0 || n <= limit {
			return 1
		}
		return (n + limit - 1) / limit
	}
	mul := func(k int) {
		if count <= maxQueryParts {
			count *= k
		}
	}
	mul(chunks(len(f.IDs), lim.IDs))
	mul(chunks(len(f.Authors), lim.Authors))
	mul(chunks(len(f.Kinds), lim.Kinds))
	if lim.TagValues > 0 && len(f.Tags) > 0 {
		share := max(1, lim.TagValues/len(f.Tags))
		for _, vals := range f.Tags {
			mul(chunks(len(vals), share))
		}
	}
	if count > maxQueryParts {
		return nil, fmt.Errorf("filter needs more than %d sub-queries", maxQueryParts)
	}
	parts := []nostr.Filter{f}
	expand := func(n, limit int, set func(g *nostr.Filter, from, to int)) {
		if limit <= 0 || n <= limit {
			return
		}
		var out []nostr.Filter
		for _, p := range parts {
			for from := 0; from < n; from += limit {
				g := p
				set(&g, from, min(from+limit, n))
				out = append(out, g)
			}
		}
		parts = out
	}
	expand(len(f.IDs), lim.IDs, func(g *nostr.Filter, a, b int) { g.IDs = f.IDs[a:b] })
	expand(len(f.Authors), lim.Authors, func(g *nostr.Filter, a, b int) { g.Authors = f.Authors[a:b] })
	expand(len(f.Kinds), lim.Kinds, func(g *nostr.Filter, a, b int) { g.Kinds = f.Kinds[a:b] })
	if lim.TagValues > 0 && len(f.Tags) > 0 {
		// The tag limit counts values over all tag keys together: give each
		// key an equal share.
		keys := make([]string, 0, len(f.Tags))
		for k := range f.Tags {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		share := max(1, lim.TagValues/len(keys))
		for _, k := range keys {
			vals := f.Tags[k]
			expand(len(vals), share, func(g *nostr.Filter, a, b int) {
				tm := make(nostr.TagMap, len(g.Tags))
				for kk, vv := range g.Tags {
					tm[kk] = vv
				}
				tm[k] = vals[a:b]
				g.Tags = tm
			})
		}
	}
	return parts, nil
}

// newestFirst orders events as relays return them: newest first, ties by id.
func newestFirst(a, b *nostr.Event) int {
	if c := cmp.Compare(b.CreatedAt, a.CreatedAt); c != 0 {
		return c
	}
	return strings.Compare(a.ID, b.ID)
}

// mergeResults merges the results of split queries: one copy per id, newest
// first, at most limit events.
func mergeResults(results [][]*nostr.Event, limit int) []*nostr.Event {
	seen := make(map[string]struct{})
	var out []*nostr.Event
	for _, r := range results {
		for _, e := range r {
			if _, dup := seen[e.ID]; dup {
				continue
			}
			seen[e.ID] = struct{}{}
			out = append(out, e)
		}
	}
	slices.SortFunc(out, newestFirst)
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out
}

// maxIndexedTagValue is the longest tag value the PostgreSQL store indexes
// verbatim; longer values (and values PostgreSQL text cannot hold) are
// indexed by their hash, which keeps index entries well under PostgreSQL's
// ~2.7 kB btree/GIN entry limit while every value stays queryable.
const maxIndexedTagValue = 200

// tagIndexValue is how one tag (key, value) is written into, and looked up
// in, the PostgreSQL tag index.
func tagIndexValue(key, value string) string {
	if len(value) <= maxIndexedTagValue && utf8.ValidString(value) && !strings.ContainsRune(value, 0) {
		return key + ":" + value
	}
	sum := sha256.Sum256([]byte(value))
	return key + "#" + hex.EncodeToString(sum[:])
}

// tagIndexValues lists the index entries of an event: one per distinct
// single-letter tag with a value (NIP-01 only defines queries on those).
func tagIndexValues(tags nostr.Tags) []string {
	out := []string{}
	seen := make(map[string]struct{})
	for _, t := range tags {
		if len(t) < 2 || len(t[0]) != 1 {
			continue
		}
		v := tagIndexValue(t[0], t[1])
		if _, dup := seen[v]; dup {
			continue
		}
		seen[v] = struct{}{}
		out = append(out, v)
	}
	return out
}

// sortItems orders items newest first, ties by id, as Items returns them.
func sortItems(items []Item) {
	slices.SortFunc(items, func(a, b Item) int {
		if c := cmp.Compare(b.CreatedAt, a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
}
