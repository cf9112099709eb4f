package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
)

// kvPebbleDB is the kv layout on pebble ("kv+pebble://DIR", and what a new
// directory gets): docs/decisions/0036-kv-on-pebble.md. Writes are committed
// without fsync, as badger's are (SyncWrites off): a commit is in pebble's
// write-ahead log once the log writer has written it, which it does right
// after the commit returns; an operating-system crash loses what the kernel
// had not written, a process crash at most the last moment's commits. Events
// lost that way are fetched again by the next resync.
type kvPebbleDB struct {
	db       *pebble.DB
	maxBytes int
	// serial is the last serial handed out; it starts from the largest E
	// key, so pebble keeps no sequence key. A deleted newest event's
	// serial may be handed out again: its index keys went with it.
	serial atomic.Uint64
}

func openKVPebble(dir string, o options) (kvEngine, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	opts := kvPebbleOptions(o.kvMemory)
	db, err := pebble.Open(dir, opts)
	opts.Cache.Unref() // the database holds its own reference
	if err != nil {
		return nil, err
	}
	p := &kvPebbleDB{db: db, maxBytes: int(min(int64(kvTxnBytes), int64(opts.MemTableSize)/4))}
	last, err := p.lastSerial()
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("serials: %w", err)
	}
	p.serial.Store(last)
	return p, nil
}

// lastSerial is the serial of the newest E key, 0 if there is none.
func (p *kvPebbleDB) lastSerial() (uint64, error) {
	it, err := p.db.NewIter(&pebble.IterOptions{LowerBound: []byte{kvRaw}, UpperBound: []byte{kvRaw + 1}})
	if err != nil {
		return 0, err
	}
	var last uint64
	if it.Last() && len(it.Key()) == 9 {
		last = binary.BigEndian.Uint64(it.Key()[1:])
	}
	return last, it.Close()
}

func (p *kvPebbleDB) name() string  { return kvPebble }
func (p *kvPebbleDB) txnBytes() int { return p.maxBytes }

func (p *kvPebbleDB) get(key []byte, fn func(v []byte) error) (bool, error) {
	v, closer, err := p.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer closer.Close()
	return true, fn(v)
}

func (p *kvPebbleDB) view(fn func(r kvReader) error) error { return fn(p) }

// iter makes kvPebbleDB its own kvReader: each iterator reads one point in
// time, point reads see the latest writes.
func (p *kvPebbleDB) iter(prefix []byte) (kvIter, error) {
	it, err := p.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: kvPrefixEnd(prefix)})
	if err != nil {
		return nil, err
	}
	return &kvPebbleIter{it: it}, nil
}

// getSorted reads keys with one iterator: ascending seeks go on from the
// last position (pebble's seek-using-next) rather than look every key up
// through every level as get does.
func (p *kvPebbleDB) getSorted(prefix []byte, keys [][]byte, fn func(n int, v []byte) error) error {
	it, err := p.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: kvPrefixEnd(prefix)})
	if err != nil {
		return err
	}
	for n, key := range keys {
		if !it.SeekGE(key) || !bytes.Equal(it.Key(), key) {
			continue
		}
		v, err := it.ValueAndErr()
		if err == nil {
			err = fn(n, v)
		}
		if err != nil {
			_ = it.Close()
			return err
		}
	}
	return it.Close()
}

func (p *kvPebbleDB) scanKeys(prefix []byte, fn func(key []byte) bool) error {
	it, err := p.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: kvPrefixEnd(prefix)})
	if err != nil {
		return err
	}
	for ok := it.First(); ok && fn(it.Key()); ok = it.Next() {
	}
	return it.Close()
}

func (p *kvPebbleDB) newWrite() kvWrite { return &kvPebbleWrite{db: p, b: p.db.NewBatch()} }

func (p *kvPebbleDB) nextSerial() (uint64, error) { return p.serial.Add(1), nil }

func (p *kvPebbleDB) close() error { return p.db.Close() }

// kvPrefixEnd is the smallest key after every key that starts with prefix:
// nil (no bound) for an empty prefix or one of 0xff bytes only.
func kvPrefixEnd(prefix []byte) []byte {
	end := bytes.Clone(prefix)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

type kvPebbleIter struct{ it *pebble.Iterator }

// seek: the largest key ≤ key is the last one before key's successor.
func (i *kvPebbleIter) seek(key []byte) { i.it.SeekLT(append(key[:len(key):len(key)], 0)) }
func (i *kvPebbleIter) validFor(p []byte) bool {
	return i.it.Valid() && bytes.HasPrefix(i.it.Key(), p)
}
func (i *kvPebbleIter) key() []byte  { return i.it.Key() }
func (i *kvPebbleIter) next()        { i.it.Prev() }
func (i *kvPebbleIter) close() error { return i.it.Close() }

type kvPebbleWrite struct {
	db     *kvPebbleDB
	b      *pebble.Batch
	closed bool
}

func (w *kvPebbleWrite) get(key []byte, fn func(v []byte) error) (bool, error) {
	return w.db.get(key, fn)
}
func (w *kvPebbleWrite) set(key, value []byte) error { return w.b.Set(key, value, nil) }
func (w *kvPebbleWrite) delete(key []byte) error     { return w.b.Delete(key, nil) }

func (w *kvPebbleWrite) commit() error {
	err := w.b.Commit(pebble.NoSync)
	w.discard()
	return err
}

func (w *kvPebbleWrite) discard() {
	if !w.closed {
		w.closed = true
		_ = w.b.Close()
	}
}

// kvPebbleLogger sends pebble's errors to slog and drops its informational
// lines (flushes, compactions, WAL recovery), as badger's are dropped.
type kvPebbleLogger struct{}

func (kvPebbleLogger) Infof(string, ...any) {}
func (kvPebbleLogger) Errorf(format string, args ...any) {
	slog.Error("pebble: "+fmt.Sprintf(format, args...), "component", "store")
}

// Fatalf is pebble finding its own state corrupt; it must not return.
func (kvPebbleLogger) Fatalf(format string, args ...any) {
	msg := "pebble: " + fmt.Sprintf(format, args...)
	slog.Error(msg, "component", "store")
	panic(msg)
}
