package store

import (
	"errors"
	"fmt"
	"os"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// kvEngine is the ordered key-value database under the kv layout: badger
// (the first engine, kv_badger.go) or pebble (kv_pebble.go). The layout, its
// keys, queries and id filter are the same on both (kv.go); an engine only
// stores bytes. Every write of the layout holds a stripe lock, so no engine
// needs conflict detection.
type kvEngine interface {
	// name is the engine's name as the store URL gives it: "badger" or
	// "pebble".
	name() string
	// get calls fn with key's value (valid only during the call); found is
	// false when the key is absent.
	get(key []byte, fn func(v []byte) error) (found bool, err error)
	// view runs fn with a reader that stays consistent for fn's duration
	// as far as the engine offers it (badger: a snapshot; pebble: each
	// iterator is a point in time, point reads see the latest).
	view(fn func(r kvReader) error) error
	// scanKeys calls fn with every key that starts with prefix, in
	// ascending order, until fn returns false. key is valid only during the
	// call.
	scanKeys(prefix []byte, fn func(key []byte) bool) error
	// newWrite begins a write: a batch committed whole or not at all.
	newWrite() kvWrite
	// nextSerial is a new serial, larger than every serial handed out
	// before, also across reopen.
	nextSerial() (uint64, error)
	// txnBytes is about how much one write should carry.
	txnBytes() int
	close() error
}

// kvReader reads for one query.
type kvReader interface {
	get(key []byte, fn func(v []byte) error) (found bool, err error)
	// iter walks the keys with prefix from the newest (largest) back.
	iter(prefix []byte) (kvIter, error)
}

// kvIter is a reverse iterator over one prefix.
type kvIter interface {
	// seek moves to the largest key ≤ key within the prefix.
	seek(key []byte)
	// validFor reports whether the iterator is on a key starting with p
	// (p at least the iterator's prefix).
	validFor(p []byte) bool
	// key is the current key, valid until the next move.
	key() []byte
	// next moves to the next smaller key.
	next()
	// close releases the iterator and returns the error that ended its
	// walk early, if one did.
	close() error
}

// kvWrite is one batch of writes.
type kvWrite interface {
	// get reads committed data (not this batch's own writes).
	get(key []byte, fn func(v []byte) error) (found bool, err error)
	set(key, value []byte) error
	delete(key []byte) error
	// commit applies the batch; errKVTooBig means it must be split.
	commit() error
	// discard drops an uncommitted batch; a no-op after commit.
	discard()
}

// errKVTooBig is an engine's "this write is too big for one batch".
var errKVTooBig = errors.New("write too big for one batch")

// The kv engines. A store URL names one as "kv+badger://DIR" or
// "kv+pebble://DIR"; "kv://DIR" and a plain directory take the engine the
// directory already holds, and kvDefaultEngine for a new one.
const (
	kvBadger = "badger"
	kvPebble = "pebble"
	// kvDefaultEngine is what a new directory gets (docs/decisions/0036-kv-on-pebble.md).
	kvDefaultEngine = kvPebble
)

// kvDetect tells which engine wrote the database in dir: kvBadger, kvPebble,
// or "" when dir holds neither (absent, empty, or other files only). Both
// at once is an error: one of them would be silently ignored.
func kvDetect(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	var isBadger bool
	for _, e := range entries {
		// badger's manifest is exactly "MANIFEST" (pebble's are
		// "MANIFEST-000001" and so on) and it always writes KEYREGISTRY.
		if n := e.Name(); n == "MANIFEST" || n == "KEYREGISTRY" {
			isBadger = true
		}
	}
	desc, err := pebble.Peek(dir, vfs.Default)
	if err != nil {
		return "", fmt.Errorf("look for a pebble database: %w", err)
	}
	switch {
	case isBadger && desc.Exists:
		return "", errors.New("the directory holds both a badger and a pebble database; move one of them out")
	case isBadger:
		return kvBadger, nil
	case desc.Exists:
		return kvPebble, nil
	}
	return "", nil
}

// kvOpenEngine opens the engine of dir: want ("" for whichever the
// directory holds, kvDefaultEngine when it holds none). A directory that
// holds the other engine's database is refused, never opened beside it.
func kvOpenEngine(dir, want string, o options) (kvEngine, error) {
	found, err := kvDetect(dir)
	if err != nil {
		return nil, err
	}
	switch {
	case want == "" && found == "":
		want = kvDefaultEngine
	case want == "":
		want = found
	case found != "" && found != want:
		return nil, fmt.Errorf("the directory holds a %s database, not %s: open it as kv+%s://%s or kv://%s", found, want, found, dir, dir)
	}
	switch want {
	case kvBadger:
		return openKVBadger(dir, o)
	case kvPebble:
		return openKVPebble(dir, o)
	}
	return nil, fmt.Errorf("unknown kv engine %q", want)
}
