package store

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
)

// kv is the store's own layout on an ordered key-value engine, pebble or
// badger (kvEngine; "kv://DIR", and what a plain directory opens). It exists because eventstore's badger backend costs the
// ingester more than its signature checks (docs/measurements/2026-12-01-ingester-kv-store.md):
// a 64 KiB encoding buffer and a transaction with a duplicate-check
// iterator per event, no multi-event write. Here a batch of events is one
// transaction, events are kept as their JSON (no size caps), and tag values
// of any length are indexed.
//
// Keys (one letter of prefix, then fixed-width fields, so each index sorts
// by created_at within its prefix):
//
//	E serial                          → event JSON
//	I id(32)                          → serial
//	K kind ts serial
//	B pubkey(32) kind ts serial
//	T letter hash(value)(8) ts serial cases
//	                                  each single-letter tag's first value
//	N kind                            every kind ever stored
//	M serial                          → id(32) pubkey(32) kind(8): what
//	                                  the NIP-77 local set reads of an
//	                                  event instead of its JSON (kvItemKey)
//
// A tag key is one per distinct value of a letter, both cases together:
// letter is the lowercase one, and cases says which of the event's tags
// carry the value (kvCaseLower: the lowercase letter, or any tag name that
// is not an ASCII letter; kvCaseUpper: the uppercase one). A NIP-22 comment's
// E/e, A/a, K/k and P/p pairs, equal on every top-level comment, cost one key
// each instead of two, and a query reads one prefix per value and skips the
// entries of the other case without loading them. (Format v2 wrote one key
// per letter as given, without cases; a directory written by it keeps those
// keys, read and deleted as they are: see kvLegacyTagsKey.)
//
// ts and kind are 8 bytes big-endian with the sign bit flipped, so negative
// values sort first; serial is 8 bytes, increasing (kvEngine.nextSerial). An index only
// narrows: every candidate is loaded and checked with Filter.Matches, so a
// hash collision costs a read, never a wrong answer.
//
// There is no index by author alone or by time alone: every key costs the
// ingester a skiplist insert and a log write, and those lookups are rare.
// They are answered from B and K with every stored kind (the N keys, held in
// memory): an author is B pubkey × each kind, "everything newest first" is K
// × each kind. (Format v1 had both indexes, as A and C; opening a v1
// directory drops them.) Every write holds the
// stripe lock of its id (or replaceable key), so the engine's conflict
// detection is not needed; the prefixes are letters so that opening the
// directory with eventstore's badger backend by mistake cannot clobber them.
type kv struct {
	eng kvEngine
	// txnBytes is how much one write carries (kvEngine.txnBytes).
	txnBytes int
	locks    stripes
	// mu is held shared by every operation and exclusively by close, so
	// nothing touches the database after it closed.
	mu     sync.RWMutex
	closed bool
	kinds  kvKinds
	// ids holds every id stored (see idFilter); tags every tag key's
	// prefix, so that a query skips the seek of a tag value nothing was
	// stored under: most are (a deletion of the event being decided, the
	// replies to a new root; docs/decisions/0081-tag-prefix-filter.md).
	ids, tags keyFilter
	// growers are the filter rebuilds in progress, which close waits for.
	growers sync.WaitGroup
	// legacyTags is set when the directory holds format v2's tag keys
	// (written before format v3): queries by an uppercase letter also read
	// its own prefix, and deletes remove those keys too.
	legacyTags bool
	// tagsV2 writes and reads tag keys as format v2 did (tests only: it
	// is how a directory "written by the old code" is made).
	tagsV2 bool
	// noItemKeys writes no item keys (tests only: it is how events
	// "stored before item keys" are made).
	noItemKeys bool
}

// kvKinds is the set of kinds stored at least once. A kind is listed for
// queries before the write that stores its first event commits (so no
// query misses an event), and counted as saved once its N key committed
// with that write (so a failed write leaves it to the next one to save).
// It never shrinks: a kind whose events were all deleted costs a query one
// empty prefix.
type kvKinds struct {
	mu    sync.RWMutex
	list  []int // sorted; replaced, never changed in place
	saved map[int]bool
}

// all is every listed kind, sorted; callers must not change it.
func (s *kvKinds) all() []int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.list
}

// isSaved reports whether kind's N key is stored.
func (s *kvKinds) isSaved(kind int) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.saved[kind]
}

// listKinds makes kinds visible to queries.
func (s *kvKinds) listKinds(kinds ...int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	list := slices.Clone(s.list)
	for _, k := range kinds {
		if n, found := slices.BinarySearch(list, k); !found {
			list = slices.Insert(list, n, k)
		}
	}
	s.list = list
}

