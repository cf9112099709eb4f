package ingester

import (
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
)

// TestAnnCacheInvalidation: a stored announcement drops the entries of its
// identifier (only those), a deletion drops every entry, an answer read
// before an invalidation is not kept after it, and entries expire.
func TestAnnCacheInvalidation(t *testing.T) {
	now := time.Now()
	c := newAnnCache()
	c.reset(true)
	byD := func(d string) (string, nostr.Filter) {
		f := nostr.Filter{Kinds: []int{nip34.KindRepoAnnouncement}, Tags: nostr.TagMap{"d": {d}}, Limit: 10}
		return filterKey(f), f
	}
	ann := &nostr.Event{Kind: nip34.KindRepoAnnouncement, Tags: nostr.Tags{{"d", "r"}}}
	fill := func() {
		for _, d := range []string{"r", "s"} {
			key, f := byD(d)
			_, gen, _ := c.get(key, now)
			c.put(key, f, []*nostr.Event{ann}, gen, now)
		}
	}
	has := func(d string) bool {
		key, _ := byD(d)
		_, _, ok := c.get(key, now)
		return ok
	}
	fill()
	if !has("r") || !has("s") {
		t.Fatal("answers not cached")
	}
	c.stored(ann)
	if has("r") || !has("s") {
		t.Fatalf("after an announcement of r: r cached %v (want false), s cached %v (want true)", has("r"), has("s"))
	}
	fill()
	c.stored(&nostr.Event{Kind: nip34.KindDeletion})
	if has("r") || has("s") {
		t.Fatal("a deletion left entries")
	}
	// A read that began before an invalidation is not kept.
	key, f := byD("r")
	_, gen, _ := c.get(key, now)
	c.stored(ann)
	c.put(key, f, []*nostr.Event{ann}, gen, now)
	if has("r") {
		t.Fatal("an answer read before the invalidation was cached after it")
	}
	fill()
	if _, _, ok := c.get(key, now.Add(annCacheTTL)); ok {
		t.Fatal("an entry outlived its TTL")
	}
	c.reset(false)
	fill()
	if has("r") {
		t.Fatal("a disabled cache keeps answers")
	}
	for _, f := range []nostr.Filter{
		{Kinds: []int{nip34.KindRepoAnnouncement, nip34.KindRepoState}, Tags: nostr.TagMap{"d": {"r"}}},
		{Kinds: []int{nip34.KindRepoAnnouncement}, Tags: nostr.TagMap{"d": {""}}},
		{Kinds: []int{nip34.KindRepoAnnouncement}, Authors: []string{"x"}},
		{IDs: []string{"x"}, Kinds: []int{nip34.KindRepoAnnouncement}, Tags: nostr.TagMap{"d": {"r"}}},
	} {
		if cacheable(f) {
			t.Errorf("%s is cacheable: only announcements by non-empty identifier are", f)
		}
	}
}
