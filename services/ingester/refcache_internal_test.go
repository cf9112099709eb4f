package ingester

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
)

// TestRefCache: the memory of stored events keeps regular events without
// an expiration only, forgets what a deletion names (only that), keeps
// nothing written before an invalidation, expires entries, stays bounded,
// and says nothing while disabled.
func TestRefCache(t *testing.T) {
	now := time.Now()
	id := func(n int) string { return fmt.Sprintf("ab%062x", n) }
	ev := func(n, kind int, tags ...nostr.Tag) *nostr.Event {
		return &nostr.Event{ID: id(n), Kind: kind, Tags: nostr.Tags(tags)}
	}
	c := newRefCache()
	has := func(n int) bool { _, ok := c.kind(id(n), now); return ok }

	c.put([]*nostr.Event{ev(1, 1621)}, c.generation(), now)
	if has(1) {
		t.Fatal("a disabled cache keeps entries")
	}
	c.reset(true)
	c.put([]*nostr.Event{
		ev(1, 1621), ev(2, 1111), ev(3, nip34.KindDeletion),
		ev(4, nip34.KindRepoAnnouncement, nostr.Tag{"d", "r"}), // addressable: replaced without notice
		ev(5, 0),     // replaceable
		ev(6, 20001), // ephemeral
		ev(7, 1111, nostr.Tag{"expiration", "1"}), // removed on expiry without notice
		{ID: strings.ToUpper(id(8)), Kind: 1},     // not an id the policy looks up
	}, c.generation(), now)
	for n, want := range map[int]bool{1: true, 2: true, 3: true, 4: false, 5: false, 6: false, 7: false, 8: false} {
		if has(n) != want {
			t.Errorf("event %d kept %v, want %v", n, has(n), want)
		}
	}
	if k, _ := c.kind(id(2), now); k != 1111 {
		t.Fatalf("kind %d, want 1111", k)
	}
	if _, ok := c.kind(strings.ToUpper(id(1)), now); ok {
		t.Fatal("an upper-case id was found")
	}

	// A deletion forgets the ids it names, and only those.
	c.stored(ev(9, nip34.KindDeletion, nostr.Tag{"e", id(1)}, nostr.Tag{"a", "1:x:y"}))
	if has(1) || !has(2) {
		t.Fatalf("after a deletion of 1: 1 kept %v (want false), 2 kept %v (want true)", has(1), has(2))
	}
	// Other kinds change nothing.
	gen := c.generation()
	c.stored(ev(10, 1621))
	if c.generation() != gen || !has(2) {
		t.Fatal("a stored issue invalidated the cache")
	}
	// A write that began before an invalidation is not remembered.
	c.stored(ev(11, nip34.KindDeletion, nostr.Tag{"e", id(12)}))
	c.put([]*nostr.Event{ev(12, 1621)}, gen, now)
	if has(12) {
		t.Fatal("an event written before a deletion noticed after it was remembered")
	}
	// Entries expire.
	if _, ok := c.kind(id(2), now.Add(refCacheTTL)); ok {
		t.Fatal("an entry outlived its TTL")
	}
	// Bounded: the older half is dropped when the newer fills.
	for n := range refCacheMax + 10 {
		c.put([]*nostr.Event{ev(1000+n, 1)}, c.generation(), now)
	}
	if got := len(c.cur) + len(c.old); got > refCacheMax {
		t.Fatalf("%d entries, want at most %d", got, refCacheMax)
	}
	if !has(1000+refCacheMax+9) || has(1000) {
		t.Fatal("the newest entry was dropped or the oldest kept")
	}
	c.clearAll()
	if has(1000 + refCacheMax + 9) {
		t.Fatal("clearAll left entries")
	}
}
