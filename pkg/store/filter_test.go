package store

import (
	"fmt"
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"
)

func TestSupersedes(t *testing.T) {
	ev := func(ts nostr.Timestamp, id string) *nostr.Event { return &nostr.Event{CreatedAt: ts, ID: id} }
	for _, c := range []struct {
		name       string
		next, prev *nostr.Event
		want       bool
	}{
		{"newer", ev(2, "bb"), ev(1, "aa"), true},
		{"older", ev(1, "aa"), ev(2, "bb"), false},
		{"same second, lower id", ev(5, "aa"), ev(5, "bb"), true},
		{"same second, higher id", ev(5, "bb"), ev(5, "aa"), false},
		{"itself", ev(5, "aa"), ev(5, "aa"), false},
	} {
		if got := Supersedes(c.next, c.prev); got != c.want {
			t.Errorf("%s: Supersedes = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestReplaceKey(t *testing.T) {
	for _, c := range []struct {
		kind int
		tags nostr.Tags
		want string
	}{
		{1, nostr.Tags{{"d", "x"}}, ""},
		{0, nil, "0:pk:"},
		{10317, nostr.Tags{{"d", "ignored"}}, "10317:pk:"},
		{30617, nostr.Tags{{"d", "repo"}}, "30617:pk:repo"},
		{30617, nil, "30617:pk:"},
		{39999, nostr.Tags{{"x", "y"}, {"d", "a:b"}}, "39999:pk:a:b"},
		{40000, nostr.Tags{{"d", "x"}}, ""},
	} {
		if got := ReplaceKey(&nostr.Event{Kind: c.kind, PubKey: "pk", Tags: c.tags}); got != c.want {
			t.Errorf("kind %d %v: key %q, want %q", c.kind, c.tags, got, c.want)
		}
	}
}

func vals(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

func TestSplitFilter(t *testing.T) {
	sqlite := queryLimits{IDs: 500, Authors: 500, Kinds: 10, TagValues: 10}
	for _, c := range []struct {
		name      string
		f         nostr.Filter
		lim       queryLimits
		wantParts int
		wantErr   bool
	}{
		{"fits", nostr.Filter{IDs: vals("i", 500)}, sqlite, 1, false},
		{"ids over the limit", nostr.Filter{IDs: vals("i", 1201)}, sqlite, 3, false},
		{"unlimited backend", nostr.Filter{IDs: vals("i", 5000), Kinds: []int{1, 2, 3}}, queryLimits{}, 1, false},
		{"ids and kinds multiply", nostr.Filter{IDs: vals("i", 1000), Kinds: vals2ints(25)}, sqlite, 2 * 3, false},
		{"tag values share the limit across keys", nostr.Filter{Tags: nostr.TagMap{"e": vals("e", 12), "a": vals("a", 3)}}, sqlite, 3, false},
		{"one tag key", nostr.Filter{Tags: nostr.TagMap{"e": vals("e", 25)}}, sqlite, 3, false},
		{"fan-out bounded", nostr.Filter{IDs: vals("i", 5000), Authors: vals("p", 5000), Kinds: vals2ints(500)}, queryLimits{IDs: 10, Authors: 10, Kinds: 1}, 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			parts, err := splitFilter(c.f, c.lim)
			if (err != nil) != c.wantErr {
				t.Fatalf("err = %v, want error %v", err, c.wantErr)
			}
			if c.wantErr {
				return
			}
			if len(parts) != c.wantParts {
				t.Fatalf("parts = %d, want %d", len(parts), c.wantParts)
			}
			// Every part fits, and together they cover each value once
			// per combination of the other fields.
			ids, kinds := map[string]int{}, map[int]int{}
			for _, p := range parts {
				if c.lim.IDs > 0 && len(p.IDs) > c.lim.IDs || c.lim.Kinds > 0 && len(p.Kinds) > c.lim.Kinds {
					t.Fatalf("part over the limits: %d ids, %d kinds", len(p.IDs), len(p.Kinds))
				}
				tv := 0
				for _, v := range p.Tags {
					tv += len(v)
				}
				if c.lim.TagValues > 0 && tv > c.lim.TagValues {
					t.Fatalf("part has %d tag values, limit %d", tv, c.lim.TagValues)
				}
				for _, id := range p.IDs {
					ids[id]++
				}
				for _, k := range p.Kinds {
					kinds[k]++
				}
			}
			if len(ids) != len(c.f.IDs) || len(kinds) != len(c.f.Kinds) {
				t.Fatalf("parts cover %d ids and %d kinds, want %d and %d", len(ids), len(kinds), len(c.f.IDs), len(c.f.Kinds))
			}
		})
	}
}

func vals2ints(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func TestMergeResults(t *testing.T) {
	ev := func(ts nostr.Timestamp, id string) *nostr.Event { return &nostr.Event{CreatedAt: ts, ID: id} }
	got := mergeResults([][]*nostr.Event{
		{ev(3, "c"), ev(1, "a")},
		{ev(3, "b"), ev(3, "c"), ev(2, "d")},
	}, 3)
	var order []string
	for _, e := range got {
		order = append(order, e.ID)
	}
	if strings.Join(order, ",") != "b,c,d" {
		t.Fatalf("merged = %v, want b,c,d (newest first, ties by id, deduplicated, limited)", order)
	}
}

func TestTagIndexValue(t *testing.T) {
	long := strings.Repeat("x", maxIndexedTagValue+1)
	for _, c := range []struct {
		name, key, value string
		hashed           bool
	}{
		{"short", "e", "abc", false},
		{"at the limit", "d", strings.Repeat("x", maxIndexedTagValue), false},
		{"long", "a", long, true},
		{"NUL", "t", "a\x00b", true},
		{"invalid UTF-8", "t", "\xff\xfe", true},
	} {
		got := tagIndexValue(c.key, c.value)
		if c.hashed != strings.HasPrefix(got, c.key+"#") || (!c.hashed && got != c.key+":"+c.value) {
			t.Errorf("%s: index value %q", c.name, got)
		}
		if len(got) > maxIndexedTagValue+2 {
			t.Errorf("%s: index value of %d bytes", c.name, len(got))
		}
	}
	if tagIndexValue("e", "v") == tagIndexValue("p", "v") {
		t.Error("tag keys not distinguished")
	}
	entries := tagIndexValues(nostr.Tags{{"e", "x"}, {"e", "x"}, {"p", "y"}, {"clone", "z"}, {"t"}, {"alt", "w"}})
	if strings.Join(entries, ",") != "e:x,p:y" {
		t.Errorf("entries = %v, want e:x,p:y (single-letter keys with a value, once each)", entries)
	}
}

func TestRedact(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"postgres://grasp:secret@db:5432/grasp?sslmode=disable", "postgres://grasp:xxxxx@db:5432/grasp?sslmode=disable"},
		{"postgres://grasp@db/grasp?password=secret", "postgres://grasp@db/grasp?password=xxxxx"},
		{"postgres://db/grasp", "postgres://db/grasp"},
		{"/var/lib/grasp", "/var/lib/grasp"},
	} {
		if got := Redact(c.in); got != c.want {
			t.Errorf("Redact(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
