package planner

import (
	"bytes"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/filters"
)

// split cuts items into batches of at most MaxBatchItems (repositories +
// roots); a repository with more roots than that is spread over batches.
func (m *Machine) split(items []BatchItem) [][]BatchItem {
	max := m.rules.MaxBatchItems
	if max <= 0 {
		return [][]BatchItem{items}
	}
	var out [][]BatchItem
	var cur []BatchItem
	size := 0
	for _, it := range items {
		need := it.NeedRepo
		roots := it.Roots
		for need || len(roots) > 0 {
			if size >= max {
				out, cur, size = append(out, cur), nil, 0
			}
			room := max - size
			part := BatchItem{Repo: it.Repo, NeedRepo: need}
			if need {
				room--
				size++
				need = false
			}
			k := min(room, len(roots))
			if k > 0 {
				part.Roots = roots[:k:k]
			}
			roots = roots[k:]
			size += k
			cur = append(cur, part)
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

func (m *Machine) countItems(items []BatchItem) int {
	refs, idents, roots := m.itemValues(items)
	slices.Sort(roots)
	return filters.CountItems(len(refs), len(idents), len(slices.Compact(roots)))
}

// itemValues collects the repository refs, identifiers and roots of items.
// roots is a fresh slice, unsorted.
func (m *Machine) itemValues(items []BatchItem) (refs, idents []string, roots []RootID) {
	for _, it := range items {
		if it.NeedRepo {
			repo := m.idx.Repo(it.Repo)
			refs = append(refs, repo.Ref)
			refs = append(refs, repo.Aliases...)
			if repo.Identifier != "" {
				idents = append(idents, repo.Identifier)
			}
		}
		roots = append(roots, it.Roots...)
	}
	slices.Sort(idents)
	return refs, slices.Compact(idents), roots
}

// hexOrder sorts roots into hex order without duplicates. Hex order is the
// order of the ids' bytes, so roots are sorted as integers keyed by the
// first 4 bytes of the id above the root's own id — a plain integer sort,
// several times faster than comparing through a function — and the rare
// runs sharing those 4 bytes are then ordered by the full id.
func (m *Machine) hexOrder(roots []RootID) []RootID {
	tab := m.idx.Roots
	keys := make([]uint64, len(roots))
	for i, r := range roots {
		keys[i] = tab.Prefix(r)>>32<<32 | uint64(r)
	}
	slices.Sort(keys)
	keys = slices.Compact(keys) // equal keys are the same root
	out := roots[:len(keys)]
	for i, k := range keys {
		out[i] = RootID(uint32(k))
	}
	for i := 0; i < len(keys); {
		j := i + 1
		for j < len(keys) && keys[j]>>32 == keys[i]>>32 {
			j++
		}
		if j-i > 1 {
			slices.SortFunc(out[i:j], func(a, b RootID) int {
				return bytes.Compare(tab.ids[a][:], tab.ids[b][:])
			})
		}
		i = j
	}
	return out
}

// startBatch sends one AddFilters: live (limit 0) unless the live set was
// just replaced, plus the historic part tracked as a PendingBatch. resync
// marks a daily resync's re-read of what was confirmed (PendingBatch.Resync).
func (m *Machine) startBatch(now time.Time, s *RelayState, kind BatchKind, items []BatchItem, since int64, withLive, resync bool) {
	m.seq++
	b := &PendingBatch{ID: strconv.FormatUint(m.epoch, 10) + "-" + strconv.FormatUint(m.seq, 10), Session: s.Session, Kind: kind, Items: items, Since: since, Started: now,
		Resync: resync, catchUpGen: s.catchUpGen}
	var fs []nostr.Filter
	refs, idents, roots := m.itemValues(items)
	hexes := m.hexes(m.hexOrder(roots))
	liveFrom := 0
	switch kind {
	case BatchLayer1:
		fs = m.layer1Filters()
	case BatchCatchUp:
		fs = filters.Items(refs, idents, hexes)
		if !s.hasBatch(BatchCatchUp) {
			// The first part of a catch-up (startCatchUp) re-reads layer 1.
			fs = append(m.layer1Filters(), fs...)
			if s.hasBatch(BatchLayer1) {
				liveFrom = len(m.layer1) // the layer-1 batch of this session opened it
			}
		}
	default:
		fs = filters.Items(refs, idents, hexes)
	}
	add := &graspv1.AddFilters{BatchId: b.ID, HistoricFilters: filters.ToProtos(fs), Layer1: kind == BatchLayer1, Resync: resync}
	if kind == BatchItems {
		add.RefetchFilters = filters.ToProtos(m.refetchFilters(items))
	}
	if since != 0 {
		add.Since = &since
	}
	if withLive && len(fs) > liveFrom {
		if s.liveFromHistoric {
			from := uint32(liveFrom)
			add.LiveFromHistoric = &from
		} else {
			add.LiveFilters = graspv1.LiveOf(add.HistoricFilters[liveFrom:])
		}
		add.LiveId = b.ID
		s.LiveFilters += len(fs) - liveFrom
		if kind == BatchItems {
			s.tail = append(s.tail, newLiveSet(b.ID, items, len(fs)))
		}
	}
	for _, it := range items {
		if kind == BatchItems {
			p := s.pair(it.Repo)
			if it.NeedRepo {
				p.RepoPending = true
			}
			p.Pending = union(p.Pending, it.Roots)
		}
	}
	add.RepoRefs = refs // the roots are in the #e filters (AddFilters.RootIDs)
	if len(refs) > 0 && len(refs) != countNeedRepo(items) {
		// The filters name maintainers' coordinates too; the batch covers
		// the repositories.
		add.RepoRefs = make([]string, 0, len(items))
		for _, it := range items {
			if it.NeedRepo {
				add.RepoRefs = append(add.RepoRefs, m.idx.Repo(it.Repo).Ref)
			}
		}
	}
	s.Batches = append(s.Batches, b)
	if kind == BatchItems {
		s.lastItems = now
	}
	s.QuietAt = time.Time{}
	if s.Status != graspv1.RelayStatus_RELAY_STATUS_DISCONNECTING {
		s.Status = graspv1.RelayStatus_RELAY_STATUS_SYNCING
	}
	m.dirty[s.ID] = true
	m.obs.BatchStarted(s.URL, kind)
	m.send(s, s.Session, &graspv1.FetchCommand{Command: &graspv1.FetchCommand_AddFilters{AddFilters: add}})
}

// startCatchUp starts the catch-up of layer 1 and items from since, in
// batches of at most MaxBatchItems items like any other. One command naming
// every confirmed item of a large relay would be unbounded: at design scale
// (5,000 roots, live and historic filters) it is ~2 MB, over NATS's 1 MiB
// payload limit, and the planner's term failed on its publish again and
// again. The first part carries layer 1; the catch-up ends when the last
// part of its generation completes (onBatchDone).
func (m *Machine) startCatchUp(now time.Time, s *RelayState, items []BatchItem, since int64, withLive bool) {
	parts := m.split(items)
	if len(parts) == 0 {
		parts = [][]BatchItem{nil} // layer 1 alone
	}
	for _, p := range parts {
		m.startBatch(now, s, BatchCatchUp, p, since, withLive, false)
	}
}

func countNeedRepo(items []BatchItem) int {
	n := 0
	for _, it := range items {
		if it.NeedRepo {
			n++
		}
	}
	return n
}

// refetchFilters asks for the announcements and states of the maintainers
// of the repositories whose own part items fetch, by author and identifier:
// the revival of refusals the ingester remembered while those authors
// maintained nothing we serve (docs/decisions/0022-remembered-refusals-revived.md).
func (m *Machine) refetchFilters(items []BatchItem) []nostr.Filter {
	var authors, idents []string
	for _, it := range items {
		if !it.NeedRepo {
			continue
		}
		repo := m.idx.Repo(it.Repo)
		if len(repo.Maintainers) == 0 || repo.Identifier == "" {
			continue
		}
		authors = append(authors, repo.Maintainers...)
		idents = append(idents, repo.Identifier)
	}
	return filters.Maintained(authors, idents)
}

// hexes encodes ids with two allocations: one string holding them all,
// sliced (substrings share its memory), built in place, and the slice.
func (m *Machine) hexes(ids []RootID) []string {
	var b strings.Builder
	b.Grow(64 * len(ids))
	var one [64]byte
	for _, id := range ids {
		hex.Encode(one[:], m.idx.Roots.ids[id][:])
		b.Write(one[:])
	}
	all := b.String()
	out := make([]string, len(ids))
	for i := range ids {
		out[i] = all[64*i : 64*i+64]
	}
	return out
}
