package discovery

import (
	"errors"
	"sort"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/policy"
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
	// Archive names the repositories synced although their announcements
	// do not list us (GRASP-05, the policy's settings); the zero value
	// archives nothing.
	Archive policy.Archive
	// MaxArchived bounds the archived repositories matched only by an
	// identifier entry or GRASP_ARCHIVE_ALL (policy.ArchiveOpen), which
	// anyone can publish; 0: none of them. Those matched by an npub entry
	// are not counted.
	MaxArchived int
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
