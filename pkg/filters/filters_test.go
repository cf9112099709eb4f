package filters_test

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/grasp-sync/grasp-sync/pkg/filters"
	"github.com/nbd-wtf/go-nostr"
)

func ids(n int, prefix string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%04d", prefix, i)
	}
	return out
}

func TestLayers(t *testing.T) {
	tests := []struct {
		name        string
		got         []nostr.Filter
		wantFilters int
		wantTags    []string // tag names of the first filters, in order
	}{
		{"layer1 no repos", filters.Layer1(nil), 1, nil},
		{"layer1 150 repos", filters.Layer1(ids(150, "d")), 3, nil},
		{"layer2 empty", filters.Layer2(nil), 0, nil},
		{"layer2 100 refs", filters.Layer2(ids(100, "r")), 3, []string{"a", "A", "q"}},
		{"layer2 101 refs", filters.Layer2(ids(101, "r")), 6, []string{"a", "A", "q", "a"}},
		{"layer3 250 roots", filters.Layer3(ids(250, "e")), 9, []string{"e", "E", "q"}},
		{"layer3 duplicates collapse", filters.Layer3(append(ids(100, "e"), ids(100, "e")...)), 3, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if len(tt.got) != tt.wantFilters {
				t.Fatalf("%d filters, want %d", len(tt.got), tt.wantFilters)
			}
			for i, name := range tt.wantTags {
				if _, ok := tt.got[i].Tags[name]; !ok || len(tt.got[i].Kinds) != 0 {
					t.Errorf("filter %d = %v, want tag #%s and no kinds", i, tt.got[i], name)
				}
			}
			for _, f := range tt.got {
				for name, vals := range f.Tags {
					if len(vals) > filters.ChunkSize {
						t.Errorf("#%s has %d values", name, len(vals))
					}
				}
			}
		})
	}
	l1 := filters.Layer1([]string{"x"})
	if !reflect.DeepEqual(l1[0].Kinds, []int{30617, 10317}) || !reflect.DeepEqual(l1[1].Kinds, []int{30618}) || l1[1].Tags["d"][0] != "x" {
		t.Errorf("layer1 = %v", l1)
	}
}

func TestItemsAndCount(t *testing.T) {
	tests := []struct {
		name                  string
		refs, idents, roots   int
		wantFilters           int
		wantFirstTag, lastTag string
	}{
		{"nothing", 0, 0, 0, 0, "", ""},
		{"one repo", 1, 1, 0, 4, "a", "d"},
		{"roots only", 0, 0, 100, 3, "e", "q"},
		{"101 roots", 0, 0, 101, 6, "e", "q"},
		{"250 repos 7 roots", 250, 250, 7, 9 + 3 + 3, "a", "q"},
		{"shared identifiers", 3, 1, 0, 3 + 1, "a", "d"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			idents := ids(tt.idents, "d")
			fs := filters.Items(ids(tt.refs, "r"), idents, ids(tt.roots, "e"))
			if len(fs) != tt.wantFilters {
				t.Fatalf("%d filters, want %d", len(fs), tt.wantFilters)
			}
			if n := filters.CountItems(tt.refs, tt.idents, tt.roots); n != len(fs) {
				t.Errorf("CountItems = %d, built %d", n, len(fs))
			}
			if len(fs) == 0 {
				return
			}
			if _, ok := fs[0].Tags[tt.wantFirstTag]; !ok {
				t.Errorf("first filter %v, want #%s", fs[0], tt.wantFirstTag)
			}
			if _, ok := fs[len(fs)-1].Tags[tt.lastTag]; !ok {
				t.Errorf("last filter %v, want #%s", fs[len(fs)-1], tt.lastTag)
			}
			for _, f := range fs {
				if f.Tags["d"] == nil && len(f.Kinds) != 0 {
					t.Errorf("tag filter with kinds: %v", f)
				}
			}
		})
	}
	if b := filters.Base(); !reflect.DeepEqual(b.Kinds, []int{30617, 10317}) || len(b.Tags) != 0 {
		t.Errorf("base = %v", b)
	}
}

func TestProtoRoundTrip(t *testing.T) {
	since, until := nostr.Timestamp(100), nostr.Timestamp(200)
	cases := []nostr.Filter{
		{Kinds: []int{30617, 10317}},
		{Tags: nostr.TagMap{"a": {"x", "y"}, "q": {"z"}}, Since: &since, Until: &until, Limit: 500},
		filters.Live([]nostr.Filter{{Tags: nostr.TagMap{"e": {"1"}}}})[0],
		{IDs: []string{"i"}, Authors: []string{"p"}},
	}
	for _, f := range cases {
		back := filters.FromProto(filters.ToProto(f))
		if !reflect.DeepEqual(back, f) {
			t.Errorf("round trip %v → %v", f, back)
		}
	}
	live := filters.FromProto(filters.ToProto(cases[2]))
	if !live.LimitZero {
		t.Error("limit:0 lost in round trip")
	}
	if j := live.String(); j != `{"limit":0,"#e":["1"]}` {
		t.Errorf("live filter JSON = %s", j)
	}
}

// Maintained asks for announcements and states by author and identifier,
// one filter per chunk of each, and nothing for no authors.
func TestMaintained(t *testing.T) {
	if fs := filters.Maintained(nil, []string{"r"}); len(fs) != 0 {
		t.Fatalf("no authors: %v", fs)
	}
	fs := filters.Maintained(append(ids(150, "a"), ids(150, "a")...), []string{"r2", "r1", "r1"})
	if len(fs) != 2 {
		t.Fatalf("%d filters, want 2 (150 authors in chunks of 100)", len(fs))
	}
	for _, f := range fs {
		if len(f.Kinds) != 2 || f.Kinds[0] != 30617 || f.Kinds[1] != 30618 {
			t.Fatalf("kinds %v", f.Kinds)
		}
		if d := f.Tags["d"]; len(d) != 2 || d[0] != "r1" || d[1] != "r2" {
			t.Fatalf("#d %v", d)
		}
	}
	if len(fs[0].Authors)+len(fs[1].Authors) != 150 {
		t.Fatalf("authors %d + %d, want 150 distinct", len(fs[0].Authors), len(fs[1].Authors))
	}
}
