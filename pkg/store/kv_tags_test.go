package store

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/nbd-wtf/go-nostr"
)

// tagEvents are events whose tags exercise both cases of letters: NIP-22
// comments (E/e, K/k, P/p equal on top-level ones, different on replies),
// issues (a, p), an announcement (d, t, r) and a tag that is not a letter.
func tagEvents(t *testing.T, from int) []*nostr.Event {
	t.Helper()
	sk := nostr.GeneratePrivateKey()
	pk, _ := nostr.GetPublicKey(sk)
	root := fmt.Sprintf("%064x", 1)
	coord := "30617:" + pk + ":repo"
	var evts []*nostr.Event
	for n := range 24 {
		e := &nostr.Event{CreatedAt: nostr.Timestamp(1000 + from + n), Content: fmt.Sprint("event ", from+n)}
		switch n % 4 {
		case 0: // top-level comment on the root issue
			e.Kind = 1111
			e.Tags = nostr.Tags{{"E", root}, {"e", root}, {"K", "1621"}, {"k", "1621"}, {"P", pk}, {"p", pk}, {"A", coord}}
		case 1: // reply to a comment
			parent := fmt.Sprintf("%064x", 100+n)
			e.Kind = 1111
			e.Tags = nostr.Tags{{"E", root}, {"e", parent}, {"K", "1621"}, {"k", "1111"}, {"P", pk}, {"p", pk}}
		case 2: // issue
			e.Kind = 1621
			e.Tags = nostr.Tags{{"a", coord}, {"p", pk}, {"t", "bug"}, {"1", "one"}}
		case 3: // status naming the root in the lowercase letter only
			e.Kind = 1630
			e.Tags = nostr.Tags{{"e", root, "", "root"}, {"a", coord}, {"E", fmt.Sprintf("%064x", 7)}}
		}
		if err := e.Sign(sk); err != nil {
			t.Fatal(err)
		}
		evts = append(evts, e)
	}
	return evts
}

// tagFilters are queries by every letter and case the events carry.
func tagFilters(evts []*nostr.Event) []nostr.Filter {
	root := fmt.Sprintf("%064x", 1)
	pk := evts[0].PubKey
	coord := "30617:" + pk + ":repo"
	var fs []nostr.Filter
	for _, tm := range []nostr.TagMap{
		{"e": {root}}, {"E": {root}}, {"E": {fmt.Sprintf("%064x", 7)}}, {"e": {fmt.Sprintf("%064x", 101)}},
		{"k": {"1621"}}, {"K": {"1621"}}, {"k": {"1111"}}, {"K": {"1111"}},
		{"p": {pk}}, {"P": {pk}}, {"a": {coord}}, {"A": {coord}}, {"t": {"bug"}}, {"T": {"bug"}}, {"1": {"one"}},
		{"e": {root}, "k": {"1621"}}, {"E": {root, fmt.Sprintf("%064x", 7)}},
	} {
		fs = append(fs, nostr.Filter{Tags: tm, Limit: 1000}, nostr.Filter{Tags: tm, Kinds: []int{1111}, Limit: 3})
	}
	// Many values: answered by kvScanEach.
	var many []string
	for n := range 20 {
		many = append(many, fmt.Sprintf("%064x", 100+n))
	}
	fs = append(fs, nostr.Filter{Tags: nostr.TagMap{"e": append(many, root)}, Limit: 1000},
		nostr.Filter{Tags: nostr.TagMap{"E": append(many, root)}, Limit: 1000})
	return fs
}

// checkTagQueries compares every tag filter's answer with the events that
// match it, newest first, up to the limit.
func checkTagQueries(t *testing.T, k *kv, evts []*nostr.Event) {
	t.Helper()
	for _, f := range tagFilters(evts) {
		got, err := k.query(context.Background(), f)
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, e := range slices.SortedFunc(slices.Values(evts), func(a, b *nostr.Event) int { return int(b.CreatedAt - a.CreatedAt) }) {
			if f.Matches(e) && len(want) < f.Limit {
				want = append(want, e.ID)
			}
		}
		var ids []string
		for _, e := range got {
			ids = append(ids, e.ID)
		}
		if !slices.Equal(ids, want) {
			t.Errorf("%s: %d events, want %d", f, len(ids), len(want))
		}
	}
}

