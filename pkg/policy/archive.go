package policy

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip19"

	"github.com/grasp-sync/grasp-sync/pkg/config"
	"github.com/grasp-sync/grasp-sync/pkg/nip34"
)

// Archive holds the GRASP-05 settings (GRASP_ARCHIVE_*): which repositories
// whose announcements do not list this service are accepted anyway, as an
// archive or mirror, and then synced like hosted ones (docs/policy.md,
// "Archives (GRASP-05)"). The relay, the ingester, discovery and the planner
// read the same variables, so they agree on what is archived.
type Archive struct {
	// Whitelist names what to archive, comma-separated: npub1… (every repository of that maintainer), npub1…/identifier (one repository), or identifier (that identifier from any author — risky: anyone can publish an announcement with it, so such repositories count against GRASP_ARCHIVE_MAX_REPOS). An invalid npub stops start-up.
	Whitelist ArchiveWhitelist `envconfig:"ARCHIVE_WHITELIST"`
	// All archives every announcement found, whoever publishes it (risky: such repositories count against GRASP_ARCHIVE_MAX_REPOS).
	All bool `envconfig:"ARCHIVE_ALL"`
}

// ArchiveMatch says whether, and how, an announcement's author and
// identifier match the archive settings.
type ArchiveMatch int

// Outcomes of Archive.Match.
const (
	// ArchiveNone: not archived.
	ArchiveNone ArchiveMatch = iota
	// ArchivePinned: matched by an npub or npub/identifier entry. The
	// operator named the maintainer, so such repositories are always
	// synced.
	ArchivePinned
	// ArchiveOpen: matched only by an identifier entry or by
	// GRASP_ARCHIVE_ALL, which anyone can satisfy by publishing an
	// announcement; discovery syncs at most GRASP_ARCHIVE_MAX_REPOS of
	// them.
	ArchiveOpen
)

// Enabled reports whether anything is archived.
func (a Archive) Enabled() bool { return a.All || !a.Whitelist.Empty() }

// Match decides whether the repository of pubkey (hex) with identifier d is
// archived. Pure: it looks at the settings only.
func (a Archive) Match(pubkey, d string) ArchiveMatch {
	w := a.Whitelist
	if w.pubkeys[pubkey] || w.repos[pubkey+"/"+d] {
		return ArchivePinned
	}
	if a.All || w.identifiers[d] {
		return ArchiveOpen
	}
	return ArchiveNone
}

// NamesAuthor reports whether an npub or npub/identifier entry names
// pubkey: the archive then keeps that author's relay list (10002), which
// says where to look for their announcements.
func (a Archive) NamesAuthor(pubkey string) bool {
	w := a.Whitelist
	if w.pubkeys[pubkey] {
		return true
	}
	for r := range w.repos {
		if pk, _, _ := strings.Cut(r, "/"); pk == pubkey {
			return true
		}
	}
	return false
}

// String is a canonical rendering of the settings, equal for equal
// settings (graspd compares the services' copies with it).
func (a Archive) String() string {
	return fmt.Sprintf("whitelist=%s all=%t", a.Whitelist.String(), a.All)
}

// Curation describes what is mirrored, for NIP-11's curation field: empty
// when nothing is.
func (a Archive) Curation() string {
	if !a.Enabled() {
		return ""
	}
	if a.All {
		return "GRASP-05 archive: every repository announcement found, whoever publishes it, besides the repositories that list this service"
	}
	var parts []string
	if n := len(a.Whitelist.pubkeys); n > 0 {
		parts = append(parts, fmt.Sprintf("every repository of %d maintainer(s)", n))
	}
	if n := len(a.Whitelist.repos); n > 0 {
		parts = append(parts, fmt.Sprintf("%d named repository(ies)", n))
	}
	if n := len(a.Whitelist.identifiers); n > 0 {
		parts = append(parts, fmt.Sprintf("repositories named %s from any author", strings.Join(sortedKeys(a.Whitelist.identifiers), ", ")))
	}
	return "GRASP-05 archive of " + strings.Join(parts, "; ") + ", besides the repositories that list this service"
}

// ArchiveWhitelist is the parsed GRASP_ARCHIVE_WHITELIST. The zero value
// archives nothing.
type ArchiveWhitelist struct {
	pubkeys     map[string]bool // hex pubkeys: every repository of theirs
	repos       map[string]bool // "<hex pubkey>/<identifier>"
	identifiers map[string]bool // an identifier from any author
	entries     []string        // canonical entries, sorted, for String
}

// ParseArchiveWhitelist parses a comma-separated list of npub1…,
// npub1…/identifier and identifier entries. Blank entries are ignored; an
// entry that starts with npub1 and does not decode, or an unsafe
// identifier, is an error naming the entry.
func ParseArchiveWhitelist(s string) (ArchiveWhitelist, error) {
	var w ArchiveWhitelist
	for _, raw := range strings.Split(s, ",") {
		e := strings.TrimSpace(raw)
		if e == "" {
			continue
		}
		key, d, hasD := strings.Cut(e, "/")
		if !strings.HasPrefix(key, "npub1") {
			if !nip34.ValidIdentifier(e) {
				return ArchiveWhitelist{}, fmt.Errorf("%q is neither npub1…, npub1…/identifier nor a repository identifier", e)
			}
			w.add(&w.identifiers, e, e)
			continue
		}
		prefix, v, err := nip19.Decode(key)
		pk, ok := v.(string)
		if err != nil || prefix != "npub" || !ok || !nip34.IsPubKey(pk) {
			return ArchiveWhitelist{}, fmt.Errorf("%q is not a valid npub", key)
		}
		if !hasD {
			w.add(&w.pubkeys, pk, key)
			continue
		}
		if !nip34.ValidIdentifier(d) {
			return ArchiveWhitelist{}, fmt.Errorf("%q: %q is not a valid repository identifier", e, d)
		}
		w.add(&w.repos, pk+"/"+d, key+"/"+d)
	}
	slices.Sort(w.entries)
	w.entries = slices.Compact(w.entries)
	return w, nil
}

