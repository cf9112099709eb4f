package planner

import (
	"encoding/binary"
	"encoding/hex"
	"slices"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
)

// RepoID, RootID and RelayID are interned identifiers. At design scale the
// planner tracks 2.5 M (stretch: 25 M) relay × root pairs; holding each as a
// 64-character hex string in per-relay hash sets would not fit in memory, so
// every repository, root event and relay gets a dense 32-bit id once and all
// per-relay state is kept in sorted id slices.
type (
	RepoID  uint32
	RootID  uint32
	RelayID uint32
)

// RootTable interns root event ids. The lookup map is keyed by the id's
// first 8 bytes (ids are sha256 hashes, so a prefix collision is
// astronomically rare) and a collision falls back to a full-id map, so two
// different roots are never merged.
type RootTable struct {
	byPrefix map[uint64]RootID
	overflow map[[32]byte]RootID
	ids      [][32]byte
}

// NewRootTable returns an empty table.
func NewRootTable() *RootTable {
	return &RootTable{byPrefix: map[uint64]RootID{}, overflow: map[[32]byte]RootID{}}
}

// Intern returns the id of a hex event id, adding it when new. ok is false
// for a string that is not a 64-character hex id.
func (t *RootTable) Intern(hexID string) (RootID, bool) {
	return t.internNear(hexID, nil)
}

// internNear is Intern that first looks in near (prefix → id of roots the
// caller expects, e.g. a repository's current roots): a small map stays in
// cache, where a lookup in the table's large one is a cache miss or two.
func (t *RootTable) internNear(hexID string, near map[uint64]RootID) (RootID, bool) {
	var raw [32]byte
	if len(hexID) != 64 {
		return 0, false
	}
	if _, err := hex.Decode(raw[:], []byte(hexID)); err != nil {
		return 0, false
	}
	p := binary.BigEndian.Uint64(raw[:8])
	if id, ok := near[p]; ok && t.ids[id] == raw {
		return id, true
	}
	if id, ok := t.byPrefix[p]; ok {
		if t.ids[id] == raw {
			return id, true
		}
		if id, ok := t.overflow[raw]; ok {
			return id, true
		}
		id := RootID(len(t.ids))
		t.ids = append(t.ids, raw)
		t.overflow[raw] = id
		return id, true
	}
	id := RootID(len(t.ids))
	t.ids = append(t.ids, raw)
	t.byPrefix[p] = id
	return id, true
}

// Hex returns the hex event id of an interned root.
func (t *RootTable) Hex(id RootID) string { return hex.EncodeToString(t.ids[id][:]) }

// Prefix returns the first 8 bytes of a root's id, big endian.
func (t *RootTable) Prefix(id RootID) uint64 { return binary.BigEndian.Uint64(t.ids[id][:8]) }

// Len is how many roots have been interned.
func (t *RootTable) Len() int { return len(t.ids) }

// Repo is one RepoSyncIndex entry in interned form.
type Repo struct {
	Ref        string
	Identifier string
	// Relays and Roots are sorted and free of duplicates.
	Relays []RelayID
	Roots  []RootID
	// Digest identifies the root set (sum of the roots' 8-byte prefixes), so
	// persisted "all roots confirmed" records can be checked after a restart.
	Digest uint64
	// Present is false once the repository left the index.
	Present bool
	// Maintainers are the repository's recursive maintainers other than
	// its owner, and Aliases the coordinates of their stored announcements
	// of it (sorted). Layer 2 asks for events tagging Ref or an alias; the
	// maintainers' announcements and states are read again with REQ
	// whenever the repository's own part is fetched (docs/decisions/0022-remembered-refusals-revived.md, docs/decisions/0023-maintainers-coordinates-layer-2.md).
	Maintainers []string
	Aliases     []string
}

// IndexChange is what one index update did to one repository, so the
// lifecycle can update only the affected relays.
type IndexChange struct {
	Repo RepoID
	// Relays lists every relay that listed the repository before or after.
	Relays        []RelayID
	RemovedRelays []RelayID
	// RemovedRoots are roots the repository no longer has (sorted).
	RemovedRoots []RootID
	// Regained: the repository gained a maintainer or a maintainer's
	// coordinate, so its own part (layer 2 and the maintainers'
	// announcements and states) must be fetched again from every relay.
	Regained bool
}

// Index is the planner's mirror of the RepoSyncIndex (KV grasp_repo_index),
// interned, with the relay → repositories inversion (DeriveRelayTargets)
// maintained incrementally as entries change.
type Index struct {
	Roots     *RootTable
	relayIDs  map[string]RelayID
	relayURLs []string
	repoIDs   map[string]RepoID
	repos     []Repo
	byKey     map[string]RepoID
	// targets is relay → repositories listing it.
	targets   map[RelayID]map[RepoID]struct{}
	bootstrap map[RelayID]bool
}

