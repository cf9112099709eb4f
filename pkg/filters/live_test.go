package filters_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/nbd-wtf/go-nostr"
	"google.golang.org/protobuf/proto"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/filters"
)

// graspv1.LiveOf must equal converting the filters made live by Live, field
// for field (it copies the proto fields by hand).
func TestLiveOfMatchesLive(t *testing.T) {
	since := nostr.Timestamp(1700000000)
	fs := append(filters.Items([]string{"30617:p:r1"}, []string{"r1"}, []string{fmt.Sprintf("%064x", 1)}), filters.Base(),
		nostr.Filter{IDs: []string{"x"}, Authors: []string{"y"}, Since: &since, Until: &since})
	got := graspv1.LiveOf(filters.ToProtos(fs))
	want := filters.ToProtos(filters.Live(fs))
	if len(got) != len(want) {
		t.Fatalf("%d filters, want %d", len(got), len(want))
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Fatalf("filter %d: %v, want %v", i, got[i], want[i])
		}
	}
}

// A command's live part reads the same in both forms, after a trip through
// the wire: live_filters listed, or live_from_historic naming where in
// historic_filters they start.
func TestAddFiltersLiveInBothForms(t *testing.T) {
	hist := append(filters.Layer1([]string{"r1", "r2"}), filters.Items([]string{"30617:p:r1"}, []string{"r1"}, []string{fmt.Sprintf("%064x", 1), fmt.Sprintf("%064x", 2)})...)
	for _, from := range []int{0, len(filters.Layer1([]string{"r1", "r2"})), len(hist)} {
		listed := &graspv1.AddFilters{BatchId: "b", HistoricFilters: filters.ToProtos(hist), LiveFilters: filters.ToProtos(filters.Live(hist[from:]))}
		f := uint32(from)
		indexed := &graspv1.AddFilters{BatchId: "b", HistoricFilters: filters.ToProtos(hist), LiveFromHistoric: &f}
		var sizes [2]int
		for k, c := range []*graspv1.AddFilters{listed, indexed} {
			b, err := proto.Marshal(c)
			if err != nil {
				t.Fatal(err)
			}
			sizes[k] = len(b)
			var back graspv1.AddFilters
			if err := proto.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			got := filters.FromProtos(back.Live())
			want := filters.Live(hist[from:])
			if len(got) != len(want) || back.LiveLen() != len(want) {
				t.Fatalf("from %d, form %d: %d live filters (LiveLen %d), want %d", from, k, len(got), back.LiveLen(), len(want))
			}
			for i := range want {
				if !nostr.FilterEqual(got[i], want[i]) || !got[i].LimitZero {
					t.Fatalf("from %d, form %d, filter %d: %v, want %v", from, k, i, got[i], want[i])
				}
			}
		}
		if from < len(hist) && sizes[1] >= sizes[0] {
			t.Errorf("from %d: the indexed command (%d bytes) is not smaller than the listed one (%d)", from, sizes[1], sizes[0])
		}
	}
	// An index past the end opens nothing rather than failing.
	past := uint32(len(hist) + 5)
	if c := (&graspv1.AddFilters{HistoricFilters: filters.ToProtos(hist), LiveFromHistoric: &past}); c.LiveLen() != 0 || len(c.Live()) != 0 {
		t.Fatalf("index past the end: %d live filters", c.LiveLen())
	}
}

// A command's roots are its layer-3 #e values, in hex order across chunks,
// after a trip through the wire; layer 1, layer 2 and states name none,
// and a root tagged only by a maintainer's coordinate is not one.
func TestAddFiltersRootIDsFromTheFilters(t *testing.T) {
	var roots []string
	for i := filters.ChunkSize + 20; i > 0; i-- { // two chunks, given out of order
		roots = append(roots, fmt.Sprintf("%064x", i))
	}
	want := slices.Sorted(slices.Values(roots))
	for _, tc := range []struct {
		name string
		hist []nostr.Filter
		want []string
	}{
		{"items", filters.Items([]string{"30617:p:r1"}, []string{"r1"}, roots), want},
		{"layer 1 and items", append(filters.Layer1([]string{"r1"}), filters.Items(nil, nil, roots[:1])...), roots[:1]},
		{"layer 1", filters.Layer1([]string{"r1"}), nil},
		{"repositories only", filters.Items([]string{"30617:p:r1"}, []string{"r1"}, nil), nil},
		{"e with a kind is not layer 3", []nostr.Filter{{Kinds: []int{1}, Tags: nostr.TagMap{"e": roots[:1]}}}, nil},
	} {
		b, err := proto.Marshal(&graspv1.AddFilters{BatchId: "b", HistoricFilters: filters.ToProtos(tc.hist)})
		if err != nil {
			t.Fatal(err)
		}
		var back graspv1.AddFilters
		if err := proto.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if got := back.RootIDs(); !slices.Equal(got, tc.want) || back.RootCount() != len(tc.want) {
			t.Errorf("%s: %d roots (RootCount %d), want %d: %v", tc.name, len(got), back.RootCount(), len(tc.want), got)
		}
	}
}
