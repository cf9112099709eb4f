// Package filters builds the three layers of sync filters (docs/sync.md, "Filters")
// and converts nostr filters to and from their protobuf form in fetch
// commands. Pure functions, no I/O.
//
// Layers 2 and 3 filter by tags only, with no kinds, so that statuses,
// comments, pull request updates and any other kind that tags a repository or
// root event is found.
//
// The builders do not copy input that is already sorted and free of
// duplicates: the filters' tag values may share the caller's slice, which the
// caller must not modify afterwards.
package filters

import (
	"sort"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
)

// ChunkSize is the most tag values one filter carries; relays reject or
// truncate larger filters.
const ChunkSize = 100

// Layer1 is the per-connection layer: every announcement and user grasp
// list, plus the states (30618) of our repositories by identifier.
func Layer1(identifiers []string) []nostr.Filter {
	fs := []nostr.Filter{Base()}
	return append(fs, States(identifiers)...)
}

// States finds repository states (30618) by identifier. States carry no "a"
// tag, so layer 2 cannot find them; the policy keeps only the maintainers'.
func States(identifiers []string) []nostr.Filter {
	var fs []nostr.Filter
	for _, chunk := range chunks(sortedUnique(identifiers)) {
		fs = append(fs, nostr.Filter{Kinds: []int{nip34.KindRepoState}, Tags: nostr.TagMap{"d": chunk}})
	}
	return fs
}

// Maintained finds the announcements (30617) and states (30618) of authors
// for identifiers: what a repository's maintainers published about it. One
// filter per chunk of authors and chunk of identifiers; it may return an
// author's events for another of the identifiers, which the policy judges
// like any other.
func Maintained(authors, identifiers []string) []nostr.Filter {
	var fs []nostr.Filter
	for _, as := range chunks(sortedUnique(authors)) {
		for _, ds := range chunks(sortedUnique(identifiers)) {
			fs = append(fs, nostr.Filter{Kinds: []int{nip34.KindRepoAnnouncement, nip34.KindRepoState}, Authors: as, Tags: nostr.TagMap{"d": ds}})
		}
	}
	return fs
}

// Layer2 finds everything that tags a repository: #a, #A and #q per chunk of
// repository coordinates.
func Layer2(repoRefs []string) []nostr.Filter {
	return tagLayer(repoRefs, "a", "A", "q")
}

// Layer3 finds everything that tags a root event: #e, #E and #q per chunk of
// root event ids.
func Layer3(rootIDs []string) []nostr.Filter {
	return tagLayer(rootIDs, "e", "E", "q")
}

// Base is the connection-level part of layer 1: every repository
// announcement and user grasp list. It does not depend on which items a
// relay is synced for.
func Base() nostr.Filter {
	return nostr.Filter{Kinds: []int{nip34.KindRepoAnnouncement, nip34.KindUserGraspList}}
}

// RelayLists finds the relay lists (NIP-65, kind 10002) of authors, one
// filter per chunk: with Base, the layer 1 of an archive (GRASP-05), whose
// whitelisted maintainers' relay lists name where their announcements are.
func RelayLists(authors []string) []nostr.Filter {
	var fs []nostr.Filter
	for _, chunk := range chunks(sortedUnique(authors)) {
		fs = append(fs, nostr.Filter{Kinds: []int{nip34.KindRelayList}, Authors: chunk})
	}
	return fs
}

// Items builds the item-level filters of a set of sync items: for
// repositories their layer-2 filters and the 30618 states of their
// identifiers, for root events their layer-3 filters. The order is fixed
// (layer 2, states, layer 3) so commands are reproducible.
func Items(repoRefs, identifiers, rootIDs []string) []nostr.Filter {
	var fs []nostr.Filter
	fs = append(fs, Layer2(repoRefs)...)
	fs = append(fs, States(identifiers)...)
	return append(fs, Layer3(rootIDs)...)
}

// CountItems is len(Items(...)) for that many distinct repository refs,
// identifiers and root ids, computed without building the filters, so the
// planner can budget live filters cheaply.
func CountItems(repoRefs, identifiers, rootIDs int) int {
	return 3*chunkCount(repoRefs) + chunkCount(identifiers) + 3*chunkCount(rootIDs)
}

