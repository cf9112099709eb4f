package testkit

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip19"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
)

// NIP-34 and related event kinds used by the fixtures; the ones grasp-sync
// itself names are pkg/nip34's.
const (
	KindNote              = 1
	KindDeletion          = nip34.KindDeletion
	KindPatch             = nip34.KindPatch
	KindPullRequest       = nip34.KindPullRequest
	KindPullRequestUpdate = nip34.KindPullRequestUpdate
	KindIssue             = nip34.KindIssue
	KindStatusOpen        = 1630
	KindStatusApplied     = 1631
	KindStatusClosed      = 1632
	KindStatusDraft       = 1633
	KindComment           = nip34.KindComment
	KindGraspList         = nip34.KindUserGraspList
	KindAnnouncement      = nip34.KindRepoAnnouncement
	KindState             = nip34.KindRepoState
)

// Key is a real secp256k1 key pair (hex), so fixtures carry valid ids and
// signatures and pass every relay's checks.
type Key struct {
	Secret string // hex secret key
	PubKey string // hex x-only public key
}

// NewKey generates a fresh random key pair; it panics on failure (tests only).
func NewKey() Key {
	sk := nostr.GeneratePrivateKey()
	if sk == "" {
		panic("testkit: generate private key failed")
	}
	pk, err := nostr.GetPublicKey(sk)
	if err != nil {
		panic(fmt.Sprintf("testkit: derive public key: %v", err))
	}
	return Key{Secret: sk, PubKey: pk}
}

// Sign fills evt's PubKey, ID and Sig (and CreatedAt = now if zero) and
// returns evt. Tags and content must be final before calling it. It panics
// on error (tests only).
func (k Key) Sign(evt *nostr.Event) *nostr.Event {
	if evt.CreatedAt == 0 {
		evt.CreatedAt = nostr.Now()
	}
	if evt.Tags == nil {
		evt.Tags = nostr.Tags{}
	}
	if err := evt.Sign(k.Secret); err != nil {
		panic(fmt.Sprintf("testkit: sign kind %d event: %v", evt.Kind, err))
	}
	return evt
}

// Option adjusts a fixture before it is signed (timestamps, extra tags,
// content), so variations stay valid events.
type Option func(*nostr.Event)

// At sets the fixture's CreatedAt, for tests about ordering, since/until and
// replaceable-event precedence.
func At(ts nostr.Timestamp) Option {
	return func(e *nostr.Event) { e.CreatedAt = ts }
}

// WithTags appends tags to the fixture's default tags.
func WithTags(tags ...nostr.Tag) Option {
	return func(e *nostr.Event) { e.Tags = append(e.Tags, tags...) }
}

// WithContent replaces the fixture's content.
func WithContent(s string) Option {
	return func(e *nostr.Event) { e.Content = s }
}

// build applies opts to a new event and signs it.
func (k Key) build(kind int, content string, tags nostr.Tags, opts []Option) *nostr.Event {
	evt := &nostr.Event{Kind: kind, Content: content, Tags: tags}
	for _, opt := range opts {
		opt(evt)
	}
	return k.Sign(evt)
}

// RepoRef returns the address of a repository announcement,
// "30617:<pubkey>:<d>", as used in "a" tags.
func RepoRef(pubkey, d string) string {
	return fmt.Sprintf("%d:%s:%s", KindAnnouncement, pubkey, d)
}

// repoOwner returns the pubkey part of a repository address, or "".
func repoOwner(repoRef string) string {
	parts := strings.SplitN(repoRef, ":", 3)
	if len(parts) != 3 {
		return ""
	}
	return parts[1]
}

// repoTags returns the "a" (and owner "p") tags that tie an event to a repository.
func repoTags(repoRef string) nostr.Tags {
	tags := nostr.Tags{{"a", repoRef}}
	if owner := repoOwner(repoRef); owner != "" {
		tags = append(tags, nostr.Tag{"p", owner})
	}
	return tags
}

