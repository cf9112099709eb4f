package discovery

import (
	"encoding/hex"
	"slices"
	"sort"
	"strings"

	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/policy"
)

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
	// repository that lists this service or is an archive candidate
	// (computed once per version).
	targets map[nip34.RepoRef][]string
	// hosted holds the repositories whose entry is in force, archived
	// ones included.
	hosted map[nip34.RepoRef]struct{}
	// archiveMatch holds, for each current announcement that does not
	// list this service but matches the archive settings, how it matches
	// (its targets are computed too).
	archiveMatch map[nip34.RepoRef]policy.ArchiveMatch
	// archived holds the repositories in hosted that are archived
	// (GRASP-05), and openArchived those of them counted against
	// rules.MaxArchived, in the order they were admitted.
	archived     map[nip34.RepoRef]struct{}
	openArchived map[nip34.RepoRef]struct{}
	// overLimit holds archive candidates left out because MaxArchived
	// open archives were already admitted; OverLimitTotal counts each
	// time a repository started waiting there. freed is set when an open
	// archive left, so the waiting ones are looked at again.
	overLimit      map[nip34.RepoRef]struct{}
	OverLimitTotal int
	freed          bool
	// graspLists holds the newest user grasp list (10317) and relay list
	// (10002) of each pubkey the archive whitelist names, by kind and
	// pubkey: the GRASP servers and relays they publish to are where their
	// announcements are looked for (ArchiveRelays).
	graspLists  map[listKey]*nostr.Event
	whitelisted map[string]bool
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
	x := newRepoSyncIndex(rules)
	for _, pk := range rules.Archive.Whitelist.Pubkeys() {
		x.whitelisted[pk] = true
	}
	return x
}

func newRepoSyncIndex(rules RelayRules) *RepoSyncIndex {
	return &RepoSyncIndex{
		rules:         rules,
		announcements: map[nip34.RepoRef]*nostr.Event{},
		current:       map[string]nip34.RepoRef{},
		byIdent:       map[string]map[nip34.RepoRef]struct{}{},
		targets:       map[nip34.RepoRef][]string{},
		hosted:        map[nip34.RepoRef]struct{}{},
		archiveMatch:  map[nip34.RepoRef]policy.ArchiveMatch{},
		archived:      map[nip34.RepoRef]struct{}{},
		openArchived:  map[nip34.RepoRef]struct{}{},
		overLimit:     map[nip34.RepoRef]struct{}{},
		graspLists:    map[listKey]*nostr.Event{},
		whitelisted:   map[string]bool{},
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
	case evt.Kind == nip34.KindUserGraspList, evt.Kind == nip34.KindRelayList:
		x.applyGraspList(evt)
	}
	changed = x.recheckArchives(changed)
	changed = x.admitWaiting(changed)
	return x.withSameIdentifier(changed)
}

// admitWaiting gives the places open archives left to the candidates
// waiting in overLimit, in coordinate order (deterministic), and adds those
// admitted to changed.
func (x *RepoSyncIndex) admitWaiting(changed []nip34.RepoRef) []nip34.RepoRef {
	if !x.freed {
		return changed
	}
	x.freed = false
	if len(x.overLimit) == 0 || len(x.openArchived) >= x.rules.MaxArchived {
		return changed
	}
	waiting := make([]nip34.RepoRef, 0, len(x.overLimit))
	for ref := range x.overLimit {
		waiting = append(waiting, ref)
	}
	slices.SortFunc(waiting, func(a, b nip34.RepoRef) int { return strings.Compare(a.String(), b.String()) })
	for _, ref := range waiting {
		if len(x.openArchived) >= x.rules.MaxArchived {
			break
		}
		x.update(ref)
		if _, in := x.hosted[ref]; in && !slices.Contains(changed, ref) {
			changed = append(changed, ref)
		}
	}
	return changed
}

