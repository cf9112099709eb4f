package store

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// kvIDCapacity is the smallest capacity of the id and tag filters: 1.25 MiB
// each.
var kvIDCapacity int64 = 1 << 20

// keyFilter is a Bloom filter (idFilter) of some of the keys kv stores,
// replaced by one four times its capacity when it fills up: every stored id
// (kv.ids), every tag prefix (kv.tags).
type keyFilter struct {
	cur atomic.Pointer[idFilter]
	// next is the bigger filter being built to replace cur, which writes
	// add to as well.
	next    atomic.Pointer[idFilter]
	growing atomic.Bool
	// read adds the stored keys to a filter.
	read func(f *idFilter) error
}

// load is the filter in use.
func (kf *keyFilter) load() *idFilter { return kf.cur.Load() }

// build sets a filter of every stored key, sized for at least capacity and
// twice the keys stored.
func (kf *keyFilter) build(capacity int64) error {
	for {
		f := newIDFilter(capacity)
		if err := kf.read(f); err != nil {
			return err
		}
		n := f.added.Load()
		if 2*n <= f.capacity {
			kf.cur.Store(f)
			return nil
		}
		capacity = 2 * n
	}
}

// add records keys by their words in the filter, and in its replacement if
// one is being built; a full filter is replaced in the background (enter
// admits the rebuild unless the store closed, growers is what close waits
// for). Keys added before (again: true) are not counted again.
//
// A replacement misses none if every key is added after the write that
// stores it commits: a writer that finds no replacement being built has
// committed before one is announced, so the replacement's read of the
// stored keys, which starts after, sees it.
func (kf *keyFilter) add(words [][4]uint64, again bool, enter func() (func(), error), growers *sync.WaitGroup) {
	cur, next := kf.cur.Load(), kf.next.Load()
	set := (*idFilter).addWords
	if again {
		set = (*idFilter).setWords
	}
	for _, w := range words {
		set(cur, w)
		if next != nil {
			set(next, w)
		}
	}
	if cur.full() && kf.growing.CompareAndSwap(false, true) {
		growers.Add(1)
		go kf.grow(cur, enter, growers)
	}
}

// grow replaces a full filter with one four times its capacity. The new
// filter is set as next before the stored keys are read, so every write
// either committed before the read (and is read) or adds itself to it (see
// add).
func (kf *keyFilter) grow(cur *idFilter, enter func() (func(), error), growers *sync.WaitGroup) {
	defer growers.Done()
	defer kf.growing.Store(false)
	next := newIDFilter(4 * cur.capacity)
	kf.next.Store(next)
	defer kf.next.Store(nil)
	done, err := enter()
	if err != nil {
		return // closed
	}
	defer done()
	if err := kf.read(next); err != nil {
		return // the full filter still answers, with more false "maybe"s
	}
	kf.cur.Store(next)
}

// readIDs adds every stored id to f. Writes that commit after it starts
// reading are not added: a caller replacing a live filter has set next
// before (see keyFilter.grow).
func (k *kv) readIDs(f *idFilter) error {
	if err := kvEachKey(k.eng, kvID, 33, func(key []byte) { f.add(key[1:]) }); err != nil {
		return fmt.Errorf("read ids: %w", err)
	}
	return nil
}

// readTags adds the prefix of every stored tag key to f (format v2's and
// v3's alike: the prefix is the key's first 10 bytes in both).
func (k *kv) readTags(f *idFilter) error {
	err := k.eng.scanKeys([]byte{kvTag}, func(key []byte) bool {
		if len(key) >= 10 {
			f.addWords(tagWords(key))
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("read tag keys: %w", err)
	}
	return nil
}

// addIDs records stored ids in the id filter. Called after the write
// commits and before its stripes are unlocked, so a writer of the same id
// (which needs the stripe) sees it; a reader may briefly not, which costs it
// only a signature check the writer then refuses as a duplicate.
func (k *kv) addIDs(ids [][]byte) {
	words := make([][4]uint64, len(ids))
	for i, id := range ids {
		words[i] = idWords(id)
	}
	k.ids.add(words, false, k.enter, &k.growers)
}

// tagKeyWords are the filter words of the tag keys among keys.
func tagKeyWords(words [][4]uint64, keys [][]byte) [][4]uint64 {
	for _, key := range keys {
		if len(key) >= 10 && key[0] == kvTag {
			words = append(words, tagWords(key))
		}
	}
	return words
}

// addTags records tag prefixes in the tag filter: before the write that
// stores them commits, so that a query, which skips a prefix the filter
// has not seen, never misses an event once it is stored (a write that then
// fails leaves a false "maybe": a wasted seek); and again (again: true)
// after it commits, for a replacement filter being built meanwhile (see
// keyFilter.add).
func (k *kv) addTags(words [][4]uint64, again bool) {
	if len(words) > 0 {
		k.tags.add(words, again, k.enter, &k.growers)
	}
}
