package planner

import (
	"cmp"
	"slices"
	"strconv"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/filters"
)

// liveSet is one named set of live subscriptions the planner opened on a
// relay's session since its last ReplaceLive: an items batch's live filters
// (named by the batch id) or a merge of earlier sets. It keeps its items so
// that it can be merged with others; CloseLive closes it by name.
type liveSet struct {
	id      string
	items   []BatchItem
	filters int
	// values is how many refs and roots its items name: the merge order.
	values int
}

// maxTailSets bounds the named sets a relay keeps beside its replaced live
// set: each is at least one REQ at the fetcher, and relays limit the
// subscriptions of a connection.
const maxTailSets = 16

// newLiveSet records the live set of an items batch.
func newLiveSet(id string, items []BatchItem, nfilters int) *liveSet {
	ls := &liveSet{id: id, items: slices.Clone(items), filters: nfilters}
	for _, it := range items {
		if it.NeedRepo {
			ls.values++
		}
		ls.values += len(it.Roots)
	}
	return ls
}

// liveID names a live-only set (a ReplaceLive or a merge); items batches'
// sets are named by their batch id ("<epoch>-<seq>"), which the "L" prefix
// keeps apart.
func (m *Machine) liveID() string {
	m.liveSeq++
	return "L" + strconv.FormatUint(m.epoch, 10) + "-" + strconv.FormatUint(m.liveSeq, 10)
}

// consolidate brings a relay that outgrew its live budget back under it.
// It merges the smallest of the sets opened since its last ReplaceLive
// (mergeTail), which costs what those sets name, not what the relay has:
// at stretch scale a ReplaceLive of a relay is ~10 MB of commands, a merge
// a few KB. A relay whose live set must lose items (removals, a failed
// batch whose set was merged), whose live set is stale or lost, or that a
// merge cannot bring under its budget gets a ReplaceLive as before.
func (m *Machine) consolidate(s *RelayState) {
	if s.liveStale || s.needsReplace || s.trimLive {
		m.replaceLive(s, nil)
	} else {
		min := m.exactMinimal(s)
		s.minLo, s.minHi, s.minKnown = min, min, true
		if !m.mergeTail(s, nil, min+headroom(s, m.budget(s))/2) {
			m.replaceLive(s, nil)
		}
	}
	s.deferredFor = ""
}

// consolidateWith brings a relay whose live filters with the new items
// would be over its budget back under it at once (overBudget's
// consolidateNow: its minimal set fits the budget, or deferral is off).
// The new items' live filters go in the merged set, so the caller's batches
// carry history only. Decision 0062: it merges the tail's smallest sets
// with the new items, as a deferred consolidation does, down to halfway
// between the minimal set and the budget, instead of replacing the whole
// live set: a ReplaceLive re-sends every value the relay has live (in the
// target world about a quarter of the bytes graspd sent). It falls back to
// ReplaceLive when the live set must lose items or merging cannot reach
// that goal.
func (m *Machine) consolidateWith(s *RelayState, items []BatchItem) {
	if s.liveStale || s.needsReplace || s.trimLive {
		m.replaceLive(s, items)
		return
	}
	if n := (m.idx.Roots.Len() + 63) / 64; len(m.seen) < n {
		m.seen = make([]uint64, n)
	}
	min := m.minimalSize(s, items)
	goal := min + headroom(s, m.budget(s))/2
	if t := m.budget(s); min <= t {
		goal = (min + t) / 2
	}
	if !m.mergeTail(s, items, goal) {
		m.replaceLive(s, items)
		return
	}
	s.minLo, s.minHi, s.minKnown = min, min, true
}

