package policy

import (
	"context"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
)

// evaluateDeletion is rule 3: a deletion is accepted only if every target it
// names that we can attribute belongs to its author.
func (p *Policy) evaluateDeletion(ctx context.Context, evt *nostr.Event) Decision {
	var ids []string
	seen := map[string]bool{}
	for _, tag := range evt.Tags {
		if len(tag) < 2 {
			continue
		}
		switch tag[0] {
		case "a":
			if c, ok := nip34.ParseCoordinate(tag[1]); ok && c.PubKey != evt.PubKey {
				return refuse(ReasonDeleteOthers, "blocked: cannot delete another author's event %s", c)
			}
		case "e":
			if nip34.IsEventID(tag[1]) && !seen[tag[1]] {
				seen[tag[1]] = true
				ids = append(ids, tag[1])
			}
		}
	}
	// Every id is checked (the tag count limit bounds them); targets not
	// stored cannot be attributed and are harmless: a deletion only ever
	// removes or blocks events by its own author.
	for start := 0; start < len(ids); start += deletionBatch {
		batch := ids[start:min(start+deletionBatch, len(ids))]
		found, err := p.query(ctx, nostr.Filter{IDs: batch, Limit: len(batch)})
		if err != nil {
			return storeError("look up deletion targets", err)
		}
		for _, t := range found {
			if t.PubKey != evt.PubKey {
				return refuse(ReasonDeleteOthers, "blocked: cannot delete another author's event %s", t.ID)
			}
		}
	}
	return accept()
}

// DeletionFilters returns the queries that find the targets of a NIP-09
// deletion request: one per valid e id (in batches) and one per valid a
// coordinate, restricted to the deletion's author and, for coordinates, to
// versions created up to the deletion. Callers delete what they return for
// which Deletes holds; together with rule 0 (deleted events are refused when
// re-sent) this is all of NIP-09.
func DeletionFilters(del *nostr.Event) []nostr.Filter {
	if del == nil || del.Kind != nip34.KindDeletion {
		return nil
	}
	var out []nostr.Filter
	var ids []string
	seen := map[string]bool{}
	for _, tag := range del.Tags {
		if len(tag) < 2 || seen[tag[0]+tag[1]] {
			continue
		}
		seen[tag[0]+tag[1]] = true
		switch tag[0] {
		case "e":
			if nip34.IsEventID(tag[1]) {
				ids = append(ids, tag[1])
			}
		case "a":
			c, ok := nip34.ParseCoordinate(tag[1])
			if !ok || c.PubKey != del.PubKey {
				continue
			}
			until := del.CreatedAt
			f := nostr.Filter{Kinds: []int{c.Kind}, Authors: []string{c.PubKey}, Until: &until, Limit: maxVersions}
			if nostr.IsAddressableKind(c.Kind) && c.D != "" {
				f.Tags = nostr.TagMap{"d": {c.D}}
			}
			out = append(out, f)
		}
	}
	for start := 0; start < len(ids); start += deletionBatch {
		batch := ids[start:min(start+deletionBatch, len(ids))]
		out = append(out, nostr.Filter{IDs: batch, Authors: []string{del.PubKey}, Limit: len(batch)})
	}
	return out
}

// Deletes reports whether the deletion request del removes target: same
// author, and target is named by id, or by coordinate with created_at not
// after the deletion's. Deletions themselves are never removed (NIP-09).
func Deletes(del, target *nostr.Event) bool {
	if del == nil || target == nil || del.Kind != nip34.KindDeletion || target.Kind == nip34.KindDeletion || target.PubKey != del.PubKey {
		return false
	}
	coord, keyed := nip34.CoordinateOf(target)
	for _, tag := range del.Tags {
		if len(tag) < 2 {
			continue
		}
		switch {
		case tag[0] == "e" && tag[1] == target.ID:
			return true
		case tag[0] == "a" && keyed && tag[1] == coord.String() && target.CreatedAt <= del.CreatedAt:
			return true
		}
	}
	return false
}