// Announcement returns a signed repository announcement (kind 30617) with
// "d" and "name" tags, one "clone" tag holding all clone URLs, one "relays"
// tag holding all relays and, if any are given, one "maintainers" tag, as
// NIP-34 specifies (multi-valued single tags). Empty lists are omitted.
func (k Key) Announcement(d string, clone, relays []string, maintainers []string, opts ...Option) *nostr.Event {
	tags := nostr.Tags{{"d", d}, {"name", d}}
	if len(clone) > 0 {
		tags = append(tags, append(nostr.Tag{"clone"}, clone...))
	}
	if len(relays) > 0 {
		tags = append(tags, append(nostr.Tag{"relays"}, relays...))
	}
	if len(maintainers) > 0 {
		tags = append(tags, append(nostr.Tag{"maintainers"}, maintainers...))
	}
	return k.build(KindAnnouncement, "test repository "+d, tags, opts)
}

// GraspCloneURL returns the GRASP clone URL of repository d owned by pubkey
// on the service at serviceURL: http(s)://host[:port]/<npub>/<d>.git, with
// ws mapped to http and wss to https; any path in serviceURL is dropped.
// It panics on an unparsable URL or pubkey (tests only).
func GraspCloneURL(serviceURL string, pubkey, d string) string {
	u, err := url.Parse(serviceURL)
	if err != nil {
		panic(fmt.Sprintf("testkit: parse service url %q: %v", serviceURL, err))
	}
	switch u.Scheme {
	case "ws":
		u.Scheme = "http"
	case "wss":
		u.Scheme = "https"
	}
	npub, err := nip19.EncodePublicKey(pubkey)
	if err != nil {
		panic(fmt.Sprintf("testkit: encode npub for %q: %v", pubkey, err))
	}
	return u.Scheme + "://" + u.Host + "/" + npub + "/" + d + ".git"
}

// State returns a signed repository state (kind 30618) for repository d:
// a "d" tag, one [refname, sha] tag per ref (sorted by name) and a HEAD tag
// "ref: refs/heads/main" unless refs has a "HEAD" entry, used verbatim.
func (k Key) State(d string, refs map[string]string, opts ...Option) *nostr.Event {
	tags := nostr.Tags{{"d", d}}
	head := "ref: refs/heads/main"
	names := make([]string, 0, len(refs))
	for name := range refs {
		if name == "HEAD" {
			head = refs[name]
			continue
		}
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		tags = append(tags, nostr.Tag{name, refs[name]})
	}
	tags = append(tags, nostr.Tag{"HEAD", head})
	return k.build(KindState, "", tags, opts)
}

// FakeCommit returns a random 40-hex-digit commit id, so fixtures that
// would otherwise be identical get distinct ids.
func FakeCommit() string {
	var b [20]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("testkit: random commit id: %v", err))
	}
	return hex.EncodeToString(b[:])
}

// Patch returns a signed root patch (kind 1617) for repoRef: "a" and owner
// "p" tags, ["t", "root"], a "commit" tag, and a small fake git
// format-patch as content. Each call uses a fresh random commit id.
func (k Key) Patch(repoRef string, opts ...Option) *nostr.Event {
	commit := FakeCommit()
	content := fmt.Sprintf(`From %s Mon Sep 17 00:00:00 2001
From: testkit <testkit@example.invalid>
Date: Mon, 1 Jan 2024 00:00:00 +0000
Subject: [PATCH] testkit change %s

---
 README.md | 1 +
 1 file changed, 1 insertion(+)

diff --git a/README.md b/README.md
--- a/README.md
+++ b/README.md
@@ -1 +1,2 @@
 # test
+change %s
--
2.43.0
`, commit, commit[:7], commit[:7])
	tags := repoTags(repoRef)
	tags = append(tags, nostr.Tag{"t", "root"}, nostr.Tag{"commit", commit})
	return k.build(KindPatch, content, tags, opts)
}

// PullRequest returns a signed pull request (kind 1618) for repoRef with
// "a", owner "p", "subject" and "c" (tip commit) tags.
func (k Key) PullRequest(repoRef, tipCommit string, opts ...Option) *nostr.Event {
	tags := repoTags(repoRef)
	tags = append(tags,
		nostr.Tag{"subject", "pull request " + short(tipCommit)},
		nostr.Tag{"c", tipCommit},
	)
	return k.build(KindPullRequest, "please merge "+tipCommit, tags, opts)
}