// mergeTail merges the tail's smallest sets (fewest values first), with
// extra (new items whose live filters are not open yet) when given, until
// the relay's live filters are at most goal and it has at most maxTailSets
// sets, then opens the merged set under a new name and closes the merged
// ones after it (make before break). It reports false when merging the
// whole tail would not be enough.
func (m *Machine) mergeTail(s *RelayState, extra []BatchItem, goal int) bool {
	excess := s.LiveFilters - goal
	if len(extra) == 0 && excess <= 0 && len(s.tail) <= maxTailSets {
		return true // queued on a bound; within its budget after all
	}
	order := slices.Clone(s.tail)
	slices.SortStableFunc(order, func(a, b *liveSet) int { return cmp.Compare(a.values, b.values) })
	// The merged set's size is counted as sets are added (what countItems
	// would say of the merged items, without sorting them again per set):
	// refs per repository needed, distinct identifiers, distinct roots
	// through the bitmap, cleared before returning.
	var (
		merged  []BatchItem
		at      = map[RepoID]int{}
		refs    int
		idents  = map[string]struct{}{}
		roots   int
		sum, k  int
		enough  bool
		seen    = m.seen
		addRoot = func(r RootID) {
			if w, b := r/64, uint64(1)<<(r%64); seen[w]&b == 0 {
				seen[w] |= b
				roots++
			}
		}
	)
	defer func() {
		for _, it := range merged {
			for _, r := range it.Roots {
				seen[r/64] &^= uint64(1) << (r % 64)
			}
		}
	}()
	add := func(items []BatchItem) {
		for _, it := range items {
			i, ok := at[it.Repo]
			if !ok {
				i = len(merged)
				at[it.Repo] = i
				merged = append(merged, BatchItem{Repo: it.Repo})
			}
			if it.NeedRepo && !merged[i].NeedRepo {
				merged[i].NeedRepo = true
				r := m.idx.Repo(it.Repo)
				refs += 1 + len(r.Aliases)
				if r.Identifier != "" {
					idents[r.Identifier] = struct{}{}
				}
			}
			for _, r := range it.Roots {
				addRoot(r)
			}
			merged[i].Roots = union(merged[i].Roots, it.Roots)
		}
	}
	// With extra, merging no set at all is a choice (k = −1): the new
	// items then open a set of their own. Without, a merge takes at least
	// two sets. After merging order[:k+1] the relay has len(s.tail)−k sets.
	k = 0
	if len(extra) > 0 {
		add(extra)
		k = -1
	}
	for ; k < len(order); k++ {
		if k >= 0 {
			add(order[k].items)
			sum += order[k].filters
		}
		if (len(extra) > 0 || k > 0) && sum-filters.CountItems(refs, len(idents), roots) >= excess && len(s.tail)-k <= maxTailSets {
			enough = true
			break
		}
	}
	if !enough {
		return false // even the whole tail merged is not enough
	}
	gone := order[:k+1]
	rs, idn, rts := m.itemValues(merged)
	live := filters.ToProtos(filters.Live(filters.Items(rs, idn, m.hexes(m.hexOrder(rts)))))
	id := m.liveID()
	m.sendLive(s, id, live, false)
	ids := make([]string, len(gone))
	for i, g := range gone {
		ids[i] = g.id
	}
	if len(ids) > 0 {
		m.send(s, s.Session, &graspv1.FetchCommand{Command: &graspv1.FetchCommand_CloseLive{CloseLive: &graspv1.CloseLive{
			LiveIds: ids, AfterLiveId: id}}})
	}
	s.tail = slices.DeleteFunc(s.tail, func(ls *liveSet) bool { return slices.Contains(gone, ls) })
	s.tail = append(s.tail, newLiveSet(id, merged, len(live)))
	s.LiveFilters += len(live) - sum
	m.obs.Consolidated(s.URL)
	m.dirty[s.ID] = true
	return true
}

// closeTailSet closes a failed items batch's live set by name if it is
// still one of the relay's tail sets (not merged): its items leave the live
// set and nothing else was in it. It reports whether it did.
func (m *Machine) closeTailSet(s *RelayState, id string) bool {
	i := slices.IndexFunc(s.tail, func(ls *liveSet) bool { return ls.id == id })
	if i < 0 {
		return false
	}
	s.LiveFilters -= s.tail[i].filters
	s.tail = slices.Delete(s.tail, i, i+1)
	m.send(s, s.Session, &graspv1.FetchCommand{Command: &graspv1.FetchCommand_CloseLive{CloseLive: &graspv1.CloseLive{LiveIds: []string{id}}}})
	return true
}

// sendLive sends live filters under one name in commands of at most
// MaxFiltersPerCommand filters: the first a ReplaceLive when replace is
// set, the rest (or all) live-only AddFilters.
func (m *Machine) sendLive(s *RelayState, id string, live []*graspv1.Filter, replace bool) {
	per := m.rules.MaxFiltersPerCommand
	if per <= 0 {
		per = max(len(live), 1)
	}
	start := 0
	if replace {
		m.send(s, s.Session, &graspv1.FetchCommand{Command: &graspv1.FetchCommand_ReplaceLive{ReplaceLive: &graspv1.ReplaceLive{
			LiveFilters: live[:min(per, len(live))], LiveId: id,
		}}})
		start = per
	}
	for i := start; i < len(live); i += per {
		m.send(s, s.Session, &graspv1.FetchCommand{Command: &graspv1.FetchCommand_AddFilters{AddFilters: &graspv1.AddFilters{
			LiveFilters: live[i:min(i+per, len(live))], LiveId: id,
		}}})
	}
}

// exactMinimal is minimalSize(s, nil) without building the items: roots are
// counted once through a bitmap over the interned root ids, so it costs a
// pass over the relay's pairs and roots instead of sorting them.
func (m *Machine) exactMinimal(s *RelayState) int {
	if n := (m.idx.Roots.Len() + 63) / 64; len(m.seen) < n {
		m.seen = make([]uint64, n)
	}
	seen := m.seen
	refs, roots := 0, 0
	idents := map[string]struct{}{}
	mark := func(rs []RootID) {
		for _, r := range rs {
			if w, b := r/64, uint64(1)<<(r%64); seen[w]&b == 0 {
				seen[w] |= b
				roots++
			}
		}
	}
	unmark := func(rs []RootID) {
		for _, r := range rs {
			seen[r/64] &^= uint64(1) << (r % 64)
		}
	}
	for repo, p := range s.Pairs {
		if p.RepoConfirmed || p.RepoPending {
			r := m.idx.Repo(repo)
			refs += 1 + len(r.Aliases)
			if r.Identifier != "" {
				idents[r.Identifier] = struct{}{}
			}
		}
		mark(p.Confirmed)
		mark(p.Pending)
	}
	for _, p := range s.Pairs {
		unmark(p.Confirmed)
		unmark(p.Pending)
	}
	return 1 + filters.CountItems(refs, len(idents), roots)
}
