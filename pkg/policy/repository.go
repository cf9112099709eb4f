package policy

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/relayurl"
)

// evaluateAnnouncement is rule 1.
func (p *Policy) evaluateAnnouncement(ctx context.Context, evt *nostr.Event) Decision {
	d, ok := identifier(evt)
	if !ok {
		return refuse(ReasonBadIdentifier, `invalid: announcement needs a "d" identifier that is not empty, "." or ".." and has no '/', '\' or NUL`)
	}
	clone, relays := p.listing(evt)
	if clone && relays {
		return accept()
	}
	anns, err := p.announcements(ctx, d)
	if err != nil {
		return storeError("look up announcements", err)
	}
	set := p.maintainerSet(anns, d, true)
	if set[evt.PubKey] {
		// Maintainer exception: a maintainer of a repository we serve
		// (hosted or archived) may announce it elsewhere.
		return accept()
	}
	if p.Archive.Match(evt.PubKey, d) != ArchiveNone {
		// GRASP-05: an archive accepts what its settings name although it
		// does not list us.
		return accept()
	}
	var lacking []string
	if !clone {
		lacking = append(lacking, "clone")
	}
	if !relays {
		lacking = append(lacking, "relays")
	}
	msg := fmt.Sprintf("blocked: announcement must list %s in both clone and relays tags (missing in %s)",
		p.ServiceURL, strings.Join(lacking, " and "))
	stored := authors(anns)
	if len(set) == 0 {
		// No repository with this identifier is served (yet), so the
		// maintainer exception cannot be decided: the owner's announcement
		// may still arrive. NIP-34 maintainers name each other, so the
		// maintainers this announcement names are the best guess at whose
		// announcement to wait for.
		dec := refuse(ReasonNotMaintainer, "%s, and no accepted announcement with identifier %q names its author as a maintainer", msg, d)
		for _, m := range maintainers(evt) {
			if m != evt.PubKey && !stored[m] && len(dec.Missing) < maxReferences {
				dec.Missing = append(dec.Missing, nip34.Coordinate{Kind: nip34.KindRepoAnnouncement, PubKey: m, D: d}.String())
			}
		}
		return dec
	}
	// A served repository exists but the author is outside its maintainer
	// set: only an announcement by a member we have none from yet could
	// still name the author.
	dec := refuse(ReasonNotListed, "%s, and its author is not a maintainer of repository %q", msg, d)
	dec.Missing = unannounced(set, stored, d)
	return dec
}

// unannounced returns the coordinates of the announcements that members of a
// maintainer set have not published (or we have not stored) yet, sorted and
// bounded: their arrival could extend the set.
func unannounced(set, stored map[string]bool, d string) []string {
	var out []string
	for m := range set {
		if !stored[m] {
			out = append(out, nip34.Coordinate{Kind: nip34.KindRepoAnnouncement, PubKey: m, D: d}.String())
		}
	}
	slices.Sort(out)
	if len(out) > maxReferences {
		out = out[:maxReferences]
	}
	return out
}

// evaluateState is rule 2.
func (p *Policy) evaluateState(ctx context.Context, evt *nostr.Event) Decision {
	d, ok := identifier(evt)
	if !ok {
		return refuse(ReasonBadIdentifier, `invalid: state needs a "d" identifier that is not empty, "." or ".." and has no '/', '\' or NUL`)
	}
	anns, err := p.announcements(ctx, d)
	if err != nil {
		return storeError("look up announcements", err)
	}
	set := p.maintainerSet(anns, d, true)
	if set[evt.PubKey] {
		return accept()
	}
	own := nip34.Coordinate{Kind: nip34.KindRepoAnnouncement, PubKey: evt.PubKey, D: d}.String()
	if len(set) == 0 {
		return Decision{
			Reason:  ReasonNotMaintainer,
			Message: fmt.Sprintf("blocked: no accepted repository announcement with identifier %q (e.g. %s)", d, own),
			Missing: []string{own},
		}
	}
	dec := refuse(ReasonNotMaintainer, "blocked: author is not a maintainer of repository %q", d)
	// What could still make the author a maintainer: their own announcement
	// listing us, or an announcement by a maintainer we have none from yet.
	stored := authors(anns)
	if !stored[evt.PubKey] {
		dec.Missing = append(dec.Missing, own)
	}
	dec.Missing = append(dec.Missing, unannounced(set, stored, d)...)
	if len(dec.Missing) > maxReferences {
		dec.Missing = dec.Missing[:maxReferences]
	}
	return dec
}

