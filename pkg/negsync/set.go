package negsync

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"iter"
	"math/bits"
	"slices"
	"sort"
	"strings"

	"github.com/nbd-wtf/go-nostr/nip77/negentropy"
)

// Set is our side of a reconciliation, built once and then only read: the
// items sorted as NIP-77 orders them, each id once, with the running sum of
// the ids so that a range's fingerprint costs one hash whatever its length.
// It implements go-nostr's negentropy.Storage and, unlike that package's
// vector (which fingerprints through one shared accumulator), may be used by
// any number of reconciliations at once. Layer 1's local set is every stored
// announcement and is reconciled with every NIP-77 relay, so building it per
// reconciliation cost relays × announcements in sorting, decoding and
// allocation (docs/decisions/0080-local-set-built-once.md).
type Set struct {
	items []Item
	// sums[i] is the sum modulo 2^256 of the first i ids read as 256-bit
	// little-endian numbers (NIP-77's fingerprint accumulator), as four
	// little-endian 64-bit words.
	sums [][4]uint64
}

// NewSet builds a set of items: ids that are not 64 hex digits are left
// out (no relay's id can match them), and an item listed twice counts once.
// items is not modified.
func NewSet(items []Item) *Set {
	sorted := slices.Clone(items)
	slices.SortFunc(sorted, compareItems)
	s := &Set{items: sorted[:0], sums: make([][4]uint64, 1, len(sorted)+1)}
	var id [32]byte
	for _, it := range sorted {
		if n := len(s.items); n > 0 && s.items[n-1] == it {
			continue
		}
		if len(it.ID) != 64 {
			continue
		}
		if _, err := hex.Decode(id[:], []byte(it.ID)); err != nil {
			continue
		}
		s.items = append(s.items, it)
		s.sums = append(s.sums, add256(s.sums[len(s.sums)-1], words(&id)))
	}
	return s
}

// Len is how many items the set holds (0 for a nil set).
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.items)
}

// Items is the set's items in NIP-77's order, each once. The slice is the
// set's own: callers must not modify it.
func (s *Set) Items() []Item {
	if s == nil {
		return nil
	}
	return s.items
}

// Size is Len, for negentropy.Storage.
func (s *Set) Size() int { return s.Len() }

// Range yields the items from begin to end (exclusive) with their indexes.
func (s *Set) Range(begin, end int) iter.Seq2[int, negentropy.Item] {
	return func(yield func(int, negentropy.Item) bool) {
		for i := begin; i < end; i++ {
			if !yield(i, negentropy.Item{Timestamp: s.items[i].CreatedAt, ID: s.items[i].ID}) {
				return
			}
		}
	}
}

// FindLowerBound is the index of the first item in [begin, end) not below
// bound (end if none).
func (s *Set) FindLowerBound(begin, end int, bound negentropy.Bound) int {
	return begin + sort.Search(end-begin, func(i int) bool {
		it := s.items[begin+i]
		return negentropy.ItemCompare(negentropy.Item{Timestamp: it.CreatedAt, ID: it.ID}, bound.Item) >= 0
	})
}

// GetBound is the bound at item idx, or the infinite bound past the end.
func (s *Set) GetBound(idx int) negentropy.Bound {
	if idx < len(s.items) {
		return negentropy.Bound{Item: negentropy.Item{Timestamp: s.items[idx].CreatedAt, ID: s.items[idx].ID}}
	}
	return negentropy.InfiniteBound
}

// Fingerprint is NIP-77's fingerprint of the items from begin to end: the
// first 16 bytes of SHA-256 over the ids' sum and the count, hex-encoded.
func (s *Set) Fingerprint(begin, end int) string {
	sum := sub256(s.sums[end], s.sums[begin])
	var buf [32 + 10]byte
	for i, w := range sum {
		binary.LittleEndian.PutUint64(buf[8*i:], w)
	}
	n := copy(buf[32:], negentropy.EncodeVarInt(end-begin))
	h := sha256.Sum256(buf[:32+n])
	return hex.EncodeToString(h[:negentropy.FingerprintSize])
}

// compareItems orders as NIP-77 does: by created_at, then by id.
func compareItems(a, b Item) int {
	if c := cmp.Compare(a.CreatedAt, b.CreatedAt); c != 0 {
		return c
	}
	return strings.Compare(a.ID, b.ID)
}

func words(b *[32]byte) [4]uint64 {
	return [4]uint64{binary.LittleEndian.Uint64(b[0:]), binary.LittleEndian.Uint64(b[8:]),
		binary.LittleEndian.Uint64(b[16:]), binary.LittleEndian.Uint64(b[24:])}
}

func add256(a, b [4]uint64) (out [4]uint64) {
	var carry uint64
	for i := range out {
		out[i], carry = bits.Add64(a[i], b[i], carry)
	}
	return out
}

func sub256(a, b [4]uint64) (out [4]uint64) {
	var borrow uint64
	for i := range out {
		out[i], borrow = bits.Sub64(a[i], b[i], borrow)
	}
	return out
}
