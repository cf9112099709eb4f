package store

import (
	"fmt"
)

// kvIDCapacity is the id filter's smallest capacity: 1.25 MiB.
var kvIDCapacity int64 = 1 << 20

// buildIDs returns an id filter of every stored id, sized for at least
// capacity and twice the ids stored.
func (k *kv) buildIDs(capacity int64) (*idFilter, error) {
	for {
		f := newIDFilter(capacity)
		if err := k.readIDs(f); err != nil {
			return nil, err
		}
		n := f.added.Load()
		if 2*n <= f.capacity {
			return f, nil
		}
		capacity = 2 * n
	}
}

// readIDs adds every stored id to f. Writes that commit after it starts
// reading are not added: a caller replacing a live filter has set nextIDs
// before (see growIDs).
func (k *kv) readIDs(f *idFilter) error {
	if err := kvEachKey(k.eng, kvID, 33, func(key []byte) { f.add(key[1:]) }); err != nil {
		return fmt.Errorf("read ids: %w", err)
	}
	return nil
}

// addIDs records stored ids in the filter, and in its replacement if one is
// being built. Called after the write commits and before its stripes are
// unlocked, so a writer of the same id (which needs the stripe) sees it; a
// reader may briefly not, which costs it only a signature check the writer
// then refuses as a duplicate.
func (k *kv) addIDs(ids [][]byte) {
	cur, next := k.ids.Load(), k.nextIDs.Load()
	for _, id := range ids {
		cur.add(id)
		if next != nil {
			next.add(id)
		}
	}
	if cur.full() && k.growing.CompareAndSwap(false, true) {
		k.growers.Add(1)
		go k.growIDs(cur)
	}
}

// growIDs replaces a full id filter with one four times its capacity. The
// new filter is set as nextIDs before the stored ids are read, so every
// write either committed before the read (and is read) or adds itself to
// it (see addIDs).
func (k *kv) growIDs(cur *idFilter) {
	defer k.growers.Done()
	defer k.growing.Store(false)
	next := newIDFilter(4 * cur.capacity)
	k.nextIDs.Store(next)
	defer k.nextIDs.Store(nil)
	done, err := k.enter()
	if err != nil {
		return // closed
	}
	defer done()
	if err := k.readIDs(next); err != nil {
		return // the full filter still answers, with more false "maybe"s
	}
	k.ids.Store(next)
}
