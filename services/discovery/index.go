package discovery

import (
	"slices"
	"sort"

	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/relayurl"
)

// RelayRules decides which relay URLs of an announcement sync may dial.
type RelayRules struct {
	// ServiceURL is this service's public relay URL, excluded as a target.
	ServiceURL string
	// Guard refuses internal addresses unless allowlisted.
	Guard relayurl.Guard
	// MaxPerAnnouncement bounds how many relays one announcement contributes.
	MaxPerAnnouncement int
	// ListsService reports whether an announcement lists this service in
	// both clone and relays (the policy's rule).
	ListsService func(*nostr.Event) bool
}

// Relays returns the normalised relay targets of an announcement: its
// relays values plus the relay of each GRASP-style clone URL, without this
// service and without refused URLs, sorted. refused counts what was dropped.
func (r RelayRules) Relays(a nip34.Announcement) (relays []string, refused map[string]int) {
	refused = map[string]int{}
	seen := map[string]bool{}
	add := func(raw string) {
		u, err := relayurl.Normalize(raw)
		if err != nil {
			refused["invalid"]++
			return
		}
		if seen[u] || relayurl.SameService(u, r.ServiceURL) {
			return
		}
		if err := r.Guard.CheckURL(u); err != nil {
			refused["private_address"]++
			return
		}
		if r.MaxPerAnnouncement > 0 && len(relays) >= r.MaxPerAnnouncement {
			refused["too_many"]++
			return
		}
		seen[u] = true
		relays = append(relays, u)
	}
	for _, raw := range a.Relays {
		add(raw)
	}
	for _, raw := range a.Clone {
		if u, ok := relayurl.FromCloneURL(raw); ok {
			add(u)
		}
	}
	sort.Strings(relays)
	return relays, refused
}

// RepoSyncIndex is discovery's view of what to sync: each hosted repository
// with its relays and root events. It is pure state; Apply folds events in
// and Entries renders the values written to the grasp_repo_index bucket.
type RepoSyncIndex struct {
	rules RelayRules
	// announcements holds the newest announcement seen per repository,
	// whether or not it lists us, so an older version never wins.
	announcements map[nip34.RepoRef]*nostr.Event
	// relays holds the targets of repositories that list this service.
	relays map[nip34.RepoRef][]string
	// roots holds root event ids per repository, including repositories not
	// (yet) hosted, so roots that arrive before their announcement attach.
	roots map[nip34.RepoRef]map[string]struct{}
	// Refused counts dropped relay URLs by reason, for metrics.
	Refused map[string]int
}

// NewRepoSyncIndex returns an empty index.
func NewRepoSyncIndex(rules RelayRules) *RepoSyncIndex {
	return &RepoSyncIndex{
		rules:         rules,
		announcements: map[nip34.RepoRef]*nostr.Event{},
		relays:        map[nip34.RepoRef][]string{},
		roots:         map[nip34.RepoRef]map[string]struct{}{},
		Refused:       map[string]int{},
	}
}

// Apply folds one event into the index and returns the repositories whose
// entry may have changed.
func (x *RepoSyncIndex) Apply(evt *nostr.Event) []nip34.RepoRef {
	switch {
	case evt.Kind == nip34.KindRepoAnnouncement:
		a, err := nip34.ParseAnnouncement(evt)
		if err != nil {
			return nil
		}
		if cur, ok := x.announcements[a.Ref]; ok && !newer(evt, cur) {
			return nil
		}
		x.announcements[a.Ref] = evt
		if x.rules.ListsService != nil && !x.rules.ListsService(evt) {
			delete(x.relays, a.Ref)
			return []nip34.RepoRef{a.Ref}
		}
		relays, refused := x.rules.Relays(a)
		for k, v := range refused {
			x.Refused[k] += v
		}
		x.relays[a.Ref] = relays
		return []nip34.RepoRef{a.Ref}
	case nip34.IsRootKind(evt.Kind):
		var changed []nip34.RepoRef
		for _, ref := range nip34.RepoRefsOf(evt) {
			set := x.roots[ref]
			if set == nil {
				set = map[string]struct{}{}
				x.roots[ref] = set
			}
			if _, ok := set[evt.ID]; !ok {
				set[evt.ID] = struct{}{}
				changed = append(changed, ref)
			}
		}
		return changed
	}
	return nil
}

func newer(a, b *nostr.Event) bool {
	return a.CreatedAt > b.CreatedAt || (a.CreatedAt == b.CreatedAt && a.ID < b.ID)
}

// Entry returns the index value for a repository, or nil when it is not
// hosted (no accepted announcement listing this service).
func (x *RepoSyncIndex) Entry(ref nip34.RepoRef) *graspv1.RepoSyncNeeds {
	relays, ok := x.relays[ref]
	if !ok {
		return nil
	}
	roots := make([]string, 0, len(x.roots[ref]))
	for id := range x.roots[ref] {
		roots = append(roots, id)
	}
	sort.Strings(roots)
	return &graspv1.RepoSyncNeeds{
		RepoRef:        ref.String(),
		Relays:         slices.Clone(relays),
		RootEventIds:   roots,
		AnnouncementId: x.announcements[ref].ID,
	}
}

// Hosted returns every hosted repository.
func (x *RepoSyncIndex) Hosted() []nip34.RepoRef {
	out := make([]nip34.RepoRef, 0, len(x.relays))
	for ref := range x.relays {
		out = append(out, ref)
	}
	return out
}
