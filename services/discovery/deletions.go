package discovery

import (
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
)

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
