package planner

import (
	"hash/fnv"
	"slices"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/filters"
)

// emitItems starts batches for new items: live subscriptions (limit 0) and
// their history. If the relay's live filters would exceed the budget, all its
// live subscriptions are first replaced with the minimal set for confirmed ∪
// pending ∪ new items (consolidation), and the batches carry history only.
// Consolidation never waits for pending batches. A relay whose minimal set
// alone is above the budget keeps the new live subscriptions and has its
// consolidation queued (deferConsolidation): the budget cannot hold for it
// anyway, and building ~1 MB of filters per relay would make the discovery
// batch's recompute pay for relays it barely touched.
func (m *Machine) emitItems(now time.Time, s *RelayState, items []BatchItem) {
	m.emitItemBatches(now, s, items, nil, items)
}

// emitItemBatches is emitItems with items divided in two: redo, a daily
// resync's re-read of what was confirmed, go in batches of their own marked
// Resync, then the rest.
func (m *Machine) emitItemBatches(now time.Time, s *RelayState, items, redo, rest []BatchItem) {
	if len(items) == 0 {
		return
	}
	redoBatches := m.split(redo)
	batches := append(redoBatches, m.split(rest)...)
	n := 0
	for _, b := range batches {
		n += m.countItems(b)
	}
	withLive := true
	if s.liveStale {
		m.replaceLive(s, items)
		withLive = false
	} else {
		verdict, exact := m.overBudget(s, s.LiveFilters+n, items, n)
		switch verdict {
		case consolidateNow:
			m.consolidateWith(s, items)
			withLive = false
		case consolidateLater:
			m.deferConsolidation(now, s)
		}
		if withLive {
			if exact >= 0 {
				s.minLo, s.minHi = exact, exact
			} else {
				s.minHi += n // the new items add at most their own filters
			}
		}
	}
	for i, b := range batches {
		m.startBatch(now, s, BatchItems, b, 0, withLive, i < len(redoBatches))
	}
}

// budgetVerdict is overBudget's answer.
type budgetVerdict int

const (
	withinBudget     budgetVerdict = iota
	consolidateNow                 // the minimal set fits the budget, or deferral is off
	consolidateLater               // over the headroom of a minimal set above the budget
)

// overBudget says whether total live filters need consolidating, and
// returns the exact minimal set size with extra when it had to compute it
// (else −1). The budget is MaxLiveFilters; a relay whose minimal set alone
// is larger (at design scale, a relay listed by 100 repositories with 5,000
// roots needs ~150 filters of 100 values) gets its minimal set plus a
// headroom of half to all of the budget (see headroom), so it is not
// consolidated on every batch, and its consolidation is deferred when
// deferral is on. When the bounds already show the minimal set is above
// the budget, deferring needs no exact size: the deferred consolidation is
// built from the relay's state when it is drained.
func (m *Machine) overBudget(s *RelayState, total int, extra []BatchItem, n int) (budgetVerdict, int) {
	t := m.budget(s)
	if total <= t {
		return withinBudget, -1
	}
	if !s.minKnown {
		exact := m.minimalSize(s, nil)
		s.minLo, s.minHi, s.minKnown = exact, exact, true
	}
	lo, hi, room := s.minLo, s.minHi+n, headroom(s, t)
	if hi <= t {
		return consolidateNow, -1 // the minimal set fits the budget
	}
	if lo > t {
		if total <= lo+room {
			return withinBudget, -1
		}
		if m.deferring() {
			return consolidateLater, -1
		}
		if total > hi+room {
			return consolidateNow, -1
		}
	}
	exact := m.minimalSize(s, extra)
	switch {
	case exact <= t:
		return consolidateNow, exact
	case total <= exact+room:
		return withinBudget, exact
	case m.deferring():
		return consolidateLater, exact
	}
	return consolidateNow, exact
}

// deferring reports whether consolidations of relays whose minimal set is
// above the budget are queued rather than built at once.
func (m *Machine) deferring() bool { return m.rules.ConsolidatePerTick > 0 }

// minimalAbove reports whether the relay's minimal live set is above the
// budget, from the bounds when they tell, else by computing it.
func (m *Machine) minimalAbove(s *RelayState) bool {
	if s.minKnown && s.minLo > m.budget(s) {
		return true
	}
	exact := m.minimalSize(s, nil)
	s.minLo, s.minHi, s.minKnown = exact, exact, true
	return exact > m.budget(s)
}

// budget is the relay's live filter budget: MaxLiveFilters, or less where
// the relay's limits allow fewer live filters (its subscription and message
// budgets, reported by the fetcher: docs/sync.md, "What relays allow"), so
// consolidation keeps its live REQs within what it accepts.
func (m *Machine) budget(s *RelayState) int {
	if s.limitBudget > 0 && s.limitBudget < m.rules.MaxLiveFilters {
		return s.limitBudget
	}
	return m.rules.MaxLiveFilters
}

