package planner

import (
	"slices"
	"time"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"
)

// PairState is what one relay has confirmed and has in flight for one
// repository that lists it. Root slices are sorted, disjoint, and subsets of
// the repository's current roots (the lifecycle prunes them when the index
// shrinks), so "nothing missing" is a length comparison.
type PairState struct {
	// RepoConfirmed: the repository's own history (layer 2, its 30618
	// state) has been fetched from the relay.
	RepoConfirmed bool
	// RepoPending: a batch fetching the repository's own history is in
	// flight.
	RepoPending bool
	Confirmed   []RootID
	Pending     []RootID
}

// BatchKind says what a PendingBatch fetches.
type BatchKind int

// Batch kinds.
const (
	// BatchLayer1 is the per-connection announcements batch, in full; when
	// it completes the relay's announcements are synced.
	BatchLayer1 BatchKind = iota + 1
	// BatchCatchUp re-reads layer 1 and the confirmed items from a since
	// (quick reconnect, resume after a planner restart, a live subscription
	// the relay closed); it confirms nothing new.
	BatchCatchUp
	// BatchItems fetches the full history of new items.
	BatchItems
)

func (k BatchKind) String() string {
	switch k {
	case BatchLayer1:
		return "layer1"
	case BatchCatchUp:
		return "catch_up"
	case BatchItems:
		return "items"
	}
	return "unknown"
}

// BatchItem is one repository's share of a batch: its own history (NeedRepo)
// and/or some of its roots.
type BatchItem struct {
	Repo     RepoID
	NeedRepo bool
	Roots    []RootID
}

// PendingBatch is a historic fetch in flight on one relay session. It is
// confirmed only when the fetcher reports every part done: the fetcher
// tracks the parts (filters, pages, negentropy rounds) and reports the method
// it used in BatchDone.
type PendingBatch struct {
	ID      string
	Session string
	Kind    BatchKind
	Items   []BatchItem
	Since   int64
	Started time.Time
	// Resync: a daily resync's re-read of what the relay had confirmed
	// before it; the events it finds that we lacked were missed by live
	// subscriptions and catch-ups (docs/sync.md, "Counting what the daily
	// resync finds").
	Resync bool
	// catchUpGen is the relay's catch-up generation a catch-up was issued
	// for; only that generation's completion ends the catch-up.
	catchUpGen int
}

// RelayState is the planner's knowledge of one relay: connection lifecycle
// (RelaySyncIndex) and batches in flight (PendingSyncIndex).
type RelayState struct {
	// limitBudget is the live filter budget the relay's limits allow, as
	// the fetcher reported it (0: unknown); Machine.budget.
	limitBudget int
	// liveFromHistoric: the fetcher holding the session reads
	// AddFilters.live_from_historic (Connected.live_from_historic), so a
	// batch's live part is sent as an index, not its filters again.
	liveFromHistoric bool

	ID        RelayID
	URL       string
	Status    graspv1.RelayStatus
	Session   string
	Bootstrap bool
	Pairs     map[RepoID]*PairState
	// Batches in flight on Session, in start order.
	Batches []*PendingBatch

	LastConnected  time.Time
	DisconnectedAt time.Time
	// LastSeen is the last time the current session showed it was alive.
	LastSeen time.Time
	// seenPersisted is the LastSeen of the record last taken to be
	// persisted (TakeDirty).
	seenPersisted       time.Time
	AnnouncementsSynced bool
	// LiveFilters is how many live filters are open on the session.
	LiveFilters int
	// CatchUpSince is the since of a catch-up that has not completed (unix
	// seconds; 0 none).
	CatchUpSince int64
	// catchUpGen counts changes of CatchUpSince: a catch-up issued before
	// the latest change does not end the catch-up.
	catchUpGen int
	NextResync time.Time
	// QuietAt is when the relay counts as synced if no batch starts before.
	QuietAt time.Time
	// HoldUntil delays retries after a failed batch.
	HoldUntil time.Time
	// lastItems is when the relay's last items batch started; heldSince
	// and heldTouched are when roots were first held back for a fuller
	// filter and when new ones last came (zero: none held; chunks.go).
	lastItems, heldSince, heldTouched time.Time
	// streamItems counts the items recomputes brought the relay since its
	// stream began (the first items after a pause): a large stream waits
	// Rules.ChunkStreamQuiet.
	streamItems int
	// Failures counts failed batches since the relay was last fully synced.
	Failures int
	Dead     bool

	// Incomplete counts the batches reported incomplete since the relay
	// was last fully synced (also counted in Failures); LastIncomplete is
	// the last one's report.
	Incomplete     int
	LastIncomplete string

	// ResyncMissed counts the events daily resyncs found on the relay that
	// live subscriptions and catch-ups had missed; LastMissedAt is when
	// one last did. Kept across sessions and resyncs.
	ResyncMissed uint64
	LastMissedAt time.Time

	// restored: loaded from grasp_relay_state by a new planner; the first
	// Connected decides between resume (same session) and reconnect.
	restored      bool
	resumeSession string
	// liveStale: the session's live subscriptions are not what this planner
	// would open (daily resync, resume after restart): the next emission
	// replaces them all. needsReplace: a live subscription was lost for
	// good, replace the live set now. trimLive: items were removed,
	// consolidate (deferred like a budget consolidation when the minimal
	// set is above the budget: stale subscriptions only cost the relay).
	liveStale    bool
	needsReplace bool
	trimLive     bool
	// deferredFor is the session a queued consolidation is for ("" none):
	// it is built only if the relay is still on that session, so a
	// consolidation never crosses a session change.
	deferredFor string
	// tail are the named live sets opened on Session since its last
	// ReplaceLive (items batches' and merges'), oldest first: a deferred
	// consolidation merges the smallest of them and closes them by name
	// (CloseLive) instead of replacing the relay's whole live set.
	tail []*liveSet
	// minLo ≤ (size of the minimal live set) ≤ minHi when minKnown: kept
	// as bounds so the exact size, which costs a pass over every pair, is
	// computed about once per consolidation instead of once per batch.
	minLo, minHi int
	minKnown     bool
}