// save records that kinds' N keys are stored.
func (s *kvKinds) save(kinds ...int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.saved == nil {
		s.saved = map[int]bool{}
	}
	for _, k := range kinds {
		s.saved[k] = true
	}
}

const (
	kvRaw       = 'E'
	kvID        = 'I'
	kvKind      = 'K'
	kvAuthKind  = 'B'
	kvTag       = 'T'
	kvKnownKind = 'N'
	kvItem      = 'M'
	// Format v1's indexes by time and by author alone.
	kvV1Time   = 'C'
	kvV1Author = 'A'
)

var (
	kvFormatKey = []byte("v:format")
	kvFormat    = []byte("grasp-sync events v3")
	kvFormatV2  = []byte("grasp-sync events v2")
	kvFormatV1  = []byte("grasp-sync events v1")
	// kvLegacyTagsKey is present in a v3 directory that was v2 before: it
	// may hold v2 tag keys.
	kvLegacyTagsKey = []byte("v:legacy-tags")
)

// The cases byte of a v3 tag key.
const (
	kvCaseLower byte = 1 << iota
	kvCaseUpper
)

// kvTxnBytes is about how much one write transaction carries before it is
// committed and the next begins, well under badger's batch limit.
const kvTxnBytes = 4 << 20

// openKV opens the kv layout in dir on engine ("" for whichever the
// directory holds, kvDefaultEngine for a new one; kvOpenEngine).
func openKV(dir, engine string, o options) (*kv, error) {
	if dir == "" {
		return nil, errors.New("store kv://: empty path")
	}
	eng, err := kvOpenEngine(dir, engine, o)
	if err != nil {
		return nil, fmt.Errorf("open kv store %s: %w", dir, err)
	}
	fail := func(err error) (*kv, error) {
		eng.close()
		return nil, fmt.Errorf("open kv store %s (%s): %w", dir, eng.name(), err)
	}
	newFormat := kvFormat
	if o.kvTagsV2 {
		newFormat = kvFormatV2
	}
	format, err := kvCheckFormat(eng, newFormat)
	if err != nil {
		return fail(err)
	}
	k := &kv{eng: eng, txnBytes: eng.txnBytes(), tagsV2: o.kvTagsV2, noItemKeys: o.kvNoItemKeys}
	if bytes.Equal(format, kvFormatV1) {
		b, ok := eng.(*kvBadgerDB)
		if !ok {
			return fail(fmt.Errorf("format %q on %s: v1 only ever existed on badger", format, eng.name()))
		}
		if err := kvUpgradeV1(b.db); err != nil {
			return fail(fmt.Errorf("upgrade from v1: %w", err))
		}
		format = kvFormatV2
	}
	if k.legacyTags, err = k.upgradeTags(format); err != nil {
		return fail(err)
	}
	if err := k.loadKinds(); err != nil {
		return fail(err)
	}
	k.ids.read, k.tags.read = k.readIDs, k.readTags
	if err := k.ids.build(kvIDCapacity); err != nil {
		return fail(err)
	}
	if err := k.tags.build(kvIDCapacity); err != nil {
		return fail(err)
	}
	return k, nil
}

// upgradeTags makes a v2 directory v3 (no key is rewritten: its v2 tag
// keys are kept and read as they are, see kvLegacyTagsKey) and reports
// whether the directory holds v2 tag keys.
func (k *kv) upgradeTags(format []byte) (bool, error) {
	switch {
	case k.tagsV2 && !bytes.Equal(format, kvFormatV2):
		return false, fmt.Errorf("format %q: v2 tag keys are written only into a v2 directory", format)
	case k.tagsV2:
		return false, nil
	case bytes.Equal(format, kvFormatV2):
		w := k.eng.newWrite()
		defer w.discard()
		if err := w.set(kvLegacyTagsKey, nil); err != nil {
			return false, fmt.Errorf("upgrade to v3: %w", err)
		}
		if err := w.set(kvFormatKey, kvFormat); err != nil {
			return false, fmt.Errorf("upgrade to v3: %w", err)
		}
		if err := w.commit(); err != nil {
			return false, fmt.Errorf("upgrade to v3: %w", err)
		}
		return true, nil
	}
	found, err := k.eng.get(kvLegacyTagsKey, func([]byte) error { return nil })
	if err != nil {
		return false, fmt.Errorf("read %s: %w", kvLegacyTagsKey, err)
	}
	return found, nil
}

