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
			e := &nostr.Event{Kind: 1, CreatedAt: nostr.Timestamp(1000 + 10*batch + n), Content: fmt.Sprint(batch, n)}
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
	}
	for deadline := time.Now().Add(10 * time.Second); k.growing.Load(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the filter rebuild did not finish")
		}
	}
	if c := k.ids.Load().capacity; c < int64(len(all)) {
		t.Fatalf("filter capacity %d after %d writes: never grew", c, len(all))
	}
	for n, r := range k.insertBatch(ctx, all) {
		if r.Stored || r.Err != nil {
			t.Fatalf("second write of event %d: %+v, want a duplicate", n, r)
		}
	}
}