func saveAll(t *testing.T, k *kv, evts []*nostr.Event) {
	t.Helper()
	for _, r := range k.insertBatch(context.Background(), evts) {
		if r.Err != nil || !r.Stored {
			t.Fatal(r)
		}
	}
}

func countKeys(t *testing.T, k *kv, prefix byte) int {
	t.Helper()
	n := 0
	if err := k.eng.scanKeys([]byte{prefix}, func([]byte) bool { n++; return true }); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestKVTagKeysFoldCases: format v3 writes one tag key per distinct letter
// and value with both cases together, and answers queries by either case
// exactly.
func TestKVTagKeysFoldCases(t *testing.T) {
	for _, v2 := range []bool{true, false} {
		t.Run(fmt.Sprint("v2=", v2), func(t *testing.T) {
			k, err := openKV(t.TempDir(), kvPebble, options{kvTagsV2: v2})
			if err != nil {
				t.Fatal(err)
			}
			defer k.close()
			evts := tagEvents(t, 0)
			saveAll(t, k, evts)
			checkTagQueries(t, k, evts)
			// Per 4 events: top-level comment 7 tags (4 pairs in v3), reply 6 (3 pairs in v3... P/p
			// equal, E/e and K/k not), issue 4, status 3.
			want := 6 * (7 + 6 + 4 + 3)
			if !v2 {
				want = 6 * (4 + 5 + 4 + 3)
			}
			if got := countKeys(t, k, kvTag); got != want {
				t.Errorf("%d tag keys for %d events, want %d", got, len(evts), want)
			}
		})
	}
}

// TestKVOpensV2Directory: a directory written with format v2's tag keys
// (by the code before v3) is read correctly after the upgrade, next to
// events written with v3's keys, and deleting an event written either way
// leaves none of its tag keys behind.
func TestKVOpensV2Directory(t *testing.T) {
	dir := t.TempDir()
	k, err := openKV(dir, kvPebble, options{kvTagsV2: true})
	if err != nil {
		t.Fatal(err)
	}
	old := tagEvents(t, 0)
	saveAll(t, k, old)
	if err := k.close(); err != nil {
		t.Fatal(err)
	}

	if k, err = openKV(dir, "", options{}); err != nil {
		t.Fatal(err)
	}
	if !k.legacyTags {
		t.Fatal("a v2 directory is not marked as holding v2 tag keys")
	}
	format, err := kvCheckFormat(k.eng, nil)
	if err != nil || string(format) != string(kvFormat) {
		t.Fatalf("format %q, %v; want %q", format, err, kvFormat)
	}
	checkTagQueries(t, k, old)
	newer := tagEvents(t, 100)
	saveAll(t, k, newer)
	all := append(slices.Clone(old), newer...)
	checkTagQueries(t, k, all)
	if err := k.close(); err != nil {
		t.Fatal(err)
	}

	// The mark survives a reopen; the code that wrote v2 refuses the
	// directory now.
	if _, err := openKV(dir, "", options{kvTagsV2: true}); err == nil {
		t.Fatal("a v3 directory opened as v2")
	}
	if k, err = openKV(dir, "", options{}); err != nil {
		t.Fatal(err)
	}
	defer k.close()
	if !k.legacyTags {
		t.Fatal("the v2 mark is lost on reopen")
	}
	checkTagQueries(t, k, all)
	for _, e := range all {
		if err := k.delete(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []byte{kvTag, kvKind, kvAuthKind, kvRaw, kvID} {
		if n := countKeys(t, k, p); n != 0 {
			t.Errorf("%d %c keys left after deleting every event", n, p)
		}
	}
}
