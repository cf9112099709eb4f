package planner

import (
	"slices"
	"time"

	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/filters"
)

// Machine is the planner's whole decision state: the index mirror, every
// relay's lifecycle and its batches. It is pure: inputs are index changes,
// fetcher reports and the time, passed in; outputs are fetch commands
// (Drain) and changed relay records (TakeDirty). No I/O, no goroutines, no
// clock of its own, so table tests can assert exact commands.
type Machine struct {
	rules  Rules
	idx    *Index
	relays map[RelayID]*RelayState
	epoch  uint64
	seq    uint64
	// liveSeq numbers live-only sets (liveID).
	liveSeq uint64
	// jitter returns a number in [0,1) for the daily resync spread.
	jitter func() float64
	obs    Observer

	out     []*graspv1.FetchCommand
	dirty   map[RelayID]bool
	dropped []string
	// affected: relays touched since the last Recompute, each with the
	// repositories whose items may have changed (nil: all of them). Bounded
	// by the relays and the repositories listing them.
	affected      map[RelayID]map[RepoID]struct{}
	nextHeartbeat time.Time

	// deferred is the queue of relays with a consolidation due, oldest
	// first; queued holds its members, so a relay is in it at most once and
	// the queue is bounded by the tracked relays. Whether a member still
	// needs it is decided when it is built (RelayState.deferredFor).
	deferred      []RelayID
	queued        map[RelayID]bool
	consolidateAt time.Time

	// seen is exactMinimal's scratch bitmap over interned root ids.
	seen []uint64
	// layer1 is the per-connection layer: filters.Base, plus the relay
	// lists of an archive's whitelisted maintainers (SetArchiveAuthors).
	layer1 []nostr.Filter
}

// SetArchiveAuthors adds to layer 1 the relay lists (10002) of the
// maintainers an archive's whitelist names (GRASP-05): they say where those
// maintainers publish, and discovery looks for their announcements there.
// Call it before the first command.
func (m *Machine) SetArchiveAuthors(pubkeys []string) {
	m.layer1 = append([]nostr.Filter{filters.Base()}, filters.RelayLists(pubkeys)...)
}

// layer1Filters returns a copy of layer 1's filters.
func (m *Machine) layer1Filters() []nostr.Filter { return slices.Clone(m.layer1) }

// NewMachine returns a machine for one leadership epoch. jitter must return
// values in [0,1); obs may be nil.
func NewMachine(rules Rules, idx *Index, epoch uint64, jitter func() float64, obs Observer) *Machine {
	if obs == nil {
		obs = nopObserver{}
	}
	return &Machine{
		rules: rules, idx: idx, relays: map[RelayID]*RelayState{}, epoch: epoch,
		jitter: jitter, obs: obs, dirty: map[RelayID]bool{}, affected: map[RelayID]map[RepoID]struct{}{}, queued: map[RelayID]bool{},
		layer1: []nostr.Filter{filters.Base()},
	}
}

// Index returns the machine's index mirror.
func (m *Machine) Index() *Index { return m.idx }

// Relays returns the tracked relays (read only).
func (m *Machine) Relays() map[RelayID]*RelayState { return m.relays }

// Drain returns the commands decided since the last call, in order.
func (m *Machine) Drain() []*graspv1.FetchCommand {
	out := m.out
	m.out = nil
	return out
}

// TakeDirty returns the relays whose persisted record changed and the URLs
// of relays dropped since the last call.
func (m *Machine) TakeDirty() (changed []*RelayState, dropped []string) {
	ids := make([]RelayID, 0, len(m.dirty))
	for id := range m.dirty {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if s, ok := m.relays[id]; ok {
			changed = append(changed, s)
			s.seenPersisted = s.LastSeen
		}
	}
	clear(m.dirty)
	dropped, m.dropped = m.dropped, nil
	return changed, dropped
}

