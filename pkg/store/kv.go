package store

import (
	"bytes"
	"container/heap"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"slices"
	"sync"
	"sync/atomic"

	dgbadger "github.com/dgraph-io/badger/v4"
	"github.com/nbd-wtf/go-nostr"
)

// kv is the store's own layout on badger ("kv://DIR", and what a plain
// directory opens). It exists because eventstore's badger backend costs the
// ingester more than its signature checks (docs/performance.md, "Ingester"):
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
//	T letter hash(value)(8) ts serial  each single-letter tag's first value
//	N kind                            every kind ever stored
//
// ts and kind are 8 bytes big-endian with the sign bit flipped, so negative
// values sort first; serial is 8 bytes from a badger sequence. An index only
// narrows: every candidate is loaded and checked with Filter.Matches, so a
// hash collision costs a read, never a wrong answer.
//
// There is no index by author alone or by time alone: every key costs the
// ingester a skiplist insert and a log write, and those lookups are rare.
// They are answered from B and K with every stored kind (the N keys, held in
// memory): an author is B pubkey × each kind, "everything newest first" is K
// × each kind. (Format v1 had both indexes, as A and C; opening a v1
// directory drops them.) Every write holds the
// stripe lock of its id (or replaceable key), so badger's conflict
// detection is not needed; the prefixes are letters so that opening the
// directory with eventstore's badger backend by mistake cannot clobber them.
type kv struct {
	db    *dgbadger.DB
	seq   *dgbadger.Sequence
	locks stripes
	// mu is held shared by every operation and exclusively by close, so
	// nothing touches the database after it closed.
	mu     sync.RWMutex
	closed bool
	kinds  kvKinds
	// ids holds every id stored (see idFilter); nextIDs is the bigger
	// filter being built to replace it, which writes add to as well.
	ids, nextIDs atomic.Pointer[idFilter]
	growing      atomic.Bool
	// growers is the filter rebuild in progress, which close waits for.
	growers sync.WaitGroup
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
	// Format v1's indexes by time and by author alone.
	kvV1Time   = 'C'
	kvV1Author = 'A'
)

var (
	kvFormatKey = []byte("v:format")
	kvFormat    = []byte("grasp-sync events v2")
	kvFormatV1  = []byte("grasp-sync events v1")
	kvSerialKey = []byte("v:serial")
)

// kvTxnBytes is about how much one write transaction carries before it is
// committed and the next begins, well under badger's batch limit.
const kvTxnBytes = 4 << 20

func openKV(dir string, o options) (*kv, error) {
	if dir == "" {
		return nil, errors.New("store kv://: empty path")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("store kv://%s: %w", dir, err)
	}
	opts := dgbadger.DefaultOptions(dir).WithLogger(nil).WithDetectConflicts(false)
	db, err := dgbadger.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("open kv store %s: %w", dir, err)
	}
	fail := func(err error) (*kv, error) {
		db.Close()
		return nil, fmt.Errorf("open kv store %s: %w", dir, err)
	}
	format, err := kvCheckFormat(db)
	if err != nil {
		return fail(err)
	}
	k := &kv{db: db}
	if bytes.Equal(format, kvFormatV1) {
		if err := kvUpgradeV1(db); err != nil {
			return fail(fmt.Errorf("upgrade from v1: %w", err))
		}
	}
	if err := k.loadKinds(); err != nil {
		return fail(err)
	}
	ids, err := k.buildIDs(kvIDCapacity)
	if err != nil {
		return fail(err)
	}
	k.ids.Store(ids)
	if k.seq, err = db.GetSequence(kvSerialKey, 1024); err != nil {
		return fail(fmt.Errorf("serials: %w", err))
	}
	return k, nil
}