// loadKinds reads the N keys into k.kinds.
func (k *kv) loadKinds() error {
	var kinds []int
	err := kvEachKey(k.eng, kvKnownKind, 9, func(key []byte) {
		kinds = append(kinds, int(int64(binary.BigEndian.Uint64(key[1:])^(1<<63))))
	})
	if err != nil {
		return fmt.Errorf("read kinds: %w", err)
	}
	k.kinds.listKinds(kinds...)
	k.kinds.save(kinds...)
	return nil
}

// kvEachKey calls fn with every key of one prefix letter that is size bytes
// long, without loading values. key is valid only during the call.
func kvEachKey(eng kvEngine, prefix byte, size int, fn func(key []byte)) error {
	return eng.scanKeys([]byte{prefix}, func(key []byte) bool {
		if len(key) == size {
			fn(key)
		}
		return true
	})
}

// kvCheckFormat marks an empty database as ours (format newFormat) and
// returns the format of one that is ours (v3, v2 or v1); it refuses one that
// holds something else (eventstore's badger layout), which it would misread.
func kvCheckFormat(eng kvEngine, newFormat []byte) ([]byte, error) {
	var format []byte
	found, err := eng.get(kvFormatKey, func(v []byte) error {
		format = bytes.Clone(v)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if found {
		if !bytes.Equal(format, kvFormat) && !bytes.Equal(format, kvFormatV2) && !bytes.Equal(format, kvFormatV1) {
			return nil, fmt.Errorf("unknown format %q (want %q)", format, kvFormat)
		}
		return format, nil
	}
	empty := true
	if err := eng.scanKeys(nil, func([]byte) bool { empty = false; return false }); err != nil {
		return nil, err
	}
	if !empty {
		return nil, errors.New("the directory holds another layout (eventstore's badger backend? open it as badger://DIR)")
	}
	w := eng.newWrite()
	defer w.discard()
	if err := w.set(kvFormatKey, newFormat); err != nil {
		return nil, err
	}
	return newFormat, w.commit()
}

// enter guards an operation against a concurrent close.
func (k *kv) enter() (func(), error) {
	k.mu.RLock()
	if k.closed {
		k.mu.RUnlock()
		return nil, errors.New("store closed")
	}
	return k.mu.RUnlock, nil
}

func (k *kv) limits() queryLimits { return queryLimits{IDs: 500, Authors: 500} }

func (k *kv) close() error {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return nil
	}
	k.closed = true
	err := k.eng.close()
	k.mu.Unlock()
	k.growers.Wait() // a rebuild that had not begun finds the store closed
	return err
}

// flip makes a signed number's big-endian bytes sort in numeric order.
func flip(n int64) uint64 { return uint64(n) ^ (1 << 63) }

func kvIDKey(id []byte) []byte { return append([]byte{kvID}, id...) }

func kvRawKey(serial uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{kvRaw}, serial)
}

// kvItemKey is the key of an event's item record (id, pubkey, kind): ~80
// bytes a local set reads instead of the event (~1 KB, in a block the cache
// seldom holds at scale; docs/decisions/0077-local-set-item-keys.md).
// Events stored before it was written have none, and are read as before.
func kvItemKey(serial uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{kvItem}, serial)
}

// kvItemValue is an item record's value.
func kvItemValue(id, pk []byte, kind int) []byte {
	v := make([]byte, 0, 72)
	v = append(append(v, id...), pk...)
	return binary.BigEndian.AppendUint64(v, flip(int64(kind)))
}

// kvFold is the letter a tag name's keys are under in format v3, and the
// cases bit it stands for.
func kvFold(name byte) (byte, byte) {
	if 'A' <= name && name <= 'Z' {
		return name - 'A' + 'a', kvCaseUpper
	}
	return name, kvCaseLower
}

// kvTagPrefix is the index prefix of one tag letter and value (the letter
// as given: kvFold it first for format v3).
func kvTagPrefix(letter byte, value string) []byte {
	h := fnv.New64a()
	_, _ = h.Write([]byte(value))
	return binary.BigEndian.AppendUint64([]byte{kvTag, letter}, h.Sum64())
}

func kvKindBytes(kind int) []byte {
	return binary.BigEndian.AppendUint64(nil, flip(int64(kind)))
}

// decode32 decodes a 64-character hex id or pubkey.
func decode32(s string) ([]byte, bool) {
	if len(s) != 64 {
		return nil, false
	}
	b, err := hex.DecodeString(s)
	return b, err == nil
}