func (w *ArchiveWhitelist) add(set *map[string]bool, key, entry string) {
	if *set == nil {
		*set = map[string]bool{}
	}
	(*set)[key] = true
	w.entries = append(w.entries, entry)
}

// Decode implements envconfig.Decoder, so a wrong entry stops start-up
// with one line naming GRASP_ARCHIVE_WHITELIST.
func (w *ArchiveWhitelist) Decode(s string) error {
	v, err := ParseArchiveWhitelist(s)
	if err != nil {
		return config.InvalidValue(err.Error())
	}
	*w = v
	return nil
}

// UnmarshalText is Decode for encoding.TextUnmarshaler users: it tells
// tools that walk configuration structs (deploy/validate) that the type is
// read from one string.
func (w *ArchiveWhitelist) UnmarshalText(b []byte) error { return w.Decode(string(b)) }

// String renders the entries, sorted, comma-separated.
func (w ArchiveWhitelist) String() string { return strings.Join(w.entries, ",") }

// Empty reports whether the whitelist names nothing.
func (w ArchiveWhitelist) Empty() bool { return len(w.entries) == 0 }

// Pubkeys returns the hex pubkeys the whitelist names (alone or with an
// identifier), sorted: discovery looks for their relay and GRASP lists.
func (w ArchiveWhitelist) Pubkeys() []string {
	set := map[string]bool{}
	for pk := range w.pubkeys {
		set[pk] = true
	}
	for r := range w.repos {
		pk, _, _ := strings.Cut(r, "/")
		set[pk] = true
	}
	return sortedKeys(set)
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// ArchiveOnly reports whether an event the policy accepted is about a
// repository held here only as an archive (GRASP-05), not one that lists
// us: the relay refuses such client writes when archives are read-only,
// since their events must come from the relays the announcement lists. ref
// names the archived repository. An event is about an archived repository
// when it is that repository's announcement or state (its author is not in
// the maintainer set of a hosted repository with that identifier), or names
// such a repository's coordinate (a, A, q), or references (e, E, q) a stored
// event that is, or names, one. Deletions and grasp lists are about no
// repository. Events anchored only by a forward reference are not looked
// at. It reads the store; an error fails closed in the caller.
func (p *Policy) ArchiveOnly(ctx context.Context, evt *nostr.Event) (ref string, archived bool, err error) {
	if !p.Archive.Enabled() || evt == nil {
		return "", false, nil
	}
	type identSets struct{ hosted, stored map[string]bool }
	sets := map[string]identSets{}
	// archivedRepo reports whether repository (pubkey, d) is held here
	// only as an archive: its author is outside the maintainer set of the
	// hosted repositories with that identifier, and its announcement is
	// stored (or is the event being judged, self).
	archivedRepo := func(pubkey, d string, self bool) (bool, error) {
		s, ok := sets[d]
		if !ok {
			anns, err := p.announcements(ctx, d)
			if err != nil {
				return false, err
			}
			s = identSets{hosted: p.maintainerSet(anns, d, false), stored: authors(anns)}
			sets[d] = s
		}
		return (self || s.stored[pubkey]) && !s.hosted[pubkey], nil
	}
	coordRef := func(pubkey, d string) string {
		return nip34.Coordinate{Kind: nip34.KindRepoAnnouncement, PubKey: pubkey, D: d}.String()
	}
	switch evt.Kind {
	case nip34.KindDeletion, nip34.KindUserGraspList:
		return "", false, nil
	case nip34.KindRepoAnnouncement, nip34.KindRepoState:
		d, ok := identifier(evt)
		if !ok || (evt.Kind == nip34.KindRepoAnnouncement && p.ListsService(evt)) {
			return "", false, nil
		}
		a, err := archivedRepo(evt.PubKey, d, true)
		if err != nil || !a {
			return "", false, err
		}
		return coordRef(evt.PubKey, d), true, nil
	}
	// checkCoords reports the first coordinate of a repository (its
	// announcement or state) that is archived.
	checkCoords := func(coords []nip34.Coordinate) (string, bool, error) {
		for _, c := range coords {
			if c.Kind != nip34.KindRepoAnnouncement && c.Kind != nip34.KindRepoState {
				continue
			}
			if !nip34.ValidIdentifier(c.D) {
				continue
			}
			a, err := archivedRepo(c.PubKey, c.D, false)
			if err != nil {
				return "", false, err
			}
			if a {
				return coordRef(c.PubKey, c.D), true, nil
			}
		}
		return "", false, nil
	}
	ids, coords := references(evt)
	if ref, a, err := checkCoords(coords); err != nil || a {
		return ref, a, err
	}
	if len(ids) == 0 {
		return "", false, nil
	}
	stored, err := p.query(ctx, nostr.Filter{IDs: ids, Limit: len(ids)})
	if err != nil {
		return "", false, err
	}
	for _, s := range stored {
		if s.Kind == nip34.KindRepoAnnouncement || s.Kind == nip34.KindRepoState {
			if ref, a, err := p.ArchiveOnly(ctx, s); err != nil || a {
				return ref, a, err
			}
			continue
		}
		_, sc := references(s)
		if ref, a, err := checkCoords(sc); err != nil || a {
			return ref, a, err
		}
	}
	return "", false, nil
}
