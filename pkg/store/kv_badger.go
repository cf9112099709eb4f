package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"

	dgbadger "github.com/dgraph-io/badger/v4"
)

// kvBadgerDB is the kv layout's first engine, badger ("kv+badger://DIR"):
// directories written before pebble became the default keep opening with it.
type kvBadgerDB struct {
	db       *dgbadger.DB
	maxBytes int
	// seqMu guards seq, leased on the first serial: a badger sequence
	// writes its key when it is made, and an empty database must stay
	// empty until kvCheckFormat has marked it.
	seqMu sync.Mutex
	seq   *dgbadger.Sequence
}

var kvSerialKey = []byte("v:serial")

func openKVBadger(dir string, o options) (kvEngine, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	db, err := dgbadger.Open(kvBadgerOptions(dir, o.kvMemory))
	if err != nil {
		return nil, err
	}
	return &kvBadgerDB{db: db, maxBytes: int(min(int64(kvTxnBytes), db.MaxBatchSize()/2))}, nil
}

func (b *kvBadgerDB) name() string  { return kvBadger }
func (b *kvBadgerDB) txnBytes() int { return b.maxBytes }

func (b *kvBadgerDB) get(key []byte, fn func(v []byte) error) (bool, error) {
	var found bool
	err := b.db.View(func(txn *dgbadger.Txn) error {
		var err error
		found, err = kvBadgerGet(txn, key, fn)
		return err
	})
	return found, err
}

func kvBadgerGet(txn *dgbadger.Txn, key []byte, fn func(v []byte) error) (bool, error) {
	item, err := txn.Get(key)
	if errors.Is(err, dgbadger.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, item.Value(fn)
}

func (b *kvBadgerDB) view(fn func(r kvReader) error) error {
	return b.db.View(func(txn *dgbadger.Txn) error { return fn(kvBadgerReader{txn}) })
}

func (b *kvBadgerDB) scanKeys(prefix []byte, fn func(key []byte) bool) error {
	return b.db.View(func(txn *dgbadger.Txn) error {
		it := txn.NewIterator(dgbadger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			if !fn(it.Item().Key()) {
				break
			}
		}
		return nil
	})
}

func (b *kvBadgerDB) newWrite() kvWrite { return kvBadgerWrite{b.db.NewTransaction(true)} }

func (b *kvBadgerDB) nextSerial() (uint64, error) {
	b.seqMu.Lock()
	defer b.seqMu.Unlock()
	if b.seq == nil {
		seq, err := b.db.GetSequence(kvSerialKey, 1024)
		if err != nil {
			return 0, err
		}
		b.seq = seq
	}
	return b.seq.Next()
}

func (b *kvBadgerDB) close() error {
	b.seqMu.Lock()
	if b.seq != nil {
		_ = b.seq.Release()
	}
	b.seqMu.Unlock()
	return b.db.Close()
}

type kvBadgerReader struct{ txn *dgbadger.Txn }

func (r kvBadgerReader) get(key []byte, fn func(v []byte) error) (bool, error) {
	return kvBadgerGet(r.txn, key, fn)
}

func (r kvBadgerReader) iter(prefix []byte) (kvIter, error) {
	return kvBadgerIter{r.txn.NewIterator(dgbadger.IteratorOptions{Prefix: prefix, Reverse: true})}, nil
}

type kvBadgerIter struct{ it *dgbadger.Iterator }

func (i kvBadgerIter) seek(key []byte)        { i.it.Seek(key) }
func (i kvBadgerIter) validFor(p []byte) bool { return i.it.ValidForPrefix(p) }
func (i kvBadgerIter) key() []byte            { return i.it.Item().Key() }
func (i kvBadgerIter) next()                  { i.it.Next() }
func (i kvBadgerIter) close() error           { i.it.Close(); return nil }

type kvBadgerWrite struct{ txn *dgbadger.Txn }

func (w kvBadgerWrite) get(key []byte, fn func(v []byte) error) (bool, error) {
	return kvBadgerGet(w.txn, key, fn)
}
func (w kvBadgerWrite) set(key, value []byte) error { return kvBadgerErr(w.txn.Set(key, value)) }
func (w kvBadgerWrite) delete(key []byte) error     { return kvBadgerErr(w.txn.Delete(key)) }
func (w kvBadgerWrite) commit() error               { return kvBadgerErr(w.txn.Commit()) }
func (w kvBadgerWrite) discard()                    { w.txn.Discard() }

func kvBadgerErr(err error) error {
	if errors.Is(err, dgbadger.ErrTxnTooBig) {
		return fmt.Errorf("%w: %w", errKVTooBig, err)
	}
	return err
}

// kvUpgradeV1 turns a format v1 directory into v2: it records every kind
// the kind index holds as an N key, then drops v1's time and author indexes.
// Each step can be repeated, so an upgrade cut short is finished by the next
// open. Format v1 only ever existed on badger.
func kvUpgradeV1(db *dgbadger.DB) error {
	var kinds [][]byte
	err := db.View(func(txn *dgbadger.Txn) error {
		it := txn.NewIterator(dgbadger.IteratorOptions{Prefix: []byte{kvKind}})
		defer it.Close()
		// One seek per kind: past the kind's last entry to the next kind.
		for it.Seek([]byte{kvKind}); it.Valid(); {
			kind := slices.Clone(it.Item().Key()[1:9])
			kinds = append(kinds, kind)
			next := binary.BigEndian.Uint64(kind) + 1
			if next == 0 {
				break
			}
			it.Seek(binary.BigEndian.AppendUint64([]byte{kvKind}, next))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("read kinds: %w", err)
	}
	wb := db.NewWriteBatch()
	defer wb.Cancel()
	for _, kind := range kinds {
		if err := wb.Set(append([]byte{kvKnownKind}, kind...), nil); err != nil {
			return fmt.Errorf("record kinds: %w", err)
		}
	}
	if err := wb.Flush(); err != nil {
		return fmt.Errorf("record kinds: %w", err)
	}
	if err := db.DropPrefix([]byte{kvV1Time}, []byte{kvV1Author}); err != nil {
		return fmt.Errorf("drop v1 indexes: %w", err)
	}
	return db.Update(func(txn *dgbadger.Txn) error { return txn.Set(kvFormatKey, kvFormatV2) })
}
