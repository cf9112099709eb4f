package nip34

import (
	"strconv"
	"strings"

	"github.com/nbd-wtf/go-nostr"
)

// Coordinate is a replaceable or addressable event's address,
// "kind:pubkey:d" (D is empty for replaceable kinds). A RepoRef is the
// coordinate of a repository announcement.
type Coordinate struct {
	Kind   int
	PubKey string
	D      string
}

// String returns "kind:pubkey:d", the form a and A tags carry.
func (c Coordinate) String() string {
	return strconv.Itoa(c.Kind) + ":" + c.PubKey + ":" + c.D
}

// Matches reports whether e is a version of the event at c.
func (c Coordinate) Matches(e *nostr.Event) bool {
	if e.Kind != c.Kind || e.PubKey != c.PubKey {
		return false
	}
	return !nostr.IsAddressableKind(c.Kind) || e.Tags.GetD() == c.D
}

// CoordinateOf returns evt's own coordinate if its kind has one
// (replaceable or addressable).
func CoordinateOf(evt *nostr.Event) (Coordinate, bool) {
	switch {
	case nostr.IsAddressableKind(evt.Kind):
		return Coordinate{evt.Kind, evt.PubKey, evt.Tags.GetD()}, true
	case nostr.IsReplaceableKind(evt.Kind):
		return Coordinate{evt.Kind, evt.PubKey, ""}, true
	}
	return Coordinate{}, false
}

// ParseCoordinate parses "kind:pubkey:d" strictly: a decimal kind of a
// replaceable or addressable range, a lower-case hex pubkey, and an empty d
// for replaceable kinds. d may itself contain ':'.
func ParseCoordinate(s string) (Coordinate, bool) {
	k, rest, ok := strings.Cut(s, ":")
	if !ok || k == "" || len(k) > 5 {
		return Coordinate{}, false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < '0' || k[i] > '9' {
			return Coordinate{}, false
		}
	}
	kind, _ := strconv.Atoi(k)
	pk, d, ok := strings.Cut(rest, ":")
	if !ok || !IsLowerHex(pk, 64) {
		return Coordinate{}, false
	}
	switch {
	case nostr.IsAddressableKind(kind):
	case nostr.IsReplaceableKind(kind) && d == "":
	default:
		return Coordinate{}, false
	}
	return Coordinate{kind, pk, d}, true
}
