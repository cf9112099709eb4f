package policy

import (
	"context"
	"fmt"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
)

// evaluateReferences is rule 5: accept what references, or is referenced by,
// an accepted repository or event.
func (p *Policy) evaluateReferences(ctx context.Context, evt *nostr.Event) Decision {
	ids, coords := references(evt)
	if ok, err := p.anyCoordinateStored(ctx, coords); err != nil {
		return storeError("look up referenced coordinates", err)
	} else if ok {
		return accept()
	}
	if ok, err := p.anyIDStored(ctx, ids); err != nil {
		return storeError("look up referenced events", err)
	} else if ok {
		return accept()
	}
	if ok, err := p.referencedByStored(ctx, evt); err != nil {
		return storeError("look up forward references", err)
	} else if ok {
		return accept()
	}
	dec := refuse(ReasonNoReference, "blocked: event must reference an accepted repository or accepted event")
	for _, c := range coords {
		dec.Missing = append(dec.Missing, c.String())
	}
	dec.Missing = append(dec.Missing, ids...)
	switch n := len(dec.Missing); {
	case n == 1:
		dec.Message += " (not found: " + dec.Missing[0] + ")"
	case n > 1:
		dec.Message += fmt.Sprintf(" (not found: %s and %d more)", dec.Missing[0], n-1)
	}
	return dec
}

// anchors reports whether a stored event can make others acceptable under
// rule 5. Deletions and grasp lists are accepted without any link to a
// repository, so letting them anchor other events would let anyone bring in
// anything by first publishing one of them; so are an archive's whitelisted
// maintainers' relay lists (10002), which anyone could then tag.
func anchors(kind int) bool {
	return kind != nip34.KindDeletion && kind != nip34.KindUserGraspList && kind != nip34.KindRelayList
}

// anyCoordinateStored reports whether a stored event has one of coords. All
// coordinates are looked up in one query over their kinds, authors and
// identifiers (coordinateFilters), then matched exactly.
func (p *Policy) anyCoordinateStored(ctx context.Context, coords []nip34.Coordinate) (bool, error) {
	for _, f := range coordinateFilters(coords) {
		found, err := p.query(ctx, f)
		if err != nil {
			return false, err
		}
		for _, e := range found {
			for _, c := range coords {
				if c.Matches(e) {
					return true, nil
				}
			}
		}
	}
	return false, nil
}

// coordinateFilters are the queries anyCoordinateStored makes for coords:
// one over their kinds, authors and non-empty identifiers, and one without
// identifiers when one of them is empty.
func coordinateFilters(coords []nip34.Coordinate) []nostr.Filter {
	if len(coords) == 0 {
		return nil
	}
	var kinds []int
	var pubkeys, ds []string
	seenK, seenP, seenD := map[int]bool{}, map[string]bool{}, map[string]bool{}
	emptyD := false
	for _, c := range coords {
		if !seenK[c.Kind] {
			seenK[c.Kind] = true
			kinds = append(kinds, c.Kind)
		}
		if !seenP[c.PubKey] {
			seenP[c.PubKey] = true
			pubkeys = append(pubkeys, c.PubKey)
		}
		if c.D == "" {
			emptyD = true
		} else if !seenD[c.D] {
			seenD[c.D] = true
			ds = append(ds, c.D)
		}
	}
	// At most one stored event per (kind, pubkey, d): the product bounds
	// the result, capped so a hostile mix of values cannot ask for much.
	limit := min(len(kinds)*len(pubkeys)*max(len(ds), 1), maxAnnouncements)
	var filters []nostr.Filter
	if len(ds) > 0 {
		filters = append(filters, nostr.Filter{Kinds: kinds, Authors: pubkeys, Tags: nostr.TagMap{"d": ds}, Limit: limit})
	}
	if emptyD {
		// Empty identifiers are not indexed; read the keys without a d
		// filter and match locally.
		filters = append(filters, nostr.Filter{Kinds: kinds, Authors: pubkeys, Limit: maxAnnouncements})
	}
	return filters
}

// anyIDStored reports whether one of ids is a stored event that anchors,
// asking only for kinds when the store can tell them (KindLookup).
func (p *Policy) anyIDStored(ctx context.Context, ids []string) (bool, error) {
	if len(ids) == 0 {
		return false, nil
	}
	if kl, ok := p.Store.(KindLookup); ok {
		kinds, err := kl.StoredKinds(ctx, ids)
		if err != nil {
			return false, err
		}
		for _, k := range kinds {
			if k >= 0 && anchors(k) {
				return true, nil
			}
		}
		return false, nil
	}
	found, err := p.query(ctx, nostr.Filter{IDs: ids, Limit: len(ids)})
	if err != nil {
		return false, err
	}
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	for _, e := range found {
		if want[e.ID] && anchors(e.Kind) {
			return true, nil
		}
	}
	return false, nil
}

