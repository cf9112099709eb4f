package discovery

import (
	"encoding/hex"
	"errors"
	"slices"
	"sort"

	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/relayurl"
)

// Reasons a relay URL of an announcement is refused, the label values of
// the refused-URL metric.
const (
	RefusedScheme      = "scheme"          // not ws:// or wss://
	RefusedCredentials = "credentials"     // user:password@ in the URL
	RefusedTooLong     = "too_long"        // longer than relayurl.MaxLength
	RefusedMalformed   = "malformed"       // not a URL, or a bad host
	RefusedInternal    = "private_address" // loopback, private, link-local, CGNAT, metadata…
	RefusedTooMany     = "too_many"        // beyond the per-announcement bound
)

// refusalReason maps a relayurl error to its metric label.
func refusalReason(err error) string {
	switch {
	case errors.Is(err, relayurl.ErrScheme):
		return RefusedScheme
	case errors.Is(err, relayurl.ErrCredentials):
		return RefusedCredentials
	case errors.Is(err, relayurl.ErrTooLong):
		return RefusedTooLong
	case errors.Is(err, relayurl.ErrPrivateAddress):
		return RefusedInternal
	default:
		return RefusedMalformed
	}
}

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
// service and without refused URLs, sorted. refused counts what was dropped,
// by reason (the Refused* constants). Clone URLs that are not GRASP-style
// (github.com …) are not relays and are not counted as refused.
func (r RelayRules) Relays(a nip34.Announcement) (relays []string, refused map[string]int) {
	refused = map[string]int{}
	seen := map[string]bool{}
	add := func(raw string) {
		u, err := relayurl.Normalize(raw)
		if err != nil {
			refused[refusalReason(err)]++
			return
		}
		if seen[u] || relayurl.SameService(u, r.ServiceURL) {
			return
		}
		if err := r.Guard.CheckURL(u); err != nil {
			refused[refusalReason(err)]++
			return
		}
		if r.MaxPerAnnouncement > 0 && len(relays) >= r.MaxPerAnnouncement {
			refused[RefusedTooMany]++
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

// DefaultMaxTombstones bounds the deletions an index remembers for events it
// has not seen (yet).
const DefaultMaxTombstones = 100_000

// RepoSyncIndex is discovery's view of what to sync: each hosted repository
// with its relays and root events. It is pure state; Apply folds events in
// and Entry renders the values written to the grasp_repo_index bucket.
//
// The result does not depend on the order events are applied in (as long as
// fewer than MaxTombstones deletions are pending for unseen events): the
// newest announcement version of a repository is the one in force, and the
// repository is hosted when that version lists this service and is not
// deleted (NIP-09, by its author: an "e" tag naming it, or an "a" tag naming
// the coordinate with a created_at not older than it). Root events (1617,
// 1618, 1621) attach to every repository they tag with an "a" tag, whether it
// is hosted yet or not, unless their author deleted them.
type RepoSyncIndex struct {
	rules RelayRules
	// announcements holds the newest announcement seen per repository,
	// whether or not it lists us or is deleted, so an older version never
	// wins.
	announcements map[nip34.RepoRef]*nostr.Event
	// current maps the id of each announcement in announcements to its
	// repository, so an "e" deletion finds it without a scan.
	current map[string]nip34.RepoRef
	// byIdent holds the repositories in announcements per identifier: a
	// hosted repository's maintainers are found among the announcements
	// with its identifier, so a change to any of them may change its entry.
	byIdent map[string]map[nip34.RepoRef]struct{}
	// targets holds the relay targets of the current announcement of each
	// repository that lists this service (computed once per version).
	targets map[nip34.RepoRef][]string
	// hosted holds the repositories whose entry is in force.
	hosted map[nip34.RepoRef]struct{}
	// roots holds root event ids per repository, including repositories not
	// (yet) hosted, so roots that arrive before their announcement attach.
	// Ids are kept as 32 bytes, not 64 hex digits: at design scale the
	// index holds every root of every repository for as long as it runs
	// (docs/measurements/2026-12-04-design-scale-memory.md).
	roots map[nip34.RepoRef]*rootSet
	// rootRefs remembers which repositories each root tags, so a deletion
	// can detach it: the first in rootRefs, any others (rare: a root
	// tagging several repositories) in moreRefs.
	rootRefs map[eventKey]rootInfo
	moreRefs map[eventKey][]*rootSet
	// deletedUntil is, per repository, the newest created_at of an "a"
	// deletion by its owner: versions up to then are deleted.
	deletedUntil map[nip34.RepoRef]nostr.Timestamp
	// tombs holds "<id>:<author>" of events deleted by "e" tags, so a
	// deleted event that arrives after its deletion stays deleted. Bounded;
	// the oldest are forgotten first.
	tombs     map[string]struct{}
	tombOrder []string
	// MaxTombstones bounds tombs (DefaultMaxTombstones when 0).
	MaxTombstones int
	// Refused counts dropped relay URLs by reason, for metrics. Each
	// announcement version is counted once, when it comes into force.
	Refused map[string]int
}

// eventKey is an event id or public key as its 32 bytes.
type eventKey [32]byte

// keyOf decodes a 64-digit lowercase hex id or public key; ok is false for
// anything else (a stored event's id and author are always such).
func keyOf(s string) (k eventKey, ok bool) {
	if !nip34.IsEventID(s) {
		return k, false
	}
	_, err := hex.Decode(k[:], []byte(s))
	return k, err == nil
}

// rootSet is one repository's roots. A set leaves roots only when its
// last root is deleted, and a deletion removes its root from every set and
// from rootRefs, so no rootInfo names a set no longer in roots.
type rootSet struct {
	ref nip34.RepoRef
	ids map[eventKey]struct{}
}

// rootInfo is what a deletion needs of a root: its author and the first
// repository it tags.
type rootInfo struct {
	author eventKey
	set    *rootSet
}

// NewRepoSyncIndex returns an empty index.
func NewRepoSyncIndex(rules RelayRules) *RepoSyncIndex {
	return &RepoSyncIndex{
		rules:         rules,
		announcements: map[nip34.RepoRef]*nostr.Event{},
		current:       map[string]nip34.RepoRef{},
		byIdent:       map[string]map[nip34.RepoRef]struct{}{},
		targets:       map[nip34.RepoRef][]string{},
		hosted:        map[nip34.RepoRef]struct{}{},
		roots:         map[nip34.RepoRef]*rootSet{},
		rootRefs:      map[eventKey]rootInfo{},
		moreRefs:      map[eventKey][]*rootSet{},
		deletedUntil:  map[nip34.RepoRef]nostr.Timestamp{},
		tombs:         map[string]struct{}{},
		Refused:       map[string]int{},
	}
}

// Apply folds one event into the index and returns the repositories whose
// entry may have changed.
func (x *RepoSyncIndex) Apply(evt *nostr.Event) []nip34.RepoRef {
	var changed []nip34.RepoRef
	switch {
	case evt.Kind == nip34.KindRepoAnnouncement:
		changed = x.applyAnnouncement(evt)
	case nip34.IsRootKind(evt.Kind):
		changed = x.applyRoot(evt)
	case evt.Kind == nip34.KindDeletion:
		changed = x.applyDeletion(evt)
	}
	return x.withSameIdentifier(changed)
}

// withSameIdentifier adds to changed the hosted repositories with the
// identifier of a changed one: a maintainer's announcement, its deletion or
// a root tagging its coordinate changes the entry of every hosted
// repository it may belong to (see maintainersOf).
func (x *RepoSyncIndex) withSameIdentifier(changed []nip34.RepoRef) []nip34.RepoRef {
	n := len(changed)
	for i := 0; i < n; i++ {
		for ref := range x.byIdent[changed[i].Identifier] {
			if _, hosted := x.hosted[ref]; hosted && ref != changed[i] && !slices.Contains(changed, ref) {
				changed = append(changed, ref)
			}
		}
	}
	return changed
}

func (x *RepoSyncIndex) applyAnnouncement(evt *nostr.Event) []nip34.RepoRef {
	a, err := nip34.ParseAnnouncement(evt)
	if err != nil {
		return nil
	}
	if cur, ok := x.announcements[a.Ref]; ok {
		if !newer(evt, cur) {
			return nil
		}
		delete(x.current, cur.ID)
	}
	x.announcements[a.Ref] = evt
	x.current[evt.ID] = a.Ref
	if x.byIdent[a.Ref.Identifier] == nil {
		x.byIdent[a.Ref.Identifier] = map[nip34.RepoRef]struct{}{}
	}
	x.byIdent[a.Ref.Identifier][a.Ref] = struct{}{}
	delete(x.targets, a.Ref)
	if x.rules.ListsService == nil || x.rules.ListsService(evt) {
		relays, refused := x.rules.Relays(a)
		for k, v := range refused {
			x.Refused[k] += v
		}
		x.targets[a.Ref] = relays
	}
	x.update(a.Ref)
	return []nip34.RepoRef{a.Ref}
}

func (x *RepoSyncIndex) applyRoot(evt *nostr.Event) []nip34.RepoRef {
	id, ok := keyOf(evt.ID)
	author, ok2 := keyOf(evt.PubKey)
	if !ok || !ok2 {
		return nil
	}
	if _, ok := x.rootRefs[id]; ok || x.tombstoned(evt.ID, evt.PubKey) {
		return nil
	}
	refs := nip34.RepoRefsOf(evt)
	if len(refs) == 0 {
		return nil
	}
	info := rootInfo{author: author}
	var more []*rootSet
	var changed []nip34.RepoRef
	for i, ref := range refs {
		set := x.roots[ref]
		if set == nil {
			set = &rootSet{ref: ref, ids: map[eventKey]struct{}{}}
			x.roots[ref] = set
		}
		if i == 0 {
			info.set = set
		} else {
			more = append(more, set)
		}
		if _, ok := set.ids[id]; !ok {
			set.ids[id] = struct{}{}
			changed = append(changed, ref)
		}
	}
	x.rootRefs[id] = info
	if len(more) > 0 {
		x.moreRefs[id] = more
	}
	return changed
}

// applyDeletion applies a NIP-09 deletion: only events (e) and coordinates
// (a) of its own author are affected.
func (x *RepoSyncIndex) applyDeletion(evt *nostr.Event) []nip34.RepoRef {
	var changed []nip34.RepoRef
	for _, tag := range evt.Tags {
		if len(tag) < 2 {
			continue
		}
		switch tag[0] {
		case "e":
			if !nip34.IsEventID(tag[1]) {
				continue
			}
			x.tombstone(tag[1], evt.PubKey)
			id, _ := keyOf(tag[1])
			author, _ := keyOf(evt.PubKey)
			if info, ok := x.rootRefs[id]; ok && info.author == author {
				delete(x.rootRefs, id)
				for _, set := range append([]*rootSet{info.set}, x.moreRefs[id]...) {
					delete(set.ids, id)
					if len(set.ids) == 0 {
						delete(x.roots, set.ref)
					}
					changed = append(changed, set.ref)
				}
				delete(x.moreRefs, id)
			}
			if ref, ok := x.current[tag[1]]; ok && x.announcements[ref].PubKey == evt.PubKey {
				x.update(ref)
				changed = append(changed, ref)
			}
		case "a":
			ref, ok := nip34.ParseRepoRef(tag[1])
			if !ok || ref.PubKey != evt.PubKey {
				continue
			}
			if evt.CreatedAt > x.deletedUntil[ref] {
				x.deletedUntil[ref] = evt.CreatedAt
				x.update(ref)
				changed = append(changed, ref)
			}
		}
	}
	return changed
}

// update recomputes whether a repository is hosted.
func (x *RepoSyncIndex) update(ref nip34.RepoRef) {
	cur := x.announcements[ref]
	_, lists := x.targets[ref]
	if cur == nil || !lists || x.deleted(ref, cur) {
		delete(x.hosted, ref)
		return
	}
	x.hosted[ref] = struct{}{}
}

func (x *RepoSyncIndex) deleted(ref nip34.RepoRef, evt *nostr.Event) bool {
	if until, ok := x.deletedUntil[ref]; ok && evt.CreatedAt <= until {
		return true
	}
	return x.tombstoned(evt.ID, evt.PubKey)
}

func (x *RepoSyncIndex) tombstoned(id, author string) bool {
	_, ok := x.tombs[id+":"+author]
	return ok
}

func (x *RepoSyncIndex) tombstone(id, author string) {
	key := id + ":" + author
	if _, ok := x.tombs[key]; ok {
		return
	}
	x.tombs[key] = struct{}{}
	x.tombOrder = append(x.tombOrder, key)
	limit := x.MaxTombstones
	if limit <= 0 {
		limit = DefaultMaxTombstones
	}
	for len(x.tombOrder) > limit {
		delete(x.tombs, x.tombOrder[0])
		x.tombOrder = x.tombOrder[1:]
	}
}

// newer orders versions of one addressable event the way NIP-01 does: the
// later created_at wins, and on a tie the lower id.
func newer(a, b *nostr.Event) bool {
	return a.CreatedAt > b.CreatedAt || (a.CreatedAt == b.CreatedAt && a.ID < b.ID)
}

// Entry returns the index value for a repository, or nil when it is not
// hosted (no announcement in force that lists this service).
func (x *RepoSyncIndex) Entry(ref nip34.RepoRef) *graspv1.RepoSyncNeeds {
	if _, ok := x.hosted[ref]; !ok {
		return nil
	}
	maintainers, aliases := x.maintainersOf(ref)
	set := map[eventKey]struct{}{}
	if rs := x.roots[ref]; rs != nil {
		for id := range rs.ids {
			set[id] = struct{}{}
		}
	}
	refs := make([]string, len(aliases))
	for i, a := range aliases {
		refs[i] = a.String()
		if rs := x.roots[a]; rs != nil {
			for id := range rs.ids {
				set[id] = struct{}{}
			}
		}
	}
	roots := make([]string, 0, len(set))
	for id := range set {
		roots = append(roots, hex.EncodeToString(id[:]))
	}
	sort.Strings(roots)
	sort.Strings(refs)
	return &graspv1.RepoSyncNeeds{
		RepoRef:        ref.String(),
		Relays:         slices.Clone(x.targets[ref]),
		RootEventIds:   roots,
		AnnouncementId: x.announcements[ref].ID,
		Maintainers:    maintainers,
		MaintainerRefs: refs,
	}
}

// MaxMaintainers bounds the recursive maintainer set of one repository.
const MaxMaintainers = 100

// maintainersOf returns a hosted repository's recursive maintainers other
// than its owner (sorted): the "maintainers" of its announcement and, for
// each maintainer whose announcement with the same identifier is here and
// not deleted, that announcement's, cycle-safe and bounded by
// MaxMaintainers. aliases are the repositories (coordinates) of those
// maintainers' announcements: events tagging them are about this
// repository too (docs/decisions/0023-maintainers-coordinates-layer-2.md).
func (x *RepoSyncIndex) maintainersOf(ref nip34.RepoRef) (maintainers []string, aliases []nip34.RepoRef) {
	seen := map[string]bool{ref.PubKey: true}
	queue := []*nostr.Event{x.announcements[ref]}
	for len(queue) > 0 && len(maintainers) < MaxMaintainers {
		a, err := nip34.ParseAnnouncement(queue[0])
		queue = queue[1:]
		if err != nil {
			continue
		}
		for _, m := range a.Maintainers {
			if seen[m] || !nip34.IsPubKey(m) || len(maintainers) >= MaxMaintainers {
				continue
			}
			seen[m] = true
			maintainers = append(maintainers, m)
			mref := nip34.RepoRef{PubKey: m, Identifier: ref.Identifier}
			if evt := x.announcements[mref]; evt != nil && !x.deleted(mref, evt) {
				aliases = append(aliases, mref)
				queue = append(queue, evt)
			}
		}
	}
	sort.Strings(maintainers)
	return maintainers, aliases
}

// Hosted returns every hosted repository.
func (x *RepoSyncIndex) Hosted() []nip34.RepoRef {
	out := make([]nip34.RepoRef, 0, len(x.hosted))
	for ref := range x.hosted {
		out = append(out, ref)
	}
	return out
}

// Stats summarises the hosted part of the index, for metrics.
type Stats struct {
	// Repos is the number of hosted repositories.
	Repos int
	// RootEvents is the number of root events attached to hosted
	// repositories (one root tagging two repositories counts twice).
	RootEvents int
	// Relays is the number of distinct relays hosted repositories list.
	Relays int
}

// Stats computes the summary; it walks every hosted repository.
func (x *RepoSyncIndex) Stats() Stats {
	relays := map[string]struct{}{}
	st := Stats{Repos: len(x.hosted)}
	for ref := range x.hosted {
		if rs := x.roots[ref]; rs != nil {
			st.RootEvents += len(rs.ids)
		}
		for _, r := range x.targets[ref] {
			relays[r] = struct{}{}
		}
	}
	st.Relays = len(relays)
	return st
}