// ApplyIndex records index changes: removed relays and roots leave the
// relays' confirmed and pending state at once (removal), and every relay
// the changes touch is recomputed by the next Recompute.
func (m *Machine) ApplyIndex(changes []IndexChange) {
	for _, ch := range changes {
		for _, r := range ch.Relays {
			m.touch(r, ch.Repo)
		}
		for _, r := range ch.RemovedRelays {
			if s, ok := m.relays[r]; ok {
				if p, had := s.Pairs[ch.Repo]; had {
					delete(s.Pairs, ch.Repo)
					s.trimLive = true
					s.lowerMin(1, len(p.Confirmed)+len(p.Pending))
					m.dirty[r] = true
				}
				stripBatches(s, ch.Repo, nil)
			}
		}
		if ch.Regained {
			m.refetchRepo(ch.Repo)
		}
		if len(ch.RemovedRoots) == 0 {
			continue
		}
		for _, r := range m.idx.Repo(ch.Repo).Relays {
			s, ok := m.relays[r]
			if !ok {
				continue
			}
			stripBatches(s, ch.Repo, ch.RemovedRoots)
			p := s.Pairs[ch.Repo]
			if p == nil {
				continue
			}
			c, q := minus(p.Confirmed, ch.RemovedRoots), minus(p.Pending, ch.RemovedRoots)
			if gone := len(p.Confirmed) + len(p.Pending) - len(c) - len(q); gone > 0 {
				p.Confirmed, p.Pending = c, q
				s.trimLive = true
				s.lowerMin(0, gone)
				m.dirty[r] = true
			}
		}
	}
}

// refetchRepo makes a repository's own part (layer 2 with its maintainers'
// coordinates, its states, its maintainers' announcements and states) due
// again on every relay listing it: it gained a maintainer or a maintainer's
// coordinate, whose events were never asked for — or were refused and
// remembered while the author maintained nothing we serve. A batch in flight
// for it asked without them, so its completion must not confirm it.
func (m *Machine) refetchRepo(repo RepoID) {
	for _, r := range m.idx.Repo(repo).Relays {
		s, ok := m.relays[r]
		if !ok {
			continue
		}
		p := s.Pairs[repo]
		if p == nil || (!p.RepoConfirmed && !p.RepoPending) {
			continue
		}
		p.RepoConfirmed, p.RepoPending = false, false
		for _, b := range s.Batches {
			for i := range b.Items {
				if b.Items[i].Repo == repo {
					b.Items[i].NeedRepo = false
				}
			}
		}
		s.lowerMin(1, 0)
		m.dirty[r] = true
	}
}

// stripBatches removes a repository (roots nil) or some of its roots from
// the relay's batches in flight. Their live subscriptions are dropped by the
// consolidation that follows a removal, so if the items are listed again
// before the batch ends, its completion must not confirm them: they get a
// new batch, live and full history.
func stripBatches(s *RelayState, repo RepoID, roots []RootID) {
	for _, b := range s.Batches {
		kept := b.Items[:0:0]
		for _, it := range b.Items {
			if it.Repo == repo {
				if roots == nil {
					continue
				}
				it.Roots = minus(it.Roots, roots)
			}
			kept = append(kept, it)
		}
		b.Items = kept
	}
}

// SetBootstrap applies a new bootstrap relay list.
func (m *Machine) SetBootstrap(urls []string) {
	for _, r := range m.idx.SetBootstrap(urls) {
		m.affected[r] = nil // the whole relay
		if s, ok := m.relays[r]; ok {
			s.Bootstrap = m.idx.IsBootstrap(r)
			m.dirty[r] = true
		}
	}
}

// touch records that the relay's items for repo may have changed, unless
// the whole relay is already due.
func (m *Machine) touch(r RelayID, repo RepoID) {
	set, ok := m.affected[r]
	switch {
	case !ok:
		m.affected[r] = map[RepoID]struct{}{repo: {}}
	case set != nil:
		set[repo] = struct{}{}
	}
}

// Recompute runs ComputeActions once — over every relay when full, else
// over the relay × repository pairs touched since the last Recompute — and
// turns its decisions into commands. The planner calls it once per
// discovery batch. Diffing only the touched pairs is enough: every other
// way items go missing (a connect, the end of a hold, a daily resync)
// diffs the whole relay itself.
func (m *Machine) Recompute(now time.Time, full bool) {
	var scope Scope
	if !full {
		scope.Relays = make([]RelayID, 0, len(m.affected))
		scope.Repos = make(map[RelayID][]RepoID, len(m.affected))
		for r, set := range m.affected {
			scope.Relays = append(scope.Relays, r)
			if set != nil {
				repos := make([]RepoID, 0, len(set))
				for repo := range set {
					repos = append(repos, repo)
				}
				slices.Sort(repos)
				scope.Repos[r] = repos
			}
		}
		slices.Sort(scope.Relays)
	}
	clear(m.affected)
	m.execute(now, ComputeActionsIn(m.idx, m.relays, scope, now))
	if full {
		scope.Relays = m.sortedRelays()
	}
	for _, id := range scope.Relays {
		if s, ok := m.relays[id]; ok {
			m.finish(now, s)
		}
	}
}