// referencedByStored reports whether a stored event tags evt's id (e, E, q)
// or, for a replaceable or addressable event, its coordinate (a, A, q): the
// forward reference that accepts an event after something replying to it.
func (p *Policy) referencedByStored(ctx context.Context, evt *nostr.Event) (bool, error) {
	for _, f := range forwardFilters(evt) {
		found, err := p.query(ctx, f)
		if err != nil {
			return false, err
		}
		for _, e := range found {
			if e.ID != evt.ID && anchors(e.Kind) {
				return true, nil
			}
		}
	}
	return false, nil
}

// forwardFilters are the queries referencedByStored makes for evt, one tag
// name each, in the order it makes them.
func forwardFilters(evt *nostr.Event) []nostr.Filter {
	tags := []nostr.TagMap{
		{"e": {evt.ID}},
		{"E": {evt.ID}},
		{"q": {evt.ID}},
	}
	if c, ok := nip34.CoordinateOf(evt); ok {
		tags[2]["q"] = append(tags[2]["q"], c.String())
		tags = append(tags, nostr.TagMap{"a": {c.String()}}, nostr.TagMap{"A": {c.String()}})
	}
	filters := make([]nostr.Filter, len(tags))
	for n, tm := range tags {
		filters[n] = nostr.Filter{Tags: tm, Limit: maxForwardScan}
	}
	return filters
}

// ReferenceLookups returns what rule 5 (docs/policy.md) reads from the
// store to decide evt, for a caller that answers those reads for many
// events at once before deciding them one by one (the ingester reads them
// for a whole batch: docs/decisions/0060-decide-reads-per-batch.md). In the
// order rule 5 reads them: coords, the queries for the coordinates evt
// references; ids, the events it references, whose kinds it asks for
// (KindLookup, or Query by IDs); forward, the queries for stored events
// referencing evt, read only when the others find nothing. ok is false when
// evt's kind has a rule of its own, so rule 5 never reads anything for it.
// Answering these ahead changes no decision: the policy still asks the
// store (or the caller's cache) for each.
func (p *Policy) ReferenceLookups(evt *nostr.Event) (coords []nostr.Filter, ids []string, forward []nostr.Filter, ok bool) {
	if evt == nil {
		return nil, nil, nil, false
	}
	switch evt.Kind {
	case nip34.KindRepoAnnouncement, nip34.KindRepoState, nip34.KindDeletion, nip34.KindUserGraspList:
		return nil, nil, nil, false
	case nip34.KindRelayList:
		if p.Archive.NamesAuthor(evt.PubKey) {
			return nil, nil, nil, false
		}
	}
	ids, cs := references(evt)
	return coordinateFilters(cs), ids, forwardFilters(evt), true
}

// references collects the ids (e, E, q) and coordinates (a, A, q) evt names,
// deduplicated and capped at maxReferences in total. Malformed values are
// skipped; coordinates of kinds that cannot anchor are skipped too.
func references(evt *nostr.Event) (ids []string, coords []nip34.Coordinate) {
	seen := map[string]bool{}
	for _, tag := range evt.Tags {
		if len(ids)+len(coords) >= maxReferences {
			break
		}
		if len(tag) < 2 || seen[tag[1]] || tag[1] == evt.ID {
			continue
		}
		v := tag[1]
		switch tag[0] {
		case "e", "E":
			if nip34.IsEventID(v) {
				seen[v] = true
				ids = append(ids, v)
			}
		case "a", "A":
			if c, ok := nip34.ParseCoordinate(v); ok && anchors(c.Kind) {
				seen[v] = true
				coords = append(coords, c)
			}
		case "q":
			if nip34.IsEventID(v) {
				seen[v] = true
				ids = append(ids, v)
			} else if c, ok := nip34.ParseCoordinate(v); ok && anchors(c.Kind) {
				seen[v] = true
				coords = append(coords, c)
			}
		}
	}
	return ids, coords
}

// References returns the event ids (e, E, q) and "kind:pubkey:d"
// coordinates (a, A, q) that evt names and that rule 5 could accept it by,
// deduplicated and bounded (at most 100 in total). Parking uses them to
// find the parked events a newly stored event may unblock.
func References(evt *nostr.Event) (ids, coords []string) {
	if evt == nil {
		return nil, nil
	}
	ids, cs := references(evt)
	for _, c := range cs {
		coords = append(coords, c.String())
	}
	return ids, coords
}

// Coordinate returns evt's own "kind:pubkey:d" address if its kind is
// replaceable or addressable.
func Coordinate(evt *nostr.Event) (string, bool) {
	if evt == nil {
		return "", false
	}
	c, ok := nip34.CoordinateOf(evt)
	if !ok {
		return "", false
	}
	return c.String(), true
}
