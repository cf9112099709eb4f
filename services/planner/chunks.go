package planner

import (
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/filters"
)

// Roots in full filters (docs/decisions/0061-planner-roots-in-full-filters.md).
//
// Every recompute that finds new roots for a relay starts a batch for them,
// and a batch costs the relay at least one REQ per filter (#e, #E and #q per
// 100 roots) plus its live REQ, however few roots it names. During an
// initial sync the roots arrive as the ingester stores the events naming
// them, so how many batches a relay gets followed how the stored stream was
// spread in time: the five services on PostgreSQL, whose ingester commits
// in batches spaced beyond discovery's 150 ms quiet period, sent six times
// the single process's REQs for the same world. Holding a relay's roots that
// do not fill a filter while more keep coming makes the batches follow the
// roots' number instead.

// holdPartial returns the part of items to start now: the repositories'
// own parts and the roots that fill whole filters (100 of either; a
// repository's part is its #a, #A, #q and #d filters). The rest stay missing
// (neither pending nor confirmed) and go with the next roots, once the
// relay has had none for ChunkQuiet, or ChunkMaxWait after the first was
// held (Tick, flushHeld). Roots arriving after a pause go at once.
func (m *Machine) holdPartial(now time.Time, s *RelayState, items []BatchItem) []BatchItem {
	if m.rules.ChunkQuiet <= 0 {
		return items
	}
	// The stream's items are counted over pauses shorter than the large
	// stream's quiet, so a stream that arrives in index batches a
	// discovery window apart grows large.
	paused := s.lastItems.IsZero() || now.Sub(s.lastItems) >= max(m.rules.ChunkQuiet, m.rules.ChunkStreamQuiet)
	if s.heldSince.IsZero() && paused {
		s.streamItems = 0
	}
	s.streamItems += countItems(items)
	if s.heldSince.IsZero() && (s.lastItems.IsZero() || now.Sub(s.lastItems) >= m.chunkQuiet(s)) {
		return items // not in a stream: at once
	}
	if !s.heldSince.IsZero() {
		// Those held before, wherever the recompute looked.
		items = MissingItems(m.idx, s)
	}
	roots, repos := 0, 0
	for _, it := range items {
		roots += len(it.Roots)
		if it.NeedRepo {
			repos++
		}
	}
	full := roots / filters.ChunkSize * filters.ChunkSize
	fullRepos := repos / filters.ChunkSize * filters.ChunkSize
	if (full == roots && fullRepos == repos) || (!s.heldSince.IsZero() && now.Sub(s.heldSince) >= m.rules.ChunkMaxWait) {
		s.heldSince, s.heldTouched = time.Time{}, time.Time{}
		return items
	}
	if s.heldSince.IsZero() {
		s.heldSince = now
	}
	s.heldTouched = now
	out := make([]BatchItem, 0, len(items))
	left, repoLeft := full, fullRepos
	for _, it := range items {
		k := min(left, len(it.Roots))
		left -= k
		need := it.NeedRepo && repoLeft > 0
		if need {
			repoLeft--
		}
		if !need && k == 0 {
			continue
		}
		part := BatchItem{Repo: it.Repo, NeedRepo: need}
		if k > 0 {
			part.Roots = it.Roots[:k:k]
		}
		out = append(out, part)
	}
	return out
}

// chunkQuiet is the pause that ends the relay's stream: ChunkStreamQuiet
// once the stream is large, ChunkQuiet before.
func (m *Machine) chunkQuiet(s *RelayState) time.Duration {
	if m.rules.ChunkStreamItems > 0 && s.streamItems >= m.rules.ChunkStreamItems {
		return max(m.rules.ChunkQuiet, m.rules.ChunkStreamQuiet)
	}
	return m.rules.ChunkQuiet
}

// countItems is how many repositories' own parts and roots items name.
func countItems(items []BatchItem) int {
	n := 0
	for _, it := range items {
		n += len(it.Roots)
		if it.NeedRepo {
			n++
		}
	}
	return n
}

// heldDue is when a relay's held roots go (zero: none held).
func (m *Machine) heldDue(s *RelayState) time.Time {
	if s.heldSince.IsZero() {
		return time.Time{}
	}
	due := s.heldTouched.Add(m.chunkQuiet(s))
	if limit := s.heldSince.Add(m.rules.ChunkMaxWait); limit.Before(due) {
		due = limit
	}
	return due
}

// flushHeld starts the relay's held roots (with anything else missing)
// once they are due.
func (m *Machine) flushHeld(now time.Time, s *RelayState) {
	due := m.heldDue(s)
	if due.IsZero() || now.Before(due) {
		return
	}
	s.heldSince, s.heldTouched = time.Time{}, time.Time{}
	if !s.Connected() || now.Before(s.HoldUntil) {
		return // the end of the hold or the next session asks for them
	}
	m.emitItems(now, s, MissingItems(m.idx, s))
}
