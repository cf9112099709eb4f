package frameguard

import (
	"encoding/json"
	"fmt"

	"github.com/nbd-wtf/go-nostr"
)

// The answers the guard (conn.go) sends a client instead of khatru.

// SearchUnsupported answers a REQ with a NIP-50 search filter. The guard
// refuses such REQs before khatru sees them: khatru, refusing a later filter
// of a REQ, leaves the earlier filters subscribed under an id the client
// was told is closed. The relay's own filter hook, its backstop, refuses
// with the same words.
const SearchUnsupported = "unsupported: full-text search (NIP-50) is not offered here"

// The refusals of an event whose pubkey or signature does not have the
// shape a verifier accepts, worded as pkg/policy words them so both builds
// answer alike.
const (
	badPubKey = "invalid: pubkey must be 64 lower-case hex characters"
	badSig    = "invalid: signature must be 128 lower-case hex characters"
)

// malformed is the answer to a message khatru could not parse, worded as
// khatru words it.
func malformed(err error) verdict {
	return verdict{reply: notice(parseFailure + err.Error()), what: "malformed"}
}

func okFalse(id, reason string) []byte {
	b, _ := json.Marshal([]any{"OK", id, false, reason})
	return b
}

func closed(id, reason string) []byte {
	b, _ := json.Marshal(nostr.ClosedEnvelope{SubscriptionID: id, Reason: reason})
	return b
}

func notice(text string) []byte {
	b, _ := json.Marshal(nostr.NoticeEnvelope(text))
	return b
}

// oversized answers a message over the size limit from its first bytes.
func oversized(head []byte, limit int) []byte {
	if label(head) == "EVENT" {
		return okFalse(eventID(head), fmt.Sprintf("invalid: event too large (message over %d bytes)", limit))
	}
	return notice(fmt.Sprintf("invalid: message too large (over %d bytes)", limit))
}
