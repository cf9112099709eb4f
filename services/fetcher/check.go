package fetcher

import (
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
)

// Reasons an event is dropped before publishing.
const (
	DropShape    = "shape"
	DropBadID    = "bad_id"
	DropNoMatch  = "no_match"
	DropTooLarge = "too_large"
)

// CheckEvent runs the cheap structural checks an event must pass before it
// is published for the ingesters: hex fields of the right length, a sane
// kind, id = hash of the content, and a match with what was asked for. The
// signature is the ingester's job (expensive, and it must check anyway).
// It returns "" for a good event, else the drop reason.
func CheckEvent(evt *nostr.Event, fs nostr.Filters) string {
	var m eventMatcher
	if len(fs) > 0 {
		m = reqFilters(fs)
	}
	return checkEvent(evt, m)
}

// eventMatcher is what an event was asked for with: a batch's filters
// (reqFilters) or a live group's compact ones (liveFilters).
type eventMatcher interface {
	matches(*nostr.Event) bool
}

// reqFilters are filters as sent.
type reqFilters nostr.Filters

func (fs reqFilters) matches(evt *nostr.Event) bool {
	return matchesIgnoringLimit(nostr.Filters(fs), evt)
}

// checkEvent is CheckEvent with any matcher (nil: no match check).
func checkEvent(evt *nostr.Event, m eventMatcher) string {
	if !nip34.IsEventID(evt.ID) || !nip34.IsPubKey(evt.PubKey) || !nip34.IsSignature(evt.Sig) || evt.Kind < 0 || evt.Kind > 65535 {
		return DropShape
	}
	for _, tag := range evt.Tags {
		if len(tag) == 0 {
			return DropShape
		}
	}
	if !evt.CheckID() {
		return DropBadID
	}
	if m != nil && !m.matches(evt) {
		return DropNoMatch
	}
	return ""
}

func matchesIgnoringLimit(fs nostr.Filters, evt *nostr.Event) bool {
	for _, f := range fs {
		if f.Matches(evt) {
			return true
		}
	}
	return false
}