// lowerMin keeps minLo a lower bound of the minimal live set when
// repositories and roots leave it: they take at most the filters they
// would need on their own, so the bound stays useful without a pass over
// every pair.
func (s *RelayState) lowerMin(repos, roots int) {
	s.minLo = max(0, s.minLo-filters.CountItems(repos, repos, roots))
}

// deferConsolidation queues the relay's consolidation for its current
// session; a relay already queued keeps its place. The queue holds each
// relay at most once, so it is bounded by the tracked relays.
func (m *Machine) deferConsolidation(now time.Time, s *RelayState) {
	s.deferredFor = s.Session
	if m.queued[s.ID] {
		return
	}
	m.queued[s.ID] = true
	m.deferred = append(m.deferred, s.ID)
	if m.consolidateAt.IsZero() {
		m.consolidateAt = now
	}
}

// drainDeferred builds up to ConsolidatePerTick queued consolidations, oldest
// first, once ConsolidateEvery has passed since the last round. Each is
// built from confirmed ∪ pending at that moment, so it covers every item
// whose live subscription it replaces. An entry whose relay was dropped,
// changed session or was consolidated meanwhile is skipped.
func (m *Machine) drainDeferred(now time.Time) {
	if len(m.deferred) == 0 || now.Before(m.consolidateAt) {
		return
	}
	for done := 0; done < m.rules.ConsolidatePerTick && len(m.deferred) > 0; {
		id := m.deferred[0]
		m.deferred = slices.Delete(m.deferred, 0, 1)
		delete(m.queued, id)
		s, ok := m.relays[id]
		if !ok || s.deferredFor == "" || s.deferredFor != s.Session || !s.Connected() {
			continue
		}
		done++
		m.consolidate(s)
	}
	m.consolidateAt = now.Add(m.rules.ConsolidateEvery)
}

// headroom is how far a relay whose minimal live set exceeds the budget may
// grow past it before consolidating: between half the budget and the budget,
// fixed per relay (a hash of its URL). Relays that grow alike would
// otherwise all consolidate in the same discovery batch.
func headroom(s *RelayState, budget int) int {
	h := fnv.New32a()
	h.Write([]byte(s.URL))
	return budget/2 + int(h.Sum32()%uint32(budget-budget/2))
}

func (m *Machine) minimalSize(s *RelayState, extra []BatchItem) int {
	return len(m.layer1) + m.countItems(m.liveItems(s, extra))
}

// LiveBudget is the most live filters a relay may have open: MaxLiveFilters,
// or its minimal set plus its headroom when the minimal set alone is larger.
// A relay with a deferred consolidation queued may be above it until Tick
// builds it.
func (m *Machine) LiveBudget(s *RelayState) int {
	min := m.minimalSize(s, nil)
	if t := m.budget(s); min > t {
		return min + headroom(s, t)
	}
	return m.budget(s)
}

// DeferredConsolidations is how many relays have a consolidation queued.
func (m *Machine) DeferredConsolidations() int { return len(m.deferred) }

// replaceLive sends one ReplaceLive with the minimal live set: layer 1 plus
// every confirmed, pending and extra item.
func (m *Machine) replaceLive(s *RelayState, extra []BatchItem) {
	refs, idents, roots := m.itemValues(m.liveItems(s, extra))
	fs := append(m.layer1Filters(), filters.Items(refs, idents, m.hexes(m.hexOrder(roots)))...)
	if !s.liveStale {
		m.obs.Consolidated(s.URL)
	}
	s.LiveFilters = len(fs)
	s.minLo, s.minHi, s.minKnown = len(fs), len(fs), true
	s.liveStale, s.needsReplace, s.trimLive = false, false, false
	s.deferredFor = "" // a queued consolidation is not needed any more
	s.tail = nil
	// The first part replaces every live subscription; the rest are added
	// as live-only AddFilters (no batch id), each one REQ of bounded size,
	// all under one name.
	m.sendLive(s, m.liveID(), filters.ToProtos(filters.Live(fs)), true)
	m.dirty[s.ID] = true
}

// liveItems is confirmed ∪ pending ∪ extra, one item per repository.
func (m *Machine) liveItems(s *RelayState, extra []BatchItem) []BatchItem {
	byRepo := make(map[RepoID]*BatchItem, len(s.Pairs)+len(extra))
	var order []RepoID
	add := func(repo RepoID, need bool, roots []RootID) {
		it := byRepo[repo]
		if it == nil {
			it = &BatchItem{Repo: repo}
			byRepo[repo] = it
			order = append(order, repo)
		}
		it.NeedRepo = it.NeedRepo || need
		if len(roots) > 0 {
			it.Roots = union(it.Roots, roots)
		}
	}
	for repo, p := range s.Pairs {
		add(repo, p.RepoConfirmed || p.RepoPending, union(p.Confirmed, p.Pending))
	}
	for _, it := range extra {
		add(it.Repo, it.NeedRepo, it.Roots)
	}
	slices.Sort(order)
	out := make([]BatchItem, 0, len(order))
	for _, r := range order {
		if it := byRepo[r]; it.NeedRepo || len(it.Roots) > 0 {
			out = append(out, *it)
		}
	}
	return out
}