func chunkCount(n int) int { return (n + ChunkSize - 1) / ChunkSize }

func tagLayer(values []string, names ...string) []nostr.Filter {
	var fs []nostr.Filter
	for _, chunk := range chunks(sortedUnique(values)) {
		for _, name := range names {
			fs = append(fs, nostr.Filter{Tags: nostr.TagMap{name: chunk}})
		}
	}
	return fs
}

// Live turns filters into live-only ones ("limit": 0): the relay sends no
// stored events, only new ones, for as long as the subscription is open.
func Live(fs []nostr.Filter) []nostr.Filter {
	out := make([]nostr.Filter, len(fs))
	for i, f := range fs {
		f.Limit = 0
		f.LimitZero = true
		out[i] = f
	}
	return out
}

// Since bounds filters to events created at or after ts.
func Since(fs []nostr.Filter, ts nostr.Timestamp) []nostr.Filter {
	out := make([]nostr.Filter, len(fs))
	for i, f := range fs {
		t := ts
		f.Since = &t
		out[i] = f
	}
	return out
}

func chunks(values []string) [][]string {
	var out [][]string
	for len(values) > 0 {
		n := min(ChunkSize, len(values))
		out = append(out, values[:n:n])
		values = values[n:]
	}
	return out
}

// sortedUnique returns values sorted and without duplicates. Input that is
// already strictly increasing (the planner sends ids that way) is returned as
// is, without copying: sorting thousands of 64-character ids per command is
// the planner's largest cost otherwise.
func sortedUnique(values []string) []string {
	increasing := true
	for i := 1; i < len(values); i++ {
		if values[i-1] >= values[i] {
			increasing = false
			break
		}
	}
	if increasing {
		return values
	}
	s := append([]string(nil), values...)
	sort.Strings(s)
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// ToProto converts a nostr filter for a fetch command.
func ToProto(f nostr.Filter) *graspv1.Filter {
	p := &graspv1.Filter{Ids: f.IDs, Authors: f.Authors}
	for _, k := range f.Kinds {
		p.Kinds = append(p.Kinds, int32(k))
	}
	names := make([]string, 0, len(f.Tags))
	for name := range f.Tags {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		p.Tags = append(p.Tags, &graspv1.TagFilter{Name: name, Values: f.Tags[name]})
	}
	if f.Since != nil {
		v := int64(*f.Since)
		p.Since = &v
	}
	if f.Until != nil {
		v := int64(*f.Until)
		p.Until = &v
	}
	if f.Limit > 0 || f.LimitZero {
		v := int32(f.Limit)
		p.Limit = &v
	}
	return p
}

// FromProto converts a fetch command's filter back into a nostr filter.
func FromProto(p *graspv1.Filter) nostr.Filter {
	f := nostr.Filter{IDs: p.GetIds(), Authors: p.GetAuthors()}
	for _, k := range p.GetKinds() {
		f.Kinds = append(f.Kinds, int(k))
	}
	if len(p.GetTags()) > 0 {
		f.Tags = nostr.TagMap{}
		for _, t := range p.GetTags() {
			f.Tags[t.GetName()] = append(f.Tags[t.GetName()], t.GetValues()...)
		}
	}
	if p.Since != nil {
		ts := nostr.Timestamp(p.GetSince())
		f.Since = &ts
	}
	if p.Until != nil {
		ts := nostr.Timestamp(p.GetUntil())
		f.Until = &ts
	}
	if p.Limit != nil {
		f.Limit = int(p.GetLimit())
		f.LimitZero = f.Limit == 0
	}
	return f
}

// ToProtos converts a slice of filters.
func ToProtos(fs []nostr.Filter) []*graspv1.Filter {
	out := make([]*graspv1.Filter, len(fs))
	for i, f := range fs {
		out[i] = ToProto(f)
	}
	return out
}

// FromProtos converts a slice of filters.
func FromProtos(ps []*graspv1.Filter) []nostr.Filter {
	out := make([]nostr.Filter, len(ps))
	for i, p := range ps {
		out[i] = FromProto(p)
	}
	return out
}