// PullRequestUpdate returns a signed pull request update (kind 1619) moving
// pr to tipCommit: "a", owner "p", "E" = pr.ID, "P" = pr.PubKey and "c" tags.
func (k Key) PullRequestUpdate(repoRef string, pr *nostr.Event, tipCommit string, opts ...Option) *nostr.Event {
	tags := repoTags(repoRef)
	tags = append(tags,
		nostr.Tag{"E", pr.ID},
		nostr.Tag{"P", pr.PubKey},
		nostr.Tag{"c", tipCommit},
	)
	return k.build(KindPullRequestUpdate, "", tags, opts)
}

// Issue returns a signed issue (kind 1621) for repoRef with "a", owner "p"
// and "subject" tags.
func (k Key) Issue(repoRef, subject string, opts ...Option) *nostr.Event {
	tags := repoTags(repoRef)
	tags = append(tags, nostr.Tag{"subject", subject})
	return k.build(KindIssue, "issue: "+subject, tags, opts)
}

// Comment returns a signed NIP-22 comment (kind 1111) on parent within the
// thread rooted at root (parent may equal root): root scope
// ["E", id, "", pubkey], ["K", kind], ["P", pubkey] and parent scope
// ["e", id, "", pubkey], ["k", kind], ["p", pubkey]; an addressable root or
// parent also gets its "A"/"a" coordinate.
func (k Key) Comment(root, parent *nostr.Event, text string, opts ...Option) *nostr.Event {
	tags := nostr.Tags{{"E", root.ID, "", root.PubKey}}
	if nostr.IsAddressableKind(root.Kind) {
		tags = append(tags, nostr.Tag{"A", coordinate(root), ""})
	}
	tags = append(tags,
		nostr.Tag{"K", strconv.Itoa(root.Kind)},
		nostr.Tag{"P", root.PubKey},
		nostr.Tag{"e", parent.ID, "", parent.PubKey},
	)
	if nostr.IsAddressableKind(parent.Kind) {
		tags = append(tags, nostr.Tag{"a", coordinate(parent), ""})
	}
	tags = append(tags,
		nostr.Tag{"k", strconv.Itoa(parent.Kind)},
		nostr.Tag{"p", parent.PubKey},
	)
	return k.build(KindComment, text, tags, opts)
}

// RepoComment returns a signed NIP-22 comment (kind 1111) on the repository
// itself: "A" = repoRef, "K" = 30617, "P" = owner for the root scope and the
// same as "a"/"k"/"p" for the parent scope.
func (k Key) RepoComment(repoRef, text string, opts ...Option) *nostr.Event {
	kind := strconv.Itoa(KindAnnouncement)
	tags := nostr.Tags{{"A", repoRef}, {"K", kind}}
	owner := repoOwner(repoRef)
	if owner != "" {
		tags = append(tags, nostr.Tag{"P", owner})
	}
	tags = append(tags, nostr.Tag{"a", repoRef}, nostr.Tag{"k", kind})
	if owner != "" {
		tags = append(tags, nostr.Tag{"p", owner})
	}
	return k.build(KindComment, text, tags, opts)
}

// Status returns a signed NIP-34 status (kind 1630 open, 1631 applied,
// 1632 closed, 1633 draft) for root (an issue, patch or pull request):
// ["e", root.ID, "", "root"], ["p", root.PubKey], root's repository "a" and
// owner "p" tags and, for 1631, ["q", root.ID, "", root.PubKey]. It panics on
// any other kind (tests only).
func (k Key) Status(kind int, root *nostr.Event, opts ...Option) *nostr.Event {
	if kind < KindStatusOpen || kind > KindStatusDraft {
		panic(fmt.Sprintf("testkit: status kind %d outside 1630..1633", kind))
	}
	tags := nostr.Tags{{"e", root.ID, "", "root"}, {"p", root.PubKey}}
	for _, tag := range root.Tags {
		if len(tag) >= 2 && tag[0] == "a" && strings.HasPrefix(tag[1], strconv.Itoa(KindAnnouncement)+":") {
			tags = append(tags, nostr.Tag{"a", tag[1]})
			if owner := repoOwner(tag[1]); owner != "" && owner != root.PubKey {
				tags = append(tags, nostr.Tag{"p", owner})
			}
		}
	}
	if kind == KindStatusApplied {
		tags = append(tags, nostr.Tag{"q", root.ID, "", root.PubKey})
	}
	return k.build(kind, "", tags, opts)
}

