package planner

import (
	"sort"
	"time"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"
)

// RelayTarget is what one relay should be synced for: the repositories that
// list it and the root events of those repositories.
type RelayTarget struct {
	Repos map[string]struct{}
	Roots map[string]struct{}
}

// DeriveRelayTargets inverts the RepoSyncIndex (repo → relays, roots) into
// relay → {repos, roots}. Bootstrap relays get an empty target, so they stay
// connected for layer 1.
func DeriveRelayTargets(index map[string]*graspv1.RepoSyncNeeds, bootstrap []string) map[string]*RelayTarget {
	out := map[string]*RelayTarget{}
	get := func(relay string) *RelayTarget {
		t := out[relay]
		if t == nil {
			t = &RelayTarget{Repos: map[string]struct{}{}, Roots: map[string]struct{}{}}
			out[relay] = t
		}
		return t
	}
	for _, b := range bootstrap {
		get(b)
	}
	for _, needs := range index {
		for _, relay := range needs.GetRelays() {
			t := get(relay)
			t.Repos[needs.GetRepoRef()] = struct{}{}
			for _, root := range needs.GetRootEventIds() {
				t.Roots[root] = struct{}{}
			}
		}
	}
	return out
}

// PendingBatch is a historic fetch in flight on one relay session.
type PendingBatch struct {
	ID      string
	Layer1  bool
	Repos   []string
	Roots   []string
	Started time.Time
}

// RelayState is the planner's observed state of one relay.
type RelayState struct {
	URL            string
	Status         graspv1.RelayStatus
	Session        string
	Bootstrap      bool
	ConfirmedRepos map[string]struct{}
	ConfirmedRoots map[string]struct{}
	Pending        map[string]*PendingBatch
	LastConnected  time.Time
	DisconnectedAt time.Time
	// BatchFailures counts failed batches of the current session.
	BatchFailures int
}

// NewRelayState returns the state of a relay the planner has just learned of.
func NewRelayState(url string) *RelayState {
	return &RelayState{
		URL:            url,
		Status:         graspv1.RelayStatus_RELAY_STATUS_DISCONNECTED,
		ConfirmedRepos: map[string]struct{}{},
		ConfirmedRoots: map[string]struct{}{},
		Pending:        map[string]*PendingBatch{},
	}
}

// connected reports whether the relay has a live session to send filters on.
func (s *RelayState) connected() bool {
	switch s.Status {
	case graspv1.RelayStatus_RELAY_STATUS_SYNCING, graspv1.RelayStatus_RELAY_STATUS_CONNECTED,
		graspv1.RelayStatus_RELAY_STATUS_CONNECTED_HISTORIC_SYNC_FAILURES:
		return s.Session != ""
	}
	return false
}

func (s *RelayState) pendingItems() (repos, roots map[string]struct{}) {
	repos, roots = map[string]struct{}{}, map[string]struct{}{}
	for _, b := range s.Pending {
		for _, r := range b.Repos {
			repos[r] = struct{}{}
		}
		for _, r := range b.Roots {
			roots[r] = struct{}{}
		}
	}
	return repos, roots
}

// ActionKind says what an Action asks the fetcher to do.
type ActionKind int

// Action kinds.
const (
	ActionEnsureConnected ActionKind = iota + 1
	ActionAddFilters
	ActionDropRelay
)

// Action is one decision of ComputeActions.
type Action struct {
	Kind  ActionKind
	Relay string
	// Repos and Roots are the new items to fetch (ActionAddFilters).
	Repos []string
	Roots []string
}

// ComputeActions is the reconcile step: for each relay, target − pending −
// confirmed. It is pure: it reads the targets and relay states and returns
// decisions, changing nothing.
//
//   - a target relay the planner does not track yet → EnsureConnected;
//   - a connected relay with target items neither pending nor confirmed →
//     AddFilters with exactly those items (relays that are not connected get
//     theirs when they connect);
//   - a tracked relay that is no longer a target → DropRelay, unless it is a
//     bootstrap relay or its first batches are still pending.
func ComputeActions(targets map[string]*RelayTarget, relays map[string]*RelayState) []Action {
	var actions []Action
	for _, url := range sortedKeys(targets) {
		t := targets[url]
		s, ok := relays[url]
		if !ok {
			actions = append(actions, Action{Kind: ActionEnsureConnected, Relay: url})
			continue
		}
		if !s.connected() {
			continue
		}
		pendRepos, pendRoots := s.pendingItems()
		repos := missing(t.Repos, pendRepos, s.ConfirmedRepos)
		roots := missing(t.Roots, pendRoots, s.ConfirmedRoots)
		if len(repos) > 0 || len(roots) > 0 {
			actions = append(actions, Action{Kind: ActionAddFilters, Relay: url, Repos: repos, Roots: roots})
		}
	}
	for _, url := range sortedKeys(relays) {
		s := relays[url]
		if _, ok := targets[url]; ok || s.Bootstrap {
			continue
		}
		if s.connected() && len(s.ConfirmedRepos) == 0 && len(s.Pending) > 0 {
			continue // never drop a relay whose first batches are pending
		}
		actions = append(actions, Action{Kind: ActionDropRelay, Relay: url})
	}
	return actions
}

func missing(target, pending, confirmed map[string]struct{}) []string {
	var out []string
	for item := range target {
		if _, ok := pending[item]; ok {
			continue
		}
		if _, ok := confirmed[item]; ok {
			continue
		}
		out = append(out, item)
	}
	sort.Strings(out)
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