// NewRelayState returns the state of a relay the planner has just learned of.
func NewRelayState(id RelayID, url string) *RelayState {
	return &RelayState{
		ID:     id,
		URL:    url,
		Status: graspv1.RelayStatus_RELAY_STATUS_DISCONNECTED,
		Pairs:  map[RepoID]*PairState{},
	}
}

// Connected reports whether the relay has a live session to send filters on.
func (s *RelayState) Connected() bool {
	switch s.Status {
	case graspv1.RelayStatus_RELAY_STATUS_SYNCING, graspv1.RelayStatus_RELAY_STATUS_CONNECTED,
		graspv1.RelayStatus_RELAY_STATUS_CONNECTED_HISTORIC_SYNC_FAILURES,
		graspv1.RelayStatus_RELAY_STATUS_DISCONNECTING:
		return s.Session != ""
	}
	return false
}

func (s *RelayState) pair(repo RepoID) *PairState {
	p := s.Pairs[repo]
	if p == nil {
		p = &PairState{}
		s.Pairs[repo] = p
	}
	return p
}

func (s *RelayState) hasBatch(kind BatchKind) bool {
	for _, b := range s.Batches {
		if b.Kind == kind {
			return true
		}
	}
	return false
}

// Counts returns confirmed and pending repositories and roots (pairs; a
// root shared by two repositories counts twice).
func (s *RelayState) Counts() (repos, roots, pendRepos, pendRoots int) {
	for _, p := range s.Pairs {
		if p.RepoConfirmed {
			repos++
		}
		if p.RepoPending {
			pendRepos++
		}
		roots += len(p.Confirmed)
		pendRoots += len(p.Pending)
	}
	return
}

// ActionKind says what an Action asks for.
type ActionKind int

// Action kinds.
const (
	// ActionEnsureConnected: a target relay the planner does not track yet.
	ActionEnsureConnected ActionKind = iota + 1
	// ActionAddFilters: a connected relay has target items neither pending
	// nor confirmed.
	ActionAddFilters
	// ActionDropRelay: a tracked relay that is no longer a target and has
	// nothing in flight.
	ActionDropRelay
	// ActionDisconnectLater: no longer a target, but batches are in flight;
	// it is dropped once they end.
	ActionDisconnectLater
)