// announcements returns the stored announcements with identifier d.
func (p *Policy) announcements(ctx context.Context, d string) ([]*nostr.Event, error) {
	evts, err := p.query(ctx, nostr.Filter{
		Kinds: []int{nip34.KindRepoAnnouncement}, Tags: nostr.TagMap{"d": {d}}, Limit: maxAnnouncements,
	})
	if err != nil {
		return nil, err
	}
	out := evts[:0]
	for _, e := range evts {
		if e.Kind == nip34.KindRepoAnnouncement && e.Tags.GetD() == d {
			out = append(out, e)
		}
	}
	return out, nil
}

// maintainerSet returns the recursive maintainer set of the repositories with
// identifier d that we serve: the owners of stored announcements listing this
// service (and, with archived, of those the archive settings match), their
// maintainers, those maintainers' own announcements' maintainers, and so on.
// Cycle-safe: each pubkey is expanded once.
func (p *Policy) maintainerSet(anns []*nostr.Event, d string, archived bool) map[string]bool {
	latest := map[string]*nostr.Event{}
	for _, a := range anns {
		if cur := latest[a.PubKey]; cur == nil || a.CreatedAt > cur.CreatedAt {
			latest[a.PubKey] = a
		}
	}
	set := map[string]bool{}
	var queue []string
	for pk, a := range latest {
		if p.ListsService(a) || (archived && p.Archive.Match(pk, d) != ArchiveNone) {
			set[pk] = true
			queue = append(queue, pk)
		}
	}
	for len(queue) > 0 {
		pk := queue[0]
		queue = queue[1:]
		a := latest[pk]
		if a == nil {
			continue
		}
		for _, m := range maintainers(a) {
			if !set[m] {
				set[m] = true
				queue = append(queue, m)
			}
		}
	}
	return set
}

// authors returns the set of authors of evts.
func authors(evts []*nostr.Event) map[string]bool {
	out := make(map[string]bool, len(evts))
	for _, e := range evts {
		out[e.PubKey] = true
	}
	return out
}

// maintainers returns the valid pubkeys in an announcement's maintainers
// tags, bounded.
func maintainers(evt *nostr.Event) []string {
	var out []string
	for _, tag := range evt.Tags {
		if len(tag) < 2 || tag[0] != "maintainers" {
			continue
		}
		for _, v := range tag[1:] {
			if len(out) >= maxMaintainers {
				return out
			}
			if nip34.IsPubKey(v) {
				out = append(out, v)
			}
		}
	}
	return out
}

// ListsService reports whether an announcement lists this service in both a
// clone value and a relays value. Clone URLs may be http(s) or ws(s), relay
// URLs must be ws(s); both must name ServiceURL's host and effective port
// (relayurl.SameService: exact host comparison, never a substring test).
// Discovery uses it too, to find the repositories we serve.
func (p *Policy) ListsService(evt *nostr.Event) bool {
	clone, relays := p.listing(evt)
	return clone && relays
}

// listing reports which of the clone and relays tags name this service.
func (p *Policy) listing(evt *nostr.Event) (clone, relays bool) {
	if evt == nil {
		return false, false
	}
	host, port, err := relayurl.HostPort(p.ServiceURL)
	if err != nil {
		return false, false
	}
	ours := func(u string) bool {
		h, pt, err := relayurl.HostPort(u)
		return err == nil && h == host && pt == port
	}
	checked := 0
	for _, tag := range evt.Tags {
		if len(tag) < 2 || (tag[0] != "clone" && tag[0] != "relays") {
			continue
		}
		for _, v := range tag[1:] {
			if checked >= maxListedURLs {
				return clone, relays
			}
			checked++
			switch tag[0] {
			case "clone":
				clone = clone || ours(v)
			case "relays":
				if !relays {
					if n, err := relayurl.Normalize(v); err == nil {
						relays = ours(n)
					}
				}
			}
			if clone && relays {
				return true, true
			}
		}
	}
	return clone, relays
}

// identifier returns the first d tag's value if it is a safe repository
// identifier: not empty, ".", or "..", and without '/', '\' or NUL (it becomes
// a path component on git servers).
func identifier(evt *nostr.Event) (string, bool) {
	for _, tag := range evt.Tags {
		if len(tag) >= 2 && tag[0] == "d" {
			return tag[1], nip34.ValidIdentifier(tag[1])
		}
	}
	return "", false
}