// recheckArchives recomputes the archive candidates sharing an identifier
// with a changed repository: whether one is an archived repository of its
// own or a maintainer's coordinate of a hosted one depends on the hosted
// announcements with its identifier.
func (x *RepoSyncIndex) recheckArchives(changed []nip34.RepoRef) []nip34.RepoRef {
	if len(x.archiveMatch) == 0 {
		return changed
	}
	n := len(changed)
	done := map[string]bool{}
	for i := 0; i < n; i++ {
		d := changed[i].Identifier
		if done[d] {
			continue
		}
		done[d] = true
		for ref := range x.byIdent[d] {
			if _, cand := x.archiveMatch[ref]; !cand {
				continue
			}
			_, before := x.hosted[ref]
			x.update(ref)
			if _, after := x.hosted[ref]; after != before && !slices.Contains(changed, ref) {
				changed = append(changed, ref)
			}
		}
	}
	return changed
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
	x.announcements[a.Ref] = slimAnnouncement(evt)
	x.current[evt.ID] = a.Ref
	if x.byIdent[a.Ref.Identifier] == nil {
		x.byIdent[a.Ref.Identifier] = map[nip34.RepoRef]struct{}{}
	}
	x.byIdent[a.Ref.Identifier][a.Ref] = struct{}{}
	delete(x.targets, a.Ref)
	delete(x.archiveMatch, a.Ref)
	lists := x.rules.ListsService == nil || x.rules.ListsService(evt)
	if !lists {
		if m := x.rules.Archive.Match(a.Ref.PubKey, a.Ref.Identifier); m != policy.ArchiveNone && nip34.ValidIdentifier(a.Ref.Identifier) {
			x.archiveMatch[a.Ref] = m
		}
	}
	if _, archive := x.archiveMatch[a.Ref]; lists || archive {
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

// update recomputes whether a repository has an entry: hosted (its
// announcement lists us) or archived (it matches the archive settings, is
// not a maintainer's coordinate of a hosted repository with its identifier,
// and, when matched only by an identifier or GRASP_ARCHIVE_ALL, is within
// rules.MaxArchived: the first admitted stay, later ones wait until one
// leaves).
func (x *RepoSyncIndex) update(ref nip34.RepoRef) {
	cur := x.announcements[ref]
	_, targeted := x.targets[ref]
	match, archive := x.archiveMatch[ref]
	leave := func() {
		if _, open := x.openArchived[ref]; open {
			x.freed = true
		}
		delete(x.hosted, ref)
		delete(x.archived, ref)
		delete(x.openArchived, ref)
		delete(x.overLimit, ref)
	}
	if cur == nil || !targeted || x.deleted(ref, cur) {
		leave()
		return
	}
	if !archive {
		leave()
		x.hosted[ref] = struct{}{}
		return
	}
	if x.maintainsHosted(ref) {
		leave()
		return
	}
	if match == policy.ArchiveOpen {
		if _, in := x.openArchived[ref]; !in {
			if len(x.openArchived) >= x.rules.MaxArchived {
				if _, counted := x.overLimit[ref]; !counted {
					x.OverLimitTotal++
				}
				delete(x.hosted, ref)
				delete(x.archived, ref)
				x.overLimit[ref] = struct{}{}
				return
			}
			x.openArchived[ref] = struct{}{}
		}
	} else if _, open := x.openArchived[ref]; open {
		delete(x.openArchived, ref)
		x.freed = true
	}
	delete(x.overLimit, ref)
	x.archived[ref] = struct{}{}
	x.hosted[ref] = struct{}{}
}

// maintainsHosted reports whether ref's author is a recursive maintainer of
// a hosted (not archived) repository with ref's identifier: ref is then
// that repository's maintainer coordinate, synced with it, not an archive.
func (x *RepoSyncIndex) maintainsHosted(ref nip34.RepoRef) bool {
	for other := range x.byIdent[ref.Identifier] {
		if other == ref {
			continue
		}
		if _, h := x.hosted[other]; !h {
			continue
		}
		if _, a := x.archived[other]; a {
			continue
		}
		ms, _ := x.maintainersOf(other)
		if slices.Contains(ms, ref.PubKey) {
			return true
		}
	}
	return false
}

// slimAnnouncement is what the index keeps of an announcement: what newer,
// deleted, Entry and maintainersOf read of it (id, author, time, kind, its
// identifier and maintainers). Its relays are read once, when it is
// applied. The decoded event's content, signature and other tags were
// ~8 MB of the heap at rest at 10,000 repositories
// (docs/measurements/2026-12-06-issue32-local-set-reads.md).
func slimAnnouncement(evt *nostr.Event) *nostr.Event {
	slim := &nostr.Event{ID: evt.ID, PubKey: evt.PubKey, CreatedAt: evt.CreatedAt, Kind: evt.Kind}
	n := 1
	for _, tag := range evt.Tags {
		if len(tag) >= 2 && tag[0] == "maintainers" {
			n++
		}
	}
	slim.Tags = make(nostr.Tags, 0, n)
	if d := evt.Tags.GetD(); d != "" {
		slim.Tags = append(slim.Tags, nostr.Tag{"d", d})
	}
	for _, tag := range evt.Tags {
		if len(tag) >= 2 && tag[0] == "maintainers" {
			slim.Tags = append(slim.Tags, tag)
		}
	}
	return slim
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
	_, archived := x.archived[ref]
	return &graspv1.RepoSyncNeeds{
		Archived:       archived,
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
	// Repos is the number of repositories with an entry (hosted and
	// archived).
	Repos int
	// Archived is how many of them are archived (GRASP-05), and
	// OverLimit the archive candidates left out by MaxArchived.
	Archived, OverLimit int
	// RootEvents is the number of root events attached to hosted
	// repositories (one root tagging two repositories counts twice).
	RootEvents int
	// Relays is the number of distinct relays hosted repositories list.
	Relays int
}

// Stats computes the summary; it walks every hosted repository.
func (x *RepoSyncIndex) Stats() Stats {
	relays := map[string]struct{}{}
	st := Stats{Repos: len(x.hosted), Archived: len(x.archived), OverLimit: len(x.overLimit)}
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