// kvUpgradeV1 turns a format v1 directory into v2: it records every kind
// the kind index holds as an N key, then drops v1's time and author indexes.
// Each step can be repeated, so an upgrade cut short is finished by the next
// open.
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
	return db.Update(func(txn *dgbadger.Txn) error { return txn.Set(kvFormatKey, kvFormat) })
}

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
	err := k.db.View(func(txn *dgbadger.Txn) error {
		it := txn.NewIterator(dgbadger.IteratorOptions{Prefix: []byte{kvID}})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			if key := it.Item().Key(); len(key) == 33 {
				f.add(key[1:])
			}
		}
		return nil
	})
	if err != nil {
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

// loadKinds reads the N keys into k.kinds.
func (k *kv) loadKinds() error {
	var kinds []int
	err := k.db.View(func(txn *dgbadger.Txn) error {
		it := txn.NewIterator(dgbadger.IteratorOptions{Prefix: []byte{kvKnownKind}, PrefetchValues: false})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			if key := it.Item().Key(); len(key) == 9 {
				kinds = append(kinds, int(int64(binary.BigEndian.Uint64(key[1:])^(1<<63))))
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("read kinds: %w", err)
	}
	k.kinds.listKinds(kinds...)
	k.kinds.save(kinds...)
	return nil
}

// kvCheckFormat marks an empty database as ours and returns the format of
// one that is ours (this one or v1); it refuses one that holds something
// else (eventstore's badger layout), which it would misread.
func kvCheckFormat(db *dgbadger.DB) ([]byte, error) {
	var format []byte
	err := db.Update(func(txn *dgbadger.Txn) error {
		item, err := txn.Get(kvFormatKey)
		if err == nil {
			if format, err = item.ValueCopy(nil); err != nil {
				return err
			}
			if !bytes.Equal(format, kvFormat) && !bytes.Equal(format, kvFormatV1) {
				return fmt.Errorf("unknown format %q (want %q)", format, kvFormat)
			}
			return nil
		}
		if !errors.Is(err, dgbadger.ErrKeyNotFound) {
			return err
		}
		it := txn.NewIterator(dgbadger.IteratorOptions{})
		it.Rewind()
		empty := !it.Valid()
		it.Close()
		if !empty {
			return errors.New("the directory holds another layout (eventstore's badger backend? open it as badger://DIR)")
		}
		format = kvFormat
		return txn.Set(kvFormatKey, kvFormat)
	})
	return format, err
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
	_ = k.seq.Release()
	err := k.db.Close()
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

// kvTagPrefix is the index prefix of one tag letter and value.
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

// kvIndexKeys are the index keys of evt stored under serial. They share
// one allocation: a batch writes about ten per event.
func kvIndexKeys(evt *nostr.Event, pk []byte, serial uint64) [][]byte {
	var tags [][]byte // each distinct letter and value once
	for _, t := range evt.Tags {
		if len(t) < 2 || len(t[0]) != 1 {
			continue
		}
		p := kvTagPrefix(t[0][0], t[1])
		if !slices.ContainsFunc(tags, func(q []byte) bool { return bytes.Equal(p, q) }) {
			tags = append(tags, p)
		}
	}
	const sfx = 16 // ts, serial
	kind := flip(int64(evt.Kind))
	buf := make([]byte, 0, (1+8+sfx)+(1+len(pk)+8+sfx)+len(tags)*(10+sfx))
	keys := make([][]byte, 0, 2+len(tags))
	key := func(parts ...[]byte) {
		start := len(buf)
		for _, p := range parts {
			buf = append(buf, p...)
		}
		buf = binary.BigEndian.AppendUint64(buf, flip(int64(evt.CreatedAt)))
		buf = binary.BigEndian.AppendUint64(buf, serial)
		keys = append(keys, buf[start:len(buf):len(buf)])
	}
	kb := binary.BigEndian.AppendUint64(nil, kind)
	key([]byte{kvKind}, kb)
	key([]byte{kvAuthKind}, pk, kb)
	for _, p := range tags {
		key(p)
	}
	return keys
}

// kvPrepared is an event ready to write: its decoded id and pubkey.
type kvPrepared struct {
	n       int
	evt     *nostr.Event
	id, pk  []byte
	size    int
	payload []byte
}

func (k *kv) insert(ctx context.Context, evt *nostr.Event) (bool, error) {
	r := k.insertBatch(ctx, []*nostr.Event{evt})[0]
	return r.Stored, r.Err
}

// insertBatch writes regular events with distinct ids, as few badger
// transactions as their size allows, holding the stripes of their ids.
func (k *kv) insertBatch(ctx context.Context, evts []*nostr.Event) []SaveResult {
	ids := make([]string, len(evts))
	for n, evt := range evts {
		ids[n] = evt.ID
	}
	unlock := k.locks.lockAll(ids)
	defer unlock()
	return k.write(ctx, evts)
}

// write stores the events not stored yet; the caller holds their stripes
// (or, for a replaceable event, its key's: only replace writes those ids).
func (k *kv) write(ctx context.Context, evts []*nostr.Event) []SaveResult {
	res := make([]SaveResult, len(evts))
	done, err := k.enter()
	if err != nil {
		for n := range res {
			res[n].Err = err
		}
		return res
	}
	defer done()
	var todo []kvPrepared
	for n, evt := range evts {
		p, err := kvPrepare(evt)
		if err != nil {
			res[n].Err = err
			continue
		}
		p.n = n
		todo = append(todo, p)
	}
	for len(todo) > 0 {
		if err := ctx.Err(); err != nil {
			for _, p := range todo {
				res[p.n].Err = err
			}
			break
		}
		size, end := 0, 0
		for end < len(todo) && (end == 0 || size+todo[end].size <= kvTxnBytes) {
			size += todo[end].size
			end++
		}
		k.writeChunk(todo[:end], res)
		todo = todo[end:]
	}
	return res
}

func kvPrepare(evt *nostr.Event) (kvPrepared, error) {
	id, ok := decode32(evt.ID)
	if !ok {
		return kvPrepared{}, fmt.Errorf("%w: id %q is not 32 bytes of hex", ErrUnstorable, evt.ID)
	}
	pk, ok := decode32(evt.PubKey)
	if !ok {
		return kvPrepared{}, fmt.Errorf("%w: pubkey %q is not 32 bytes of hex", ErrUnstorable, evt.PubKey)
	}
	payload, err := evt.MarshalJSON()
	if err != nil {
		return kvPrepared{}, fmt.Errorf("%w: encode: %v", ErrUnstorable, err)
	}
	return kvPrepared{evt: evt, id: id, pk: pk, payload: payload, size: len(payload) + 64*(5+len(evt.Tags))}, nil
}

// writeChunk stores the events of chunk that are not stored yet in one
// transaction, and splits the chunk when badger finds it too big.
func (k *kv) writeChunk(chunk []kvPrepared, res []SaveResult) {
	txn := k.db.NewTransaction(true)
	defer txn.Discard()
	var wrote, newKinds []int
	var wroteIDs [][]byte
	ids := k.ids.Load()
	err := func() error {
		for _, p := range chunk {
			idKey := kvIDKey(p.id)
			// The filter has every id stored, and any writer of this
			// one holds its stripe: if it has not seen the id, the id
			// is not stored.
			if ids.mayHave(p.id) {
				if _, err := txn.Get(idKey); err == nil {
					continue // stored already: a duplicate
				} else if !errors.Is(err, dgbadger.ErrKeyNotFound) {
					return err
				}
			}
			serial, err := k.seq.Next()
			if err != nil {
				return fmt.Errorf("next serial: %w", err)
			}
			if err := txn.Set(kvRawKey(serial), p.payload); err != nil {
				return err
			}
			if err := txn.Set(idKey, binary.BigEndian.AppendUint64(nil, serial)); err != nil {
				return err
			}
			for _, key := range kvIndexKeys(p.evt, p.pk, serial) {
				if err := txn.Set(key, nil); err != nil {
					return err
				}
			}
			if !k.kinds.isSaved(p.evt.Kind) && !slices.Contains(newKinds, p.evt.Kind) {
				if err := txn.Set(append([]byte{kvKnownKind}, kvKindBytes(p.evt.Kind)...), nil); err != nil {
					return err
				}
				newKinds = append(newKinds, p.evt.Kind)
			}
			wrote = append(wrote, p.n)
			wroteIDs = append(wroteIDs, p.id)
		}
		k.kinds.listKinds(newKinds...)
		return txn.Commit()
	}()
	switch {
	case err == nil:
		k.kinds.save(newKinds...)
		k.addIDs(wroteIDs)
		for _, n := range wrote {
			res[n].Stored = true
		}
	case errors.Is(err, dgbadger.ErrTxnTooBig) && len(chunk) > 1:
		txn.Discard()
		k.writeChunk(chunk[:len(chunk)/2], res)
		k.writeChunk(chunk[len(chunk)/2:], res)
	case errors.Is(err, dgbadger.ErrTxnTooBig):
		res[chunk[0].n].Err = fmt.Errorf("%w: %d bytes is more than one badger transaction holds", ErrUnstorable, chunk[0].size)
	default:
		for _, p := range chunk {
			res[p.n].Err = err
		}
	}
}

func (k *kv) replace(ctx context.Context, evt *nostr.Event) (bool, error) {
	mu := k.locks.lock(ReplaceKey(evt))
	defer mu.Unlock()
	insert := func(ctx context.Context, evt *nostr.Event) (bool, error) {
		r := k.write(ctx, []*nostr.Event{evt})[0]
		return r.Stored, r.Err
	}
	return replaceVersions(ctx, evt, k.versions, insert, k.delete)
}

// versions returns every stored version of evt's replaceable key.
func (k *kv) versions(ctx context.Context, evt *nostr.Event) ([]*nostr.Event, error) {
	f := nostr.Filter{Kinds: []int{evt.Kind}, Authors: []string{evt.PubKey}, Limit: DefaultQueryLimit}
	if nostr.IsAddressableKind(evt.Kind) {
		f.Tags = nostr.TagMap{"d": {evt.Tags.GetD()}}
	}
	all, err := k.query(ctx, f)
	if err != nil {
		return nil, err
	}
	return sameKey(evt, all), nil
}

func (k *kv) delete(_ context.Context, evt *nostr.Event) error {
	id, ok := decode32(evt.ID)
	if !ok {
		return nil // never stored
	}
	done, err := k.enter()
	if err != nil {
		return err
	}
	defer done()
	return k.db.Update(func(txn *dgbadger.Txn) error {
		serial, stored, err := kvLookup(txn, id)
		if err != nil || stored == nil {
			return err
		}
		pk, _ := decode32(stored.PubKey)
		keys := append(kvIndexKeys(stored, pk, serial), kvRawKey(serial), kvIDKey(id))
		for _, key := range keys {
			if err := txn.Delete(key); err != nil {
				return err
			}
		}
		return nil
	})
}

// kvLookup finds the stored event with this id: nil if there is none.
func kvLookup(txn *dgbadger.Txn, id []byte) (uint64, *nostr.Event, error) {
	item, err := txn.Get(kvIDKey(id))
	if errors.Is(err, dgbadger.ErrKeyNotFound) {
		return 0, nil, nil
	}
	if err != nil {
		return 0, nil, err
	}
	var serial uint64
	if err := item.Value(func(v []byte) error {
		if len(v) != 8 {
			return fmt.Errorf("id %x: serial of %d bytes", id, len(v))
		}
		serial = binary.BigEndian.Uint64(v)
		return nil
	}); err != nil {
		return 0, nil, err
	}
	evt, err := kvLoad(txn, serial)
	return serial, evt, err
}

// kvLoad reads the event stored under serial: nil if there is none.
func kvLoad(txn *dgbadger.Txn, serial uint64) (*nostr.Event, error) {
	item, err := txn.Get(kvRawKey(serial))
	if errors.Is(err, dgbadger.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	evt := new(nostr.Event)
	if err := item.Value(evt.UnmarshalJSON); err != nil {
		return nil, fmt.Errorf("decode event %d: %w", serial, err)
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
	err = k.db.View(func(txn *dgbadger.Txn) error {
		if f.IDs != nil {
			out, err = kvByIDs(txn, f, k.ids.Load())
		} else {
			out, err = kvScan(ctx, txn, f, k.kinds.all())
		}
		return err
	})
	return out, err
}

// kvByIDs looks the ids up, skipping those the id filter has never seen.
func kvByIDs(txn *dgbadger.Txn, f nostr.Filter, ids *idFilter) ([]*nostr.Event, error) {
	var out []*nostr.Event
	for _, s := range slices.Compact(slices.Sorted(slices.Values(f.IDs))) {
		id, ok := decode32(s)
		if !ok || !ids.mayHave(id) {
			continue
		}
		_, evt, err := kvLookup(txn, id)
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

// kvPrefixes picks the index a filter without ids is answered from and
// returns its prefixes: a tag (the letter with the fewest values), authors
// with kinds (for authors alone, every stored kind), or kinds (for time
// alone, every stored kind). nil means nothing can match.
func kvPrefixes(f nostr.Filter, stored []int) [][]byte {
	letter, values := "", []string(nil)
	for name, vals := range f.Tags {
		if len(name) == 1 && (values == nil || len(vals) < len(values) || len(vals) == len(values) && name < letter) {
			letter, values = name, vals
		}
	}
	var out [][]byte
	if values != nil {
		for _, v := range slices.Compact(slices.Sorted(slices.Values(values))) {
			out = append(out, kvTagPrefix(letter[0], v))
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
				out = append(out, append(append([]byte{kvAuthKind}, pk...), kvKindBytes(kind)...))
			}
		}
		return out
	}
	for _, kind := range kinds {
		out = append(out, append([]byte{kvKind}, kvKindBytes(kind)...))
	}
	return out
}

// kvCursor walks one index prefix from the newest entry back.
type kvCursor struct {
	it     *dgbadger.Iterator
	prefix []byte
}

// suffix is the current entry's ts and serial, which order the merge.
func (c *kvCursor) suffix() []byte {
	key := c.it.Item().Key()
	return key[len(key)-16:]
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
// tries reading them one after another with a single iterator: a badger
// iterator costs several microseconds to open, and a lookup like "which of
// these 256 ids has a deletion" has hundreds of mostly empty prefixes.
const kvEachMin = 8

// kvScan answers f from the filter's index prefixes newest first, loading
// each candidate once and keeping those that match, until f.Limit.
func kvScan(ctx context.Context, txn *dgbadger.Txn, f nostr.Filter, kinds []int) ([]*nostr.Event, error) {
	prefixes := kvPrefixes(f, kinds)
	upper := binary.BigEndian.AppendUint64(nil, ^uint64(0))
	if f.Until != nil {
		upper = binary.BigEndian.AppendUint64(nil, flip(int64(*f.Until)))
	}
	upper = binary.BigEndian.AppendUint64(upper, ^uint64(0))
	var lower uint64
	if f.Since != nil {
		lower = flip(int64(*f.Since))
	}
	if len(prefixes) >= kvEachMin {
		if out, ok, err := kvScanEach(ctx, txn, f, prefixes, upper, lower); err != nil || ok {
			return out, err
		}
	}
	return kvMerge(ctx, txn, f, prefixes, upper, lower)
}

// kvScanEach reads every prefix in turn with one iterator, collecting the
// entries in [since, until], then loads them newest first. It gives up
// (ok false) as soon as one prefix holds more than f.Limit entries there,
// where the merge, which stops at the limit, reads less.
func kvScanEach(ctx context.Context, txn *dgbadger.Txn, f nostr.Filter, prefixes [][]byte, upper []byte, lower uint64) (out []*nostr.Event, ok bool, err error) {
	common := prefixes[0]
	for _, p := range prefixes[1:] {
		n := 0
		for n < len(common) && n < len(p) && common[n] == p[n] {
			n++
		}
		common = common[:n]
	}
	it := txn.NewIterator(dgbadger.IteratorOptions{Prefix: slices.Clip(common), Reverse: true})
	defer it.Close()
	var suffixes [][16]byte
	for _, p := range prefixes {
		if err := ctx.Err(); err != nil {
			return nil, false, err
		}
		n := 0
		for it.Seek(append(slices.Clip(p), upper...)); it.ValidForPrefix(p); it.Next() {
			key := it.Item().Key()
			var sfx [16]byte
			copy(sfx[:], key[len(key)-16:])
			if binary.BigEndian.Uint64(sfx[:8]) < lower {
				break
			}
			if n++; n > f.Limit {
				return nil, false, nil
			}
			suffixes = append(suffixes, sfx)
		}
	}
	slices.SortFunc(suffixes, func(a, b [16]byte) int { return bytes.Compare(b[:], a[:]) })
	suffixes = slices.Compact(suffixes)
	for _, sfx := range suffixes {
		if len(out) >= f.Limit {
			break
		}
		evt, err := kvLoad(txn, binary.BigEndian.Uint64(sfx[8:]))
		if err != nil {
			return nil, false, err
		}
		if evt != nil && f.Matches(evt) {
			out = append(out, evt)
		}
	}
	return out, true, nil
}

// kvMerge merges the prefixes through a heap of iterators, newest first,
// and stops at f.Limit matches.
func kvMerge(ctx context.Context, txn *dgbadger.Txn, f nostr.Filter, prefixes [][]byte, upper []byte, lower uint64) ([]*nostr.Event, error) {
	h := make(kvCursors, 0, len(prefixes))
	defer func() {
		for _, c := range h {
			c.it.Close()
		}
	}()
	for _, p := range prefixes {
		c := &kvCursor{it: txn.NewIterator(dgbadger.IteratorOptions{Prefix: p, Reverse: true}), prefix: p}
		c.it.Seek(append(slices.Clip(p), upper...))
		if !c.it.ValidForPrefix(p) {
			c.it.Close()
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
			c.it.Close()
			heap.Pop(&h)
			continue
		}
		if c.it.Next(); c.it.ValidForPrefix(c.prefix) {
			heap.Fix(&h, 0)
		} else {
			c.it.Close()
			heap.Pop(&h)
		}
		if _, dup := seen[serial]; dup {
			continue
		}
		seen[serial] = struct{}{}
		evt, err := kvLoad(txn, serial)
		if err != nil {
			return nil, err
		}
		if evt != nil && f.Matches(evt) {
			out = append(out, evt)
		}
	}
	return out, nil
}