func (m *Machine) sortedRelays() []RelayID {
	ids := make([]RelayID, 0, len(m.relays))
	for id := range m.relays {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (m *Machine) execute(now time.Time, actions []Action) {
	for _, a := range actions {
		switch a.Kind {
		case ActionEnsureConnected:
			s := NewRelayState(a.Relay, m.idx.RelayURL(a.Relay))
			s.Status = graspv1.RelayStatus_RELAY_STATUS_CONNECTING
			s.Bootstrap = m.idx.IsBootstrap(a.Relay)
			m.relays[a.Relay] = s
			m.dirty[a.Relay] = true
			m.send(s, "", &graspv1.FetchCommand{Command: &graspv1.FetchCommand_EnsureConnected{EnsureConnected: &graspv1.EnsureConnected{}}})
		case ActionAddFilters:
			s := m.relays[a.Relay]
			m.emitItems(now, s, m.holdPartial(now, s, a.Items))
		case ActionDisconnectLater:
			s := m.relays[a.Relay]
			s.Status = graspv1.RelayStatus_RELAY_STATUS_DISCONNECTING
			m.dirty[a.Relay] = true
		case ActionDropRelay:
			m.drop(m.relays[a.Relay], "no repository lists this relay")
		}
	}
}

func (m *Machine) drop(s *RelayState, reason string) {
	m.send(s, "", &graspv1.FetchCommand{Command: &graspv1.FetchCommand_DropRelay{DropRelay: &graspv1.DropRelay{Reason: reason}}})
	delete(m.relays, s.ID)
	delete(m.dirty, s.ID)
	m.dropped = append(m.dropped, s.URL)
}

// finish completes a relay's recompute: retries of the connection-level
// batches once any hold has ended, and a pending replacement of its live
// subscriptions.
func (m *Machine) finish(now time.Time, s *RelayState) {
	if !s.Connected() {
		return
	}
	if s.Status == graspv1.RelayStatus_RELAY_STATUS_DISCONNECTING && m.idx.IsTarget(s.ID) {
		// Listed again before its last batches ended: keep it.
		s.Status = graspv1.RelayStatus_RELAY_STATUS_SYNCING
		if len(s.Batches) == 0 {
			s.QuietAt = now.Add(m.rules.QuietPeriod)
		}
		m.dirty[s.ID] = true
	}
	if !now.Before(s.HoldUntil) {
		if !s.AnnouncementsSynced && !s.hasBatch(BatchLayer1) {
			m.startBatch(now, s, BatchLayer1, nil, 0, false, false)
		}
		if s.CatchUpSince != 0 && !s.hasBatch(BatchCatchUp) {
			// Confirmed and pending items: a pending item's live
			// subscription may have been among those lost.
			if items := m.liveItems(s, nil); s.AnnouncementsSynced || len(items) > 0 {
				m.startCatchUp(now, s, items, s.CatchUpSince, false)
			} else {
				s.CatchUpSince = 0 // layer 1 in full covers it
			}
		}
	}
	switch {
	case s.liveStale || s.needsReplace:
		m.replaceLive(s, nil)
	case s.trimLive:
		if m.deferring() && m.minimalAbove(s) {
			m.deferConsolidation(now, s)
		} else {
			m.replaceLive(s, nil)
		}
	}
	if s.Status == graspv1.RelayStatus_RELAY_STATUS_CONNECTED_HISTORIC_SYNC_FAILURES && len(s.Batches) == 0 && s.QuietAt.IsZero() {
		// The failed items may have left the target: look again.
		s.QuietAt = now.Add(m.rules.QuietPeriod)
	}
}

func (m *Machine) send(s *RelayState, session string, cmd *graspv1.FetchCommand) {
	cmd.RelayUrl = s.URL
	cmd.SessionId = session
	cmd.Epoch = m.epoch
	m.out = append(m.out, cmd)
}
