package discovery

import (
	"sort"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/relayurl"
)

// listKey names one replaceable list: its kind and author.
type listKey struct {
	kind   int
	pubkey string
}

// applyGraspList keeps the newest user grasp list and relay list of each
// whitelisted pubkey and reports whether ArchiveRelays may have changed.
func (x *RepoSyncIndex) applyGraspList(evt *nostr.Event) bool {
	if !x.whitelisted[evt.PubKey] {
		return false
	}
	k := listKey{evt.Kind, evt.PubKey}
	if cur := x.graspLists[k]; cur != nil && !newer(evt, cur) {
		return false
	}
	x.graspLists[k] = evt
	return true
}

// listsRelay reports whether tag names a relay where the list's author
// publishes: a "g" tag of a user grasp list (the GRASP server's URL is its
// relay), an "r" tag of a relay list without a marker or marked "write"
// (NIP-65).
func listsRelay(kind int, tag nostr.Tag) bool {
	if len(tag) < 2 {
		return false
	}
	if kind == nip34.KindUserGraspList {
		return tag[0] == "g"
	}
	return tag[0] == "r" && (len(tag) < 3 || tag[2] == "" || tag[2] == "write")
}

// ArchiveRelays returns the relays the whitelisted maintainers publish to,
// from their user grasp lists (10317) and relay lists (10002), normalised,
// guarded like announcement relays, at most MaxPerAnnouncement per list,
// without this service, sorted: discovery publishes them with the bootstrap
// relays, so their layer 1 is read and the maintainers' announcements that
// do not list us are found there.
func (x *RepoSyncIndex) ArchiveRelays() []string {
	seen := map[string]bool{}
	var out []string
	for k, evt := range x.graspLists {
		if x.tombstoned(evt.ID, evt.PubKey) {
			continue
		}
		n := 0
		for _, tag := range evt.Tags {
			if !listsRelay(k.kind, tag) {
				continue
			}
			if x.rules.MaxPerAnnouncement > 0 && n >= x.rules.MaxPerAnnouncement {
				break
			}
			u, err := relayurl.Normalize(tag[1])
			if err != nil || relayurl.SameService(u, x.rules.ServiceURL) || x.rules.Guard.CheckURL(u) != nil {
				continue
			}
			n++
			if !seen[u] {
				seen[u] = true
				out = append(out, u)
			}
		}
	}
	sort.Strings(out)
	return out
}