// Action is one decision of ComputeActions.
type Action struct {
	Kind  ActionKind
	Relay RelayID
	// Items are the new items to fetch (ActionAddFilters), sorted by repo.
	Items []BatchItem
}

// ComputeActions is the reconcile step, target − pending − confirmed per
// relay, over the relays in scope (nil: every target and tracked relay). It
// is pure: it reads the index and relay states and returns decisions,
// changing nothing. Relays that are not connected get their items when they
// connect; relays held back after a failed batch (now < HoldUntil) get them
// when the hold ends.
func ComputeActions(idx *Index, relays map[RelayID]*RelayState, scope []RelayID, now time.Time) []Action {
	return ComputeActionsIn(idx, relays, Scope{Relays: scope}, now)
}

// Scope narrows ComputeActionsIn: the relays to decide for (Relays nil:
// every target and tracked relay) and, per relay, the only repositories
// whose items can have changed since the last decision (a relay absent from
// Repos: all of its repositories). A discovery batch touches a few of each
// relay's repositories; diffing only those keeps its recompute proportional
// to the change rather than to the relays' size.
type Scope struct {
	Relays []RelayID
	// Repos lists, per relay, sorted repositories to diff.
	Repos map[RelayID][]RepoID
}

// ComputeActionsIn is ComputeActions over a Scope. Pure, like it.
func ComputeActionsIn(idx *Index, relays map[RelayID]*RelayState, sc Scope, now time.Time) []Action {
	scope := sc.Relays
	if scope == nil {
		scope = idx.TargetRelays()
		for id := range relays {
			scope = append(scope, id)
		}
		slices.Sort(scope)
		scope = slices.Compact(scope)
	}
	var actions []Action
	for _, id := range scope {
		s, tracked := relays[id]
		if !idx.IsTarget(id) {
			if !tracked {
				continue
			}
			if s.Connected() && len(s.Batches) > 0 {
				if s.Status != graspv1.RelayStatus_RELAY_STATUS_DISCONNECTING {
					actions = append(actions, Action{Kind: ActionDisconnectLater, Relay: id})
				}
				continue
			}
			actions = append(actions, Action{Kind: ActionDropRelay, Relay: id})
			continue
		}
		if !tracked {
			actions = append(actions, Action{Kind: ActionEnsureConnected, Relay: id})
			continue
		}
		if !s.Connected() || now.Before(s.HoldUntil) {
			continue
		}
		var items []BatchItem
		if repos, ok := sc.Repos[id]; ok {
			items = MissingItemsOf(idx, s, repos)
		} else {
			items = MissingItems(idx, s)
		}
		if len(items) > 0 {
			actions = append(actions, Action{Kind: ActionAddFilters, Relay: id, Items: items})
		}
	}
	return actions
}

// MissingItems is the three-way diff for one relay: for each repository
// listing it, the repository itself and its roots that are neither pending
// nor confirmed.
func MissingItems(idx *Index, s *RelayState) []BatchItem {
	targets := idx.TargetRepos(s.ID)
	repos := make([]RepoID, 0, len(targets))
	for r := range targets {
		repos = append(repos, r)
	}
	slices.Sort(repos)
	return missingItems(idx, s, repos)
}

// MissingItemsOf is MissingItems restricted to repos (sorted, no
// duplicates); those no longer listing the relay are skipped.
func MissingItemsOf(idx *Index, s *RelayState, repos []RepoID) []BatchItem {
	targets := idx.TargetRepos(s.ID)
	listed := make([]RepoID, 0, len(repos))
	for _, r := range repos {
		if _, ok := targets[r]; ok {
			listed = append(listed, r)
		}
	}
	return missingItems(idx, s, listed)
}

func missingItems(idx *Index, s *RelayState, repos []RepoID) []BatchItem {
	var items []BatchItem
	for _, r := range repos {
		roots := idx.Repo(r).Roots
		p := s.Pairs[r]
		if p == nil {
			items = append(items, BatchItem{Repo: r, NeedRepo: true, Roots: slices.Clone(roots)})
			continue
		}
		need := !p.RepoConfirmed && !p.RepoPending
		miss := missing(roots, p.Confirmed, p.Pending)
		if need || len(miss) > 0 {
			items = append(items, BatchItem{Repo: r, NeedRepo: need, Roots: miss})
		}
	}
	return items
}
