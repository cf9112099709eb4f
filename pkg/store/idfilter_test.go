package store

import (
	"context"
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"
)

func randomID() []byte {
	id := make([]byte, 32)
	_, _ = rand.Read(id)
	return id
}

// TestIDFilter: every id added is "maybe"; of ids never added, about as many
// are "maybe" as the filter's size promises.
func TestIDFilter(t *testing.T) {
	for _, capacity := range []int64{64, 1000, 100_000} {
		t.Run(fmt.Sprint(capacity), func(t *testing.T) {
			f := newIDFilter(capacity)
			for range capacity {
				id := randomID()
				f.add(id)
				if !f.mayHave(id) {
					t.Fatal("an added id is not in the filter")
				}
			}
			if f.full() {
				t.Fatal("full at capacity")
			}
			falsePositives, tries := 0, 100_000
			for range tries {
				if f.mayHave(randomID()) {
					falsePositives++
				}
			}
			if rate := float64(falsePositives) / float64(tries); rate > 0.03 {
				t.Fatalf("false positive rate %.3f at capacity, want about 0.01", rate)
			}
			f.add(randomID())
			if !f.full() {
				t.Fatal("not full past capacity")
			}
		})
	}
}

// TestKVIDFilterGrows writes past a tiny id filter's capacity while reading:
// the filter is replaced by bigger ones, and no stored id is ever missed —
// not by a lookup, not by the duplicate check of a second write.
func TestKVIDFilterGrows(t *testing.T) {
	for _, engine := range kvEngines {
		t.Run(engine, func(t *testing.T) { testKVIDFilterGrows(t, engine) })
	}
}

func testKVIDFilterGrows(t *testing.T, engine string) {
	defer func(c int64) { kvIDCapacity = c }(kvIDCapacity)
	kvIDCapacity = 16
	k, err := openKV(t.TempDir(), engine, options{})
	if err != nil {
		t.Fatal(err)
	}
	defer k.close()
	ctx := context.Background()
	sk := nostr.GeneratePrivateKey()
	var all []*nostr.Event
	for batch := range 40 {
		var evts []*nostr.Event
		for n := range 10 {
			e := &nostr.Event{Kind: 1, CreatedAt: nostr.Timestamp(1000 + 10*batch + n), Content: fmt.Sprint(batch, n),
				Tags: nostr.Tags{{"t", fmt.Sprint("topic-", batch, "-", n)}}}
			if err := e.Sign(sk); err != nil {
				t.Fatal(err)
			}
			evts = append(evts, e)
		}
		for _, r := range k.insertBatch(ctx, evts) {
			if !r.Stored || r.Err != nil {
				t.Fatalf("save: %+v", r)
			}
		}
		all = append(all, evts...)
		// Every id written so far is found, rebuild or not.
		var ids []string
		for _, e := range all {
			ids = append(ids, e.ID)
		}
		got, err := k.query(ctx, nostr.Filter{IDs: ids, Limit: len(ids)})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(all) {
			t.Fatalf("after batch %d: found %d of %d stored ids", batch, len(got), len(all))
		}
		// And every tag value, whichever tag filter answers.
		var topics []string
		for _, e := range all {
			topics = append(topics, e.Tags[0][1])
		}
		got, err = k.query(ctx, nostr.Filter{Tags: nostr.TagMap{"t": topics}, Limit: len(topics)})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(all) {
			t.Fatalf("after batch %d: found %d of %d stored tag values", batch, len(got), len(all))
		}
	}
	for deadline := time.Now().Add(10 * time.Second); k.ids.growing.Load() || k.tags.growing.Load(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the filter rebuild did not finish")
		}
	}
	if c := k.ids.load().capacity; c < int64(len(all)) {
		t.Fatalf("id filter capacity %d after %d writes: never grew", c, len(all))
	}
	if c := k.tags.load().capacity; c < int64(len(all)) {
		t.Fatalf("tag filter capacity %d after %d writes: never grew", c, len(all))
	}
	for n, r := range k.insertBatch(ctx, all) {
		if r.Stored || r.Err != nil {
			t.Fatalf("second write of event %d: %+v, want a duplicate", n, r)
		}
	}
}

// TestTagFilter: tag prefixes spread over the filter as ids do (tagWords
// takes four words from one 64-bit hash): ~1 % of prefixes never added are
// "maybe" at capacity, every added one is.
func TestTagFilter(t *testing.T) {
	const capacity = 100_000
	f := newIDFilter(capacity)
	for n := range capacity {
		p := kvTagPrefix('e', fmt.Sprint("value-", n))
		f.addWords(tagWords(p))
		if !f.mayHaveWords(tagWords(p)) {
			t.Fatal("an added prefix is not in the filter")
		}
	}
	falsePositives, tries := 0, 100_000
	for n := range tries {
		if f.mayHaveWords(tagWords(kvTagPrefix('e', fmt.Sprint("other-", n)))) {
			falsePositives++
		}
	}
	if rate := float64(falsePositives) / float64(tries); rate > 0.03 {
		t.Fatalf("false positive rate %.3f at capacity, want about 0.01", rate)
	}
	// The letter counts: the same value under another letter is another prefix.
	if f.mayHaveWords(tagWords(kvTagPrefix('a', "value-1"))) && f.mayHaveWords(tagWords(kvTagPrefix('q', "value-1"))) {
		t.Fatal("value-1 under #a and #q are both in a filter that has it under #e only")
	}
}

// TestKVTagFilterSkipsAbsentValues: a query's prefixes leave out the tag
// values nothing was stored under, and keep those stored, on every engine;
// after the store is opened again the filter is rebuilt from the stored
// keys, so nothing stored is skipped then either. (Format v2's keys and a
// v2 directory read after the upgrade are queried through the filter by
// TestKVTagKeysFoldCases and TestKVOpensV2Directory.)
func TestKVTagFilterSkipsAbsentValues(t *testing.T) {
	for _, engine := range kvEngines {
		t.Run(engine, func(t *testing.T) {
			dir := t.TempDir()
			k, err := openKV(dir, engine, options{})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			sk := nostr.GeneratePrivateKey()
			var evts []*nostr.Event
			for n := range 3 {
				e := &nostr.Event{Kind: 1111, CreatedAt: nostr.Timestamp(1000 + n), Tags: nostr.Tags{{"E", fmt.Sprint("root-", n)}}}
				if err := e.Sign(sk); err != nil {
					t.Fatal(err)
				}
				evts = append(evts, e)
			}
			saveAll(t, k, evts)
			asked := nostr.Filter{Tags: nostr.TagMap{"E": {"root-0", "root-2", "never-1", "never-2"}}}
			check := func(k *kv) {
				t.Helper()
				if got := kvPrefixes(asked, nil, k.layout()); len(got) != 2 {
					t.Fatalf("%d prefixes for 2 stored values and 2 never stored, want 2", len(got))
				}
				if got := kvPrefixes(asked, nil, kvLayout{}); len(got) != 4 {
					t.Fatalf("%d prefixes without a tag filter, want all 4", len(got))
				}
				asked.Limit = 10
				got, err := k.query(ctx, asked)
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != 2 {
					t.Fatalf("query found %d events, want the 2 under root-0 and root-2", len(got))
				}
			}
			check(k)
			k.close()
			if k, err = openKV(dir, engine, options{}); err != nil {
				t.Fatal(err)
			}
			defer k.close()
			check(k)
		})
	}
}
