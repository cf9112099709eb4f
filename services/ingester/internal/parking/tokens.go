package parking

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/policy"
)

// Token turns a reference (a 64-hex event id or a "kind:pubkey:d"
// coordinate) into one NATS subject token: ids stay as they are, coordinates
// become "c" plus 128 bits of their SHA-256, because an identifier may hold
// characters (and lengths) no subject allows. Empty for anything else.
func Token(ref string) string {
	if nip34.IsEventID(ref) {
		return ref
	}
	if ref == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(ref))
	return "c" + hex.EncodeToString(sum[:16])
}

// WakeTokens returns the tokens a parked event waits on: each reference the
// refusal named as missing, plus the event's own id and coordinate, because
// a forward reference (an accepted event that tags this one) can make it
// acceptable too. Deduplicated and capped at max (own id and coordinate
// first, so the forward reference always counts).
func WakeTokens(evt *nostr.Event, missing []string, max int) []string {
	var refs []string
	refs = append(refs, evt.ID)
	if c, ok := policy.Coordinate(evt); ok {
		refs = append(refs, c)
	}
	refs = append(refs, missing...)
	return tokens(refs, max)
}

// Signals returns the tokens a newly stored event fires: its own id and
// coordinate (for events that waited for it) and every reference it makes
// (for events it accepts by forward reference). Capped at max.
func Signals(evt *nostr.Event, max int) []string {
	refs := []string{evt.ID}
	if c, ok := policy.Coordinate(evt); ok {
		refs = append(refs, c)
	}
	ids, coords := policy.References(evt)
	refs = append(refs, ids...)
	refs = append(refs, coords...)
	return tokens(refs, max)
}

func tokens(refs []string, max int) []string {
	seen := make(map[string]bool, len(refs))
	var out []string
	for _, r := range refs {
		if len(out) >= max {
			break
		}
		t := Token(r)
		if t == "" || seen[t] {
			continue
		}
		seen[t] = true
		out = append(out, t)
	}
	return out
}
