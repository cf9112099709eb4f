package store

import (
	"encoding/binary"
	"math/bits"
	"sync/atomic"
)

// idFilter is a Bloom filter of event ids: mayHave is false only for an id
// never added. kv keeps one of every id it stored so that the ingester's two
// questions about a new event — is it stored (before its signature is
// checked), is it stored (under the write lock) — skip the database, where
// each cost a skiplist search of every memtable (~4 µs). Deleting an event
// leaves its id in: a false "maybe" costs the lookup the filter saves, never
// a wrong answer.
//
// Event ids are SHA-256 digests, so the filter takes its four bit positions
// from the id's bytes without hashing them again. Someone grinding ids to set
// chosen bits gains a database lookup at most. Safe for concurrent use.
type idFilter struct {
	words []atomic.Uint64
	shift uint // 64 - log2(bit count): a position is a word of the id >> shift
	// capacity is how many ids the filter holds at about a 1 % false
	// positive rate; past it, kv builds a bigger one (see kv.growIDs).
	capacity int64
	added    atomic.Int64
}

// idFilterBitsPerID is the filter's size per id of capacity: with four bit
// positions, ~1.2 % false positives when full, ~10 % at twice that.
const idFilterBitsPerID = 10

// newIDFilter returns an empty filter for at least capacity ids.
func newIDFilter(capacity int64) *idFilter {
	capacity = max(capacity, 64)
	logBits := bits.Len64(uint64(capacity*idFilterBitsPerID) - 1) // rounded up to a power of two
	return &idFilter{
		words:    make([]atomic.Uint64, 1<<(logBits-6)),
		shift:    uint(64 - logBits),
		capacity: capacity,
	}
}

// add records a 32-byte id.
func (f *idFilter) add(id []byte) { f.addWords(idWords(id)) }

// mayHave reports whether id may have been added; false means it was not.
func (f *idFilter) mayHave(id []byte) bool { return f.mayHaveWords(idWords(id)) }

// addWords records a key by four 64-bit words of its hash, each giving one
// bit position.
func (f *idFilter) addWords(w [4]uint64) {
	f.setWords(w)
	f.added.Add(1)
}

// setWords is addWords for a key added before: its bits, not counted again.
func (f *idFilter) setWords(w [4]uint64) {
	for _, x := range w {
		p := x >> f.shift
		f.words[p>>6].Or(1 << (p & 63))
	}
}

// mayHaveWords reports whether a key with these words may have been added.
func (f *idFilter) mayHaveWords(w [4]uint64) bool {
	for _, x := range w {
		p := x >> f.shift
		if f.words[p>>6].Load()&(1<<(p&63)) == 0 {
			return false
		}
	}
	return true
}

// idWords are an id's own four words: an id is a SHA-256 digest already.
func idWords(id []byte) [4]uint64 {
	return [4]uint64{binary.LittleEndian.Uint64(id[0:]), binary.LittleEndian.Uint64(id[8:]),
		binary.LittleEndian.Uint64(id[16:]), binary.LittleEndian.Uint64(id[24:])}
}

// tagWords spreads a tag key's prefix (kvTag, the letter, the FNV-64 of the
// value: kvTagPrefix) over four words with splitmix64, so that the filter's
// positions do not all come from one 64-bit hash's top bits.
func tagWords(prefix []byte) [4]uint64 {
	x := binary.BigEndian.Uint64(prefix[2:10]) ^ uint64(prefix[1])*0x9e3779b97f4a7c15
	var w [4]uint64
	for i := range w {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		w[i] = z ^ z>>31
	}
	return w
}

// full reports whether the filter holds more ids than its capacity.
func (f *idFilter) full() bool { return f.added.Load() > f.capacity }
