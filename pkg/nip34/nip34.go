// Package nip34 holds the NIP-34 domain vocabulary grasp-sync works with:
// event kinds, repository coordinates ("30617:<pubkey>:<d>"), their KV key
// encoding, and announcement parsing.
package nip34

import (
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/nbd-wtf/go-nostr"
)

// Kinds of NIP-34 and GRASP events, and the general nostr kinds the write
// policy treats specially.
const (
	// KindRepoAnnouncement is a repository announcement (addressable; its d
	// tag is the repository identifier).
	KindRepoAnnouncement = 30617
	// KindRepoState is a repository state: branch and tag heads (addressable,
	// same d tag as the announcement).
	KindRepoState = 30618
	// KindPatch is a patch; a root event replies are followed by.
	KindPatch = 1617
	// KindPullRequest is a pull request; a root event.
	KindPullRequest = 1618
	// KindPullRequestUpdate updates a pull request's tip.
	KindPullRequestUpdate = 1619
	// KindIssue is an issue; a root event.
	KindIssue = 1621
	// KindUserGraspList is a user's list of GRASP servers (replaceable).
	KindUserGraspList = 10317
	// KindRelayList is a user's NIP-65 relay list (replaceable, "r" tags):
	// where an archive looks for a whitelisted maintainer's announcements.
	KindRelayList = 10002
	// KindComment is a NIP-22 comment, the usual reply to a root event.
	KindComment = 1111
	// KindDeletion is a NIP-09 deletion request: it names the events (e tags)
	// and coordinates (a tags) its author wants removed.
	KindDeletion = 5
)

// IsRootKind reports whether replies to events of this kind are followed by
// sync (layer 3): patches, pull requests and issues.
func IsRootKind(kind int) bool {
	return kind == KindPatch || kind == KindPullRequest || kind == KindIssue
}

// RepoRef is a repository's coordinate.
type RepoRef struct {
	PubKey     string
	Identifier string
}

// String returns "30617:<pubkey>:<d>".
func (r RepoRef) String() string {
	return fmt.Sprintf("%d:%s:%s", KindRepoAnnouncement, r.PubKey, r.Identifier)
}

// ParseRepoRef parses "30617:<pubkey>:<d>". The identifier may contain ':'.
func ParseRepoRef(s string) (RepoRef, bool) {
	kind, rest, ok := strings.Cut(s, ":")
	if !ok || kind != "30617" {
		return RepoRef{}, false
	}
	pk, d, ok := strings.Cut(rest, ":")
	if !ok || !isHex64(pk) || !ValidIdentifier(d) {
		return RepoRef{}, false
	}
	return RepoRef{PubKey: pk, Identifier: d}, true
}

// ValidIdentifier reports whether a repository identifier (d tag) is one a
// GRASP server can host: not empty, ".", "..", and without '/', '\' or NUL.
func ValidIdentifier(d string) bool {
	return d != "" && d != "." && d != ".." && !strings.ContainsAny(d, "/\\\x00")
}

// Key encodes a repository as a JetStream KV key. KV keys allow only
// [-/_=.a-zA-Z0-9], and identifiers are free text, so the identifier is
// base64url-encoded: "<pubkey>.<base64url(d)>".
func (r RepoRef) Key() string {
	return r.PubKey + "." + base64.RawURLEncoding.EncodeToString([]byte(r.Identifier))
}

// ParseKey decodes a key made by Key.
func ParseKey(key string) (RepoRef, bool) {
	pk, enc, ok := strings.Cut(key, ".")
	if !ok || !isHex64(pk) {
		return RepoRef{}, false
	}
	d, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil || !ValidIdentifier(string(d)) {
		return RepoRef{}, false
	}
	return RepoRef{PubKey: pk, Identifier: string(d)}, true
}

func isHex64(s string) bool { return IsLowerHex(s, 64) }

// IsLowerHex reports whether s is exactly n lower-case hex characters, the
// only form ids (64), public keys (64) and signatures (128) take in a valid
// event; upper case is refused because ids are compared as strings.
func IsLowerHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// DecodeID decodes s into the 32 bytes of an event id or public key when s
// is one as it is on the wire (IsLowerHex(s, 64)); ok is false for anything
// else, upper case included. One pass through a table: the fetcher decodes
// every id of every live filter, at 1,000 relays millions of them
// (docs/measurements/2026-12-07-issue32-rest-after-trim-and-publishers.md).
func DecodeID(s string) (b [32]byte, ok bool) {
	if len(s) != 64 {
		return b, false
	}
	for i := range b {
		hi, lo := lowerHexDigit[s[2*i]], lowerHexDigit[s[2*i+1]]
		if hi|lo > 0x0f {
			return [32]byte{}, false
		}
		b[i] = hi<<4 | lo
	}
	return b, true
}

// lowerHexDigit is each byte's value as a lower-case hex digit, 0xff for
// any other byte.
var lowerHexDigit = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for c := byte('0'); c <= '9'; c++ {
		t[c] = c - '0'
	}
	for c := byte('a'); c <= 'f'; c++ {
		t[c] = c - 'a' + 10
	}
	return t
}()

// IsEventID reports whether s has the form of an event id (64 lower-case hex).
func IsEventID(s string) bool { return isHex64(s) }

// IsPubKey reports whether s is a public key in hex (64 lower-case hex
// characters).
func IsPubKey(s string) bool { return isHex64(s) }

// IsSignature reports whether s has the form of a Schnorr signature (128
// lower-case hex characters).
func IsSignature(s string) bool { return IsLowerHex(s, 128) }

// RepoRefsOf returns the repositories an event names in its "a" tags.
func RepoRefsOf(evt *nostr.Event) []RepoRef {
	var refs []RepoRef
	for _, tag := range evt.Tags {
		if len(tag) >= 2 && tag[0] == "a" {
			if r, ok := ParseRepoRef(tag[1]); ok {
				refs = append(refs, r)
			}
		}
	}
	return refs
}

// Announcement is the part of a kind-30617 event that sync cares about.
type Announcement struct {
	Ref         RepoRef
	ID          string
	CreatedAt   nostr.Timestamp
	Clone       []string
	Relays      []string
	Maintainers []string
}

// ParseAnnouncement extracts an announcement's repository, clone URLs,
// relays and maintainers. NIP-34 puts several values in one tag
// (["relays", r1, r2]); several tags of one name are merged too.
func ParseAnnouncement(evt *nostr.Event) (Announcement, error) {
	if evt.Kind != KindRepoAnnouncement {
		return Announcement{}, fmt.Errorf("kind %d is not an announcement", evt.Kind)
	}
	d := evt.Tags.GetD()
	if !ValidIdentifier(d) {
		return Announcement{}, fmt.Errorf("announcement %s: invalid identifier %q", evt.ID, d)
	}
	a := Announcement{Ref: RepoRef{PubKey: evt.PubKey, Identifier: d}, ID: evt.ID, CreatedAt: evt.CreatedAt}
	for _, tag := range evt.Tags {
		if len(tag) < 2 {
			continue
		}
		switch tag[0] {
		case "clone":
			a.Clone = append(a.Clone, tag[1:]...)
		case "relays":
			a.Relays = append(a.Relays, tag[1:]...)
		case "maintainers":
			a.Maintainers = append(a.Maintainers, tag[1:]...)
		}
	}
	return a, nil
}
