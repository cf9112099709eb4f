package store

import (
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"
)

// BenchmarkItemCheck measures kvItemCheck.match on a stored patch the size
// of the e2e world's (a 300-byte diff as content): with a tag condition
// (the local set of a repository's part: kind and #a) and without one (ids
// and kinds only).
//
//	go test -run '^$' -bench BenchmarkItemCheck -count 5 ./store/
func BenchmarkItemCheck(b *testing.B) {
	coord := "30617:" + strings.Repeat("ab", 32) + ":repo"
	evt := &nostr.Event{
		ID: strings.Repeat("01", 32), PubKey: strings.Repeat("ab", 32), CreatedAt: 1_700_000_000, Kind: 1617,
		Tags: nostr.Tags{{"a", coord}, {"r", strings.Repeat("cd", 20)}, {"t", "root"}, {"alt", "git patch"}},
		Content: "From 0123456789abcdef Mon Sep 17 00:00:00 2001\nFrom: someone <someone@example.invalid>\nSubject: [PATCH] a change\n\n---\n README.md | 1 +\n\n" +
			"diff --git a/README.md b/README.md\n--- a/README.md\n+++ b/README.md\n@@ -1 +1,2 @@\n # test\n+a change with \"quotes\" and {braces}\n",
		Sig: strings.Repeat("ef", 64),
	}
	raw, err := evt.MarshalJSON()
	if err != nil {
		b.Fatal(err)
	}
	for _, q := range []struct {
		name string
		f    nostr.Filter
	}{
		{"tag", nostr.Filter{Kinds: []int{1617, 1621}, Tags: nostr.TagMap{"a": {coord}}}},
		{"no_tag", nostr.Filter{Kinds: []int{1617}}},
	} {
		b.Run(q.name, func(b *testing.B) {
			c := newKVItemCheck(q.f)
			for b.Loop() {
				if _, ok, err := c.match(raw); err != nil || !ok {
					b.Fatalf("match: %v, %v", ok, err)
				}
			}
		})
	}
}