// NewIndex returns an empty index.
func NewIndex() *Index {
	return &Index{
		Roots:     NewRootTable(),
		relayIDs:  map[string]RelayID{},
		repoIDs:   map[string]RepoID{},
		byKey:     map[string]RepoID{},
		targets:   map[RelayID]map[RepoID]struct{}{},
		bootstrap: map[RelayID]bool{},
	}
}

// Relay interns a relay URL.
func (x *Index) Relay(url string) RelayID {
	if id, ok := x.relayIDs[url]; ok {
		return id
	}
	id := RelayID(len(x.relayURLs))
	x.relayURLs = append(x.relayURLs, url)
	x.relayIDs[url] = id
	return id
}

// RelayURL returns the URL of an interned relay.
func (x *Index) RelayURL(id RelayID) string { return x.relayURLs[id] }

// LookupRelay finds a relay's id without interning it.
func (x *Index) LookupRelay(url string) (RelayID, bool) {
	id, ok := x.relayIDs[url]
	return id, ok
}

// Repo returns an interned repository.
func (x *Index) Repo(id RepoID) *Repo { return &x.repos[id] }

// LookupRepo finds a repository by its coordinate.
func (x *Index) LookupRepo(ref string) (RepoID, bool) {
	id, ok := x.repoIDs[ref]
	return id, ok
}

// RepoCount is how many repositories are in the index now.
func (x *Index) RepoCount() int { return len(x.byKey) }

// TargetRepos returns the repositories that list a relay (unsorted view;
// do not modify).
func (x *Index) TargetRepos(relay RelayID) map[RepoID]struct{} { return x.targets[relay] }

// IsTarget reports whether a relay should be synced: a repository lists it
// or it is a bootstrap relay.
func (x *Index) IsTarget(relay RelayID) bool {
	return len(x.targets[relay]) > 0 || x.bootstrap[relay]
}

// IsBootstrap reports whether a relay is a bootstrap relay.
func (x *Index) IsBootstrap(relay RelayID) bool { return x.bootstrap[relay] }

// TargetRelays returns every relay that should be synced, sorted.
func (x *Index) TargetRelays() []RelayID {
	out := make([]RelayID, 0, len(x.targets)+len(x.bootstrap))
	for r, repos := range x.targets {
		if len(repos) > 0 {
			out = append(out, r)
		}
	}
	for r, b := range x.bootstrap {
		if b && len(x.targets[r]) == 0 {
			out = append(out, r)
		}
	}
	slices.Sort(out)
	return out
}

// SetBootstrap replaces the bootstrap relay set and returns the relays whose
// bootstrap flag changed.
func (x *Index) SetBootstrap(urls []string) []RelayID {
	next := map[RelayID]bool{}
	for _, u := range urls {
		next[x.Relay(u)] = true
	}
	var changed []RelayID
	for r := range x.bootstrap {
		if !next[r] {
			changed = append(changed, r)
		}
	}
	for r := range next {
		if !x.bootstrap[r] {
			changed = append(changed, r)
		}
	}
	x.bootstrap = next
	slices.Sort(changed)
	return changed
}

// Put applies one index entry (KV key → RepoSyncNeeds).
func (x *Index) Put(key string, needs *graspv1.RepoSyncNeeds) IndexChange {
	ref := needs.GetRepoRef()
	if old, ok := x.byKey[key]; ok && x.repos[old].Ref != ref {
		x.Delete(key) // the key now names another repository: unusual, but be exact
	}
	id, ok := x.repoIDs[ref]
	if !ok {
		id = RepoID(len(x.repos))
		ident := ""
		if r, ok := nip34.ParseRepoRef(ref); ok {
			ident = r.Identifier
		}
		x.repos = append(x.repos, Repo{Ref: ref, Identifier: ident})
		x.repoIDs[ref] = id
	}
	x.byKey[key] = id
	repo := &x.repos[id]

	relays := make([]RelayID, 0, len(needs.GetRelays()))
	for _, u := range needs.GetRelays() {
		relays = append(relays, x.Relay(u))
	}
	slices.Sort(relays)
	relays = slices.Compact(relays)
	// An update mostly repeats the repository's roots: look those up near.
	var near map[uint64]RootID
	if len(repo.Roots) > 0 {
		near = make(map[uint64]RootID, len(repo.Roots))
		for _, r := range repo.Roots {
			near[x.Roots.Prefix(r)] = r
		}
	}
	roots := make([]RootID, 0, len(needs.GetRootEventIds()))
	for _, h := range needs.GetRootEventIds() {
		if r, ok := x.Roots.internNear(h, near); ok {
			roots = append(roots, r)
		}
	}
	slices.Sort(roots)
	roots = slices.Compact(roots)
	maintainers := sortedSet(needs.GetMaintainers())
	aliases := sortedSet(needs.GetMaintainerRefs())
	regained := repo.Present && (len(minusStrings(maintainers, repo.Maintainers)) > 0 || len(minusStrings(aliases, repo.Aliases)) > 0)
	repo.Maintainers, repo.Aliases = maintainers, aliases
	ch := x.set(id, repo, relays, roots, true)
	ch.Regained = regained
	return ch
}

