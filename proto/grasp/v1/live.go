package graspv1

import "iter"

// LiveOf returns live-only ("limit": 0) copies of historic filters. The
// copies share the filters' value lists and tag messages, which is safe
// because a command is never modified once built.
func LiveOf(historic []*Filter) []*Filter {
	out := make([]*Filter, len(historic))
	for i, h := range historic {
		zero := int32(0)
		out[i] = &Filter{Ids: h.Ids, Authors: h.Authors, Kinds: h.Kinds, Tags: h.Tags, Since: h.Since, Until: h.Until, Limit: &zero}
	}
	return out
}

// LiveFrom reports the index of historic_filters from which a command's
// live part is its historic part (live_from_historic), clamped to the
// filters there are; ok is false when the command lists live_filters
// instead, as a planner does for a fetcher that did not say it reads the
// index (Connected.live_from_historic).
func (a *AddFilters) LiveFrom() (from int, ok bool) {
	if a == nil || a.LiveFromHistoric == nil {
		return 0, false
	}
	return min(int(a.GetLiveFromHistoric()), len(a.GetHistoricFilters())), true
}

// Live returns the live filters a command opens, in either form:
// live_filters, or historic_filters from live_from_historic on, with
// limit 0.
func (a *AddFilters) Live() []*Filter {
	if from, ok := a.LiveFrom(); ok {
		return LiveOf(a.GetHistoricFilters()[from:])
	}
	return a.GetLiveFilters()
}

// LiveLen is len(a.Live()) without building the copies.
func (a *AddFilters) LiveLen() int {
	if from, ok := a.LiveFrom(); ok {
		return len(a.GetHistoricFilters()) - from
	}
	return len(a.GetLiveFilters())
}

// RootIDs returns the root event ids an items or catch-up batch covers: the
// values of its historic #e filters, in the order they name them (hex order,
// as the planner builds them). The planner names each root under #e, #E and
// #q and nowhere else in a command (root_event_ids is no longer set), so
// readers of a command (logs, tests, anyone tapping the commands' subjects)
// take the roots from there.
func (a *AddFilters) RootIDs() []string {
	var ids []string
	for vs := range a.rootLists() {
		ids = append(ids, vs...)
	}
	return ids
}

// RootCount is len(a.RootIDs()) without building the list.
func (a *AddFilters) RootCount() int {
	n := 0
	for vs := range a.rootLists() {
		n += len(vs)
	}
	return n
}

// rootLists yields the value lists of the historic filters that are a
// plain #e (layer 3: no kinds, no authors).
func (a *AddFilters) rootLists() iter.Seq[[]string] {
	return func(yield func([]string) bool) {
		for _, f := range a.GetHistoricFilters() {
			if len(f.GetKinds()) > 0 || len(f.GetAuthors()) > 0 || len(f.GetTags()) != 1 || f.GetTags()[0].GetName() != "e" {
				continue
			}
			if !yield(f.GetTags()[0].GetValues()) {
				return
			}
		}
	}
}