// Deletion returns a signed NIP-09 deletion request (kind 5) for targets:
// an "e" tag per regular event, an "a" coordinate per addressable or
// replaceable event, and one "k" tag per distinct target kind.
func (k Key) Deletion(targets []*nostr.Event, opts ...Option) *nostr.Event {
	var tags nostr.Tags
	var kinds []string
	for _, t := range targets {
		if nostr.IsAddressableKind(t.Kind) || nostr.IsReplaceableKind(t.Kind) {
			tags = append(tags, nostr.Tag{"a", coordinate(t)})
		} else {
			tags = append(tags, nostr.Tag{"e", t.ID})
		}
		if kk := strconv.Itoa(t.Kind); !slices.Contains(kinds, kk) {
			kinds = append(kinds, kk)
		}
	}
	for _, kk := range kinds {
		tags = append(tags, nostr.Tag{"k", kk})
	}
	return k.build(KindDeletion, "deleted in test", tags, opts)
}

// GraspList returns a signed GRASP server list (kind 10317) with one
// ["g", url] tag per URL.
func (k Key) GraspList(urls []string, opts ...Option) *nostr.Event {
	tags := make(nostr.Tags, 0, len(urls))
	for _, u := range urls {
		tags = append(tags, nostr.Tag{"g", u})
	}
	return k.build(KindGraspList, "", tags, opts)
}

// Note returns a signed text note (kind 1), an event unrelated to NIP-34
// that sync code must ignore or pass through.
func (k Key) Note(text string, opts ...Option) *nostr.Event {
	return k.build(KindNote, text, nil, opts)
}

// EveryFixture returns one event of every fixture kind, all about one
// repository of owner's, signed by owner or other: for tests that must hold
// for every kind (a relay storing and returning each).
func EveryFixture(owner, other Key) []*nostr.Event {
	ref := RepoRef(owner.PubKey, "repo")
	ann := owner.Announcement("repo",
		[]string{"https://git.example.com/repo.git", GraspCloneURL("wss://grasp.example.com", owner.PubKey, "repo")},
		[]string{"wss://relay.example.com", "wss://grasp.example.com"},
		[]string{other.PubKey})
	state := owner.State("repo", map[string]string{"refs/heads/main": FakeCommit(), "refs/tags/v1": FakeCommit()})
	patch := other.Patch(ref)
	pr := other.PullRequest(ref, FakeCommit())
	prUpdate := other.PullRequestUpdate(ref, pr, FakeCommit())
	issue := other.Issue(ref, "it breaks")
	comment := owner.Comment(issue, issue, "thanks")
	reply := other.Comment(issue, comment, "you're welcome")
	repoComment := other.RepoComment(ref, "nice repo")
	applied := owner.Status(KindStatusApplied, patch)
	closed := owner.Status(KindStatusClosed, issue)
	note := other.Note("unrelated")
	deletion := other.Deletion([]*nostr.Event{note})
	grasp := owner.GraspList([]string{"wss://grasp.example.com"})
	return []*nostr.Event{ann, state, patch, pr, prUpdate, issue, comment, reply, repoComment, applied, closed, note, deletion, grasp}
}

// coordinate returns "<kind>:<pubkey>:<d>" for an addressable or
// replaceable event (d is empty for replaceable ones).
func coordinate(evt *nostr.Event) string {
	d := ""
	if nostr.IsAddressableKind(evt.Kind) {
		d = evt.Tags.GetD()
	}
	return fmt.Sprintf("%d:%s:%s", evt.Kind, evt.PubKey, d)
}

// short returns the first 7 characters of a commit id.
func short(commit string) string {
	if len(commit) > 7 {
		return commit[:7]
	}
	return commit
}
