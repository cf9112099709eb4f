package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"

	dgbadger "github.com/dgraph-io/badger/v4"
	"github.com/nbd-wtf/go-nostr"
)

// kvEvents saves events of three kinds from two authors, oldest first, and
// returns them.
func kvEvents(t *testing.T, k *kv) (evts []*nostr.Event, authors []string) {
	t.Helper()
	keys := []string{nostr.GeneratePrivateKey(), nostr.GeneratePrivateKey()}
	for n := range 30 {
		e := &nostr.Event{Kind: []int{1, 7, 1621}[n%3], CreatedAt: nostr.Timestamp(1000 + n), Content: fmt.Sprint("event ", n)}
		if err := e.Sign(keys[n%2]); err != nil {
			t.Fatal(err)
		}
		evts = append(evts, e)
	}
	for _, r := range k.insertBatch(context.Background(), evts) {
		if !r.Stored || r.Err != nil {
			t.Fatalf("save: %+v", r)
		}
	}
	for _, sk := range keys {
		pk, _ := nostr.GetPublicKey(sk)
		authors = append(authors, pk)
	}
	return evts, authors
}

// checkUnindexedLookups checks the two lookups kv answers from every stored
// kind: by author alone and by time alone.
func checkUnindexedLookups(t *testing.T, k *kv, evts []*nostr.Event, author string) {
	t.Helper()
	ids := func(evts []*nostr.Event) []string {
		var out []string
		for _, e := range evts {
			out = append(out, e.ID)
		}
		return out
	}
	var newest, byAuthor []*nostr.Event
	for _, e := range slices.Backward(evts) {
		newest = append(newest, e)
		if e.PubKey == author {
			byAuthor = append(byAuthor, e)
		}
	}
	got, err := k.query(context.Background(), nostr.Filter{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids(got), ids(newest[:10])) {
		t.Errorf("newest 10: got %d events %v, want %v", len(got), ids(got), ids(newest[:10]))
	}
	got, err = k.query(context.Background(), nostr.Filter{Authors: []string{author}, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids(got), ids(byAuthor)) {
		t.Errorf("by author: got %d events, want %d", len(got), len(byAuthor))
	}
}

// kvEngines is every engine the kv layout runs on; the kv tests run on each.
var kvEngines = []string{kvPebble, kvBadger}

func TestKVKindsSurviveReopen(t *testing.T) {
	for _, engine := range kvEngines {
		t.Run(engine, func(t *testing.T) {
			dir := t.TempDir()
			k, err := openKV(dir, engine, options{})
			if err != nil {
				t.Fatal(err)
			}
			evts, authors := kvEvents(t, k)
			checkUnindexedLookups(t, k, evts, authors[0])
			if err := k.close(); err != nil {
				t.Fatal(err)
			}
			// Reopened without naming the engine: the directory's own.
			if k, err = openKV(dir, "", options{}); err != nil {
				t.Fatal(err)
			}
			defer k.close()
			if k.eng.name() != engine {
				t.Fatalf("reopened on %s, written on %s", k.eng.name(), engine)
			}
			if got := k.kinds.all(); !slices.Equal(got, []int{1, 7, 1621}) {
				t.Fatalf("kinds after reopen = %v", got)
			}
			checkUnindexedLookups(t, k, evts, authors[1])
			// Serials keep increasing across the reopen: a new event is
			// the newest of its second.
			e := &nostr.Event{Kind: 1, CreatedAt: evts[len(evts)-1].CreatedAt, Content: "after reopen"}
			if err := e.Sign(nostr.GeneratePrivateKey()); err != nil {
				t.Fatal(err)
			}
			if r := k.insertBatch(context.Background(), []*nostr.Event{e}); !r[0].Stored {
				t.Fatalf("save after reopen: %+v", r[0])
			}
			got, err := k.query(context.Background(), nostr.Filter{Limit: 1})
			if err != nil || len(got) != 1 || got[0].ID != e.ID {
				t.Fatalf("newest after reopen: %v, %v; want the event written last", got, err)
			}
		})
	}
}

// TestKVUpgradesV1 turns a store into format v1 (the time and author
// indexes present, no N keys) and opens it again: the v1 indexes are gone,
// the kinds are recorded, and the lookups they served still answer.
func TestKVUpgradesV1(t *testing.T) {
	dir := t.TempDir()
	k, err := openKV(dir, kvBadger, options{})
	if err != nil {
		t.Fatal(err)
	}
	evts, authors := kvEvents(t, k)
	db := k.eng.(*kvBadgerDB).db
	err = db.Update(func(txn *dgbadger.Txn) error {
		for _, e := range evts {
			id, _ := decode32(e.ID)
			pk, _ := decode32(e.PubKey)
			serial, _, err := kvLookup(kvBadgerReader{txn}, id)
			if err != nil {
				return err
			}
			suffix := binary.BigEndian.AppendUint64(nil, flip(int64(e.CreatedAt)))
			suffix = binary.BigEndian.AppendUint64(suffix, serial)
			if err := txn.Set(append([]byte{kvV1Time}, suffix...), nil); err != nil {
				return err
			}
			if err := txn.Set(append(append([]byte{kvV1Author}, pk...), suffix...), nil); err != nil {
				return err
			}
		}
		return txn.Set(kvFormatKey, kvFormatV1)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.DropPrefix([]byte{kvKnownKind}); err != nil {
		t.Fatal(err)
	}
	if err := k.close(); err != nil {
		t.Fatal(err)
	}

	if k, err = openKV(dir, "", options{}); err != nil {
		t.Fatal(err)
	}
	defer k.close()
	count := func(prefix byte) (n int) {
		_ = k.eng.(*kvBadgerDB).db.View(func(txn *dgbadger.Txn) error {
			it := txn.NewIterator(dgbadger.IteratorOptions{Prefix: []byte{prefix}})
			defer it.Close()
			for it.Rewind(); it.Valid(); it.Next() {
				n++
			}
			return nil
		})
		return n
	}
	if a, c, n := count(kvV1Author), count(kvV1Time), count(kvKnownKind); a != 0 || c != 0 || n != 3 {
		t.Fatalf("after the upgrade: %d author keys, %d time keys, %d kinds; want 0, 0, 3", a, c, n)
	}
	format, err := kvCheckFormat(k.eng, kvFormat)
	if err != nil || string(format) != string(kvFormat) {
		t.Fatalf("format %q, %v", format, err)
	}
	checkUnindexedLookups(t, k, evts, authors[0])
}