// sortedSet returns a sorted copy of values without duplicates (nil when
// empty).
func sortedSet(values []string) []string {
	if len(values) == 0 {
		return nil
	}
	out := slices.Clone(values)
	slices.Sort(out)
	return slices.Compact(out)
}

// minusStrings returns a − b for sorted slices.
func minusStrings(a, b []string) []string {
	var out []string
	for _, v := range a {
		if _, found := slices.BinarySearch(b, v); !found {
			out = append(out, v)
		}
	}
	return out
}

// Delete removes the entry under key.
func (x *Index) Delete(key string) IndexChange {
	id, ok := x.byKey[key]
	if !ok {
		return IndexChange{Repo: ^RepoID(0)}
	}
	delete(x.byKey, key)
	x.repos[id].Maintainers, x.repos[id].Aliases = nil, nil
	return x.set(id, &x.repos[id], nil, nil, false)
}

func (x *Index) set(id RepoID, repo *Repo, relays []RelayID, roots []RootID, present bool) IndexChange {
	ch := IndexChange{Repo: id}
	removedRelays := minus(repo.Relays, relays)
	ch.RemovedRelays = removedRelays
	ch.Relays = union(repo.Relays, relays)
	ch.RemovedRoots = minus(repo.Roots, roots)
	for _, r := range removedRelays {
		delete(x.targets[r], id)
		if len(x.targets[r]) == 0 {
			delete(x.targets, r)
		}
	}
	for _, r := range relays {
		m := x.targets[r]
		if m == nil {
			m = map[RepoID]struct{}{}
			x.targets[r] = m
		}
		m[id] = struct{}{}
	}
	repo.Relays, repo.Roots, repo.Present = relays, roots, present
	repo.Digest = x.digest(roots)
	return ch
}

func (x *Index) digest(roots []RootID) uint64 {
	var d uint64
	for _, r := range roots {
		d += x.Roots.Prefix(r)
	}
	return d
}

// DeriveRelayTargets inverts the index (repo → relays, roots) into relay →
// repositories from scratch. The Index keeps the same inversion up to date
// incrementally; this pure form is the reference it is checked against and
// what a full recompute measures. Bootstrap relays get an empty target, so
// they stay connected for layer 1. A relay's root events are the roots of
// its repositories.
func DeriveRelayTargets(repos []Repo, bootstrap []RelayID) map[RelayID][]RepoID {
	out := map[RelayID][]RepoID{}
	for _, b := range bootstrap {
		if _, ok := out[b]; !ok {
			out[b] = []RepoID{}
		}
	}
	for id := range repos {
		if !repos[id].Present {
			continue
		}
		for _, r := range repos[id].Relays {
			out[r] = append(out[r], RepoID(id))
		}
	}
	return out
}

// minus returns a − b for sorted slices.
func minus[T ~uint32](a, b []T) []T {
	var out []T
	i, j := 0, 0
	for i < len(a) {
		switch {
		case j >= len(b) || a[i] < b[j]:
			out = append(out, a[i])
			i++
		case a[i] == b[j]:
			i++
			j++
		default:
			j++
		}
	}
	return out
}

// union returns a ∪ b for sorted slices.
func union[T ~uint32](a, b []T) []T {
	out := make([]T, 0, len(a)+len(b))
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j >= len(b) || (i < len(a) && a[i] < b[j]):
			out = append(out, a[i])
			i++
		case i >= len(a) || b[j] < a[i]:
			out = append(out, b[j])
			j++
		default:
			out = append(out, a[i])
			i++
			j++
		}
	}
	return out
}

// intersect returns a ∩ b for sorted slices.
func intersect[T ~uint32](a, b []T) []T {
	var out []T
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		switch {
		case a[i] < b[j]:
			i++
		case b[j] < a[i]:
			j++
		default:
			out = append(out, a[i])
			i++
			j++
		}
	}
	return out
}

// missing returns target − x − y for sorted slices, where x and y are
// disjoint subsets of target (the confirmed and pending roots of a pair).
func missing[T ~uint32](target, x, y []T) []T {
	if len(x)+len(y) == len(target) {
		return nil
	}
	var out []T
	i, j := 0, 0
	for _, t := range target {
		for i < len(x) && x[i] < t {
			i++
		}
		for j < len(y) && y[j] < t {
			j++
		}
		if (i < len(x) && x[i] == t) || (j < len(y) && y[j] == t) {
			continue
		}
		out = append(out, t)
	}
	return out
}
