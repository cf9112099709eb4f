package discovery

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/policy"
	"github.com/grasp-sync/grasp-sync/pkg/relayurl"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

const service = "wss://git.example.com"

func newIndex() *RepoSyncIndex {
	pol := &policy.Policy{ServiceURL: service}
	return NewRepoSyncIndex(RelayRules{
		ServiceURL:         service,
		Guard:              relayurl.Guard{},
		MaxPerAnnouncement: 3,
		ListsService:       pol.ListsService,
	})
}

func TestRepoSyncIndex(t *testing.T) {
	owner := testkit.NewKey()
	clone := testkit.GraspCloneURL(service, owner.PubKey, "r")
	ref := nip34.RepoRef{PubKey: owner.PubKey, Identifier: "r"}
	x := newIndex()

	// A root event before its announcement is kept and attached later.
	issue := owner.Issue(ref.String(), "early")
	x.Apply(issue)
	if x.Entry(ref) != nil {
		t.Fatal("repo indexed without an announcement")
	}

	v1 := owner.Announcement("r", []string{clone, "https://github.com/o/r.git", "https://mirror.example/" + "npub1x/r.git"},
		[]string{service, "wss://a.example/", "WSS://B.example:443", "ws://10.0.0.1", "http://c.example"}, nil, testkit.At(100))
	x.Apply(v1)
	e := x.Entry(ref)
	if e == nil {
		t.Fatal("announcement listing us not indexed")
	}
	if want := []string{"wss://a.example", "wss://b.example"}; !reflect.DeepEqual(e.Relays, want) {
		t.Errorf("relays = %v, want %v (own relay, private, non-ws and non-GRASP clone URLs excluded)", e.Relays, want)
	}
	if !reflect.DeepEqual(e.RootEventIds, []string{issue.ID}) {
		t.Errorf("roots = %v, want the early issue", e.RootEventIds)
	}
	if x.Refused[RefusedInternal] != 1 || x.Refused[RefusedScheme] != 1 {
		t.Errorf("refused = %v", x.Refused)
	}

	// A newer version replaces the relay set; an older one changes nothing.
	v2 := owner.Announcement("r", []string{clone}, []string{service, "wss://c.example"}, nil, testkit.At(200))
	x.Apply(v2)
	x.Apply(v1)
	if got := x.Entry(ref).Relays; !reflect.DeepEqual(got, []string{"wss://c.example"}) {
		t.Errorf("relays after update = %v", got)
	}

	// The GRASP clone URL of another server is a relay.
	v3 := owner.Announcement("r", []string{clone, testkit.GraspCloneURL("wss://other.example", owner.PubKey, "r")}, []string{service}, nil, testkit.At(300))
	x.Apply(v3)
	if got := x.Entry(ref).Relays; !reflect.DeepEqual(got, []string{"wss://other.example"}) {
		t.Errorf("relays from clone URLs = %v", got)
	}

	// An announcement that stops listing us removes the repository.
	v4 := owner.Announcement("r", []string{"https://elsewhere.example/x.git"}, []string{"wss://a.example"}, nil, testkit.At(400))
	x.Apply(v4)
	if x.Entry(ref) != nil {
		t.Fatal("repo still indexed after its announcement stopped listing us")
	}

	// More relays than allowed per announcement are cut.
	many := owner.Announcement("m", []string{testkit.GraspCloneURL(service, owner.PubKey, "m")},
		[]string{service, "wss://1.example", "wss://2.example", "wss://3.example", "wss://4.example"}, nil)
	x.Apply(many)
	if got := x.Entry(nip34.RepoRef{PubKey: owner.PubKey, Identifier: "m"}).Relays; len(got) != 3 {
		t.Errorf("%d relays kept, want 3", len(got))
	}
}

func TestRootTaggingSeveralRepos(t *testing.T) {
	a, b := testkit.NewKey(), testkit.NewKey()
	x := newIndex()
	for _, k := range []testkit.Key{a, b} {
		x.Apply(k.Announcement("r", []string{testkit.GraspCloneURL(service, k.PubKey, "r")}, []string{service, "wss://a.example"}, nil))
	}
	patch := a.Patch(testkit.RepoRef(a.PubKey, "r"), testkit.WithTags(nostr.Tag{"a", testkit.RepoRef(b.PubKey, "r")}))
	changed := x.Apply(patch)
	if len(changed) != 2 {
		t.Fatalf("changed = %v, want both repos", changed)
	}
	if again := x.Apply(patch); len(again) != 0 {
		t.Fatalf("re-applying a root changed %v", again)
	}
}

// TestRelayRulesRefusal is the URL refusal table as discovery applies it:
// each raw relays value, with the relay kept (normalised) or the reason it
// was refused.
func TestRelayRulesRefusal(t *testing.T) {
	rules := RelayRules{ServiceURL: service, Guard: relayurl.Guard{Allow: []string{"127.0.0.1:7000"}}, MaxPerAnnouncement: 20}
	long := "wss://relay.example/" + strings.Repeat("a", 2000)
	cases := []struct {
		raw    string
		kept   string
		reason string
	}{
		{"wss://Relay.Example.COM:443/", "wss://relay.example.com", ""},
		{"ws://relay.example.com:80", "ws://relay.example.com", ""},
		{"wss://relay.example.com/nostr/", "wss://relay.example.com/nostr", ""},
		{"ws://169.254.169.254", "", RefusedInternal},
		{"ws://[::1]", "", RefusedInternal},
		{"ws://[::1]:7000", "", RefusedInternal},
		{"ws://10.0.0.1", "", RefusedInternal},
		{"wss://192.168.1.1:8080", "", RefusedInternal},
		{"ws://100.64.0.1", "", RefusedInternal},
		{"ws://127.0.0.1", "", RefusedInternal},
		{"ws://localhost:7777", "", RefusedInternal},
		{"ws://[fe80::1]", "", RefusedInternal},
		{"ws://[fd00:ec2::254]", "", RefusedInternal},
		{"ws://127.0.0.1:7000", "ws://127.0.0.1:7000", ""}, // allowlisted
		{"http://relay.example.com", "", RefusedScheme},
		{"https://relay.example.com", "", RefusedScheme},
		{"ftp://relay.example.com", "", RefusedScheme},
		{"wss://user:pass@relay.example.com", "", RefusedCredentials},
		{"wss://user@relay.example.com", "", RefusedCredentials},
		{long, "", RefusedTooLong},
		{"wss://", "", RefusedMalformed},
		{"not a url", "", RefusedMalformed},
		{"wss://git.example.com", "", ""},      // this service: excluded, not refused
		{"WSS://GIT.example.com:443/", "", ""}, // same, written differently
	}
	for _, c := range cases {
		relays, refused := rules.Relays(nip34.Announcement{Relays: []string{c.raw}})
		name := c.raw
		if len(name) > 60 {
			name = name[:60] + "…"
		}
		switch {
		case c.kept != "" && (len(relays) != 1 || relays[0] != c.kept):
			t.Errorf("%s: relays %v, want [%s]", name, relays, c.kept)
		case c.kept == "" && len(relays) != 0:
			t.Errorf("%s: relays %v, want none", name, relays)
		}
		if c.reason != "" && (refused[c.reason] != 1 || len(refused) != 1) {
			t.Errorf("%s: refused %v, want %s", name, refused, c.reason)
		}
		if c.reason == "" && len(refused) != 0 {
			t.Errorf("%s: refused %v, want nothing refused", name, refused)
		}
	}
}

func TestAnnouncementSeveralTagsAndDuplicates(t *testing.T) {
	owner := testkit.NewKey()
	ref := nip34.RepoRef{PubKey: owner.PubKey, Identifier: "r"}
	x := newIndex()
	x.rules.MaxPerAnnouncement = 10
	evt := owner.Sign(&nostr.Event{Kind: nip34.KindRepoAnnouncement, CreatedAt: 10, Tags: nostr.Tags{
		{"d", "r"},
		{"clone", "https://github.com/o/r.git"},
		{"clone", testkit.GraspCloneURL(service, owner.PubKey, "r"), testkit.GraspCloneURL("wss://other.example", owner.PubKey, "r")},
		{"relays", "wss://a.example"},
		{"relays", service, "wss://b.example", "wss://A.example/"},
		{"relays"},
	}})
	x.Apply(evt)
	e := x.Entry(ref)
	if e == nil {
		t.Fatal("not indexed")
	}
	if want := []string{"wss://a.example", "wss://b.example", "wss://other.example"}; !reflect.DeepEqual(e.Relays, want) {
		t.Errorf("relays = %v, want %v (tags merged, duplicates folded)", e.Relays, want)
	}
	if e.AnnouncementId != evt.ID || e.RepoRef != ref.String() {
		t.Errorf("entry = %v", e)
	}
}

func TestDeletion(t *testing.T) {
	owner, other := testkit.NewKey(), testkit.NewKey()
	clone := testkit.GraspCloneURL(service, owner.PubKey, "r")
	ref := nip34.RepoRef{PubKey: owner.PubKey, Identifier: "r"}
	ann := func(ts nostr.Timestamp) *nostr.Event {
		return owner.Announcement("r", []string{clone}, []string{service, "wss://a.example"}, nil, testkit.At(ts))
	}

	t.Run("coordinate deletion removes versions up to it", func(t *testing.T) {
		x := newIndex()
		x.Apply(ann(100))
		changed := x.Apply(owner.Deletion([]*nostr.Event{ann(100)}, testkit.At(150)))
		if len(changed) != 1 || x.Entry(ref) != nil {
			t.Fatalf("changed %v, entry %v: want the repo removed", changed, x.Entry(ref))
		}
		x.Apply(ann(120)) // older than the deletion: stays deleted
		if x.Entry(ref) != nil {
			t.Fatal("a version older than the deletion came back")
		}
		x.Apply(ann(200)) // newer: a fresh announcement
		if x.Entry(ref) == nil {
			t.Fatal("a version newer than the deletion is not indexed")
		}
	})
	t.Run("id deletion removes that version", func(t *testing.T) {
		x := newIndex()
		v := ann(100)
		x.Apply(v)
		x.Apply(owner.Sign(&nostr.Event{Kind: 5, CreatedAt: 150, Tags: nostr.Tags{{"e", v.ID}}}))
		if x.Entry(ref) != nil {
			t.Fatal("deleted version still indexed")
		}
	})
	t.Run("deletion before the announcement", func(t *testing.T) {
		x := newIndex()
		v := ann(100)
		x.Apply(owner.Deletion([]*nostr.Event{v}, testkit.At(150)))
		x.Apply(v)
		if x.Entry(ref) != nil {
			t.Fatal("announcement deleted earlier was indexed")
		}
	})
	t.Run("someone else's deletion is ignored", func(t *testing.T) {
		x := newIndex()
		v := ann(100)
		x.Apply(v)
		forged := other.Sign(&nostr.Event{Kind: 5, CreatedAt: 150, Tags: nostr.Tags{{"a", ref.String()}, {"e", v.ID}}})
		if changed := x.Apply(forged); len(changed) != 0 || x.Entry(ref) == nil {
			t.Fatalf("another author's deletion removed the repo (changed %v)", changed)
		}
	})
	t.Run("root deletion detaches the root", func(t *testing.T) {
		x := newIndex()
		x.Apply(ann(100))
		issue := other.Issue(ref.String(), "bug")
		x.Apply(issue)
		if got := x.Entry(ref).RootEventIds; len(got) != 1 {
			t.Fatalf("roots = %v", got)
		}
		x.Apply(owner.Sign(&nostr.Event{Kind: 5, Tags: nostr.Tags{{"e", issue.ID}}})) // not the author
		if got := x.Entry(ref).RootEventIds; len(got) != 1 {
			t.Fatalf("the repo owner deleted someone else's issue: roots = %v", got)
		}
		changed := x.Apply(other.Deletion([]*nostr.Event{issue}))
		if got := x.Entry(ref).RootEventIds; len(got) != 0 || len(changed) != 1 {
			t.Fatalf("roots after deletion = %v (changed %v)", got, changed)
		}
		x.Apply(issue) // arriving again: stays deleted
		if got := x.Entry(ref).RootEventIds; len(got) != 0 {
			t.Fatalf("deleted root came back: %v", got)
		}
	})
}

func TestTombstonesAreBounded(t *testing.T) {
	k := testkit.NewKey()
	x := newIndex()
	x.MaxTombstones = 3
	var first string
	for i := range 5 {
		n := k.Note(fmt.Sprint("note ", i))
		if i == 0 {
			first = n.ID
		}
		x.Apply(k.Sign(&nostr.Event{Kind: 5, Tags: nostr.Tags{{"e", n.ID}}}))
	}
	if len(x.tombs) != 3 || x.tombstoned(first, k.PubKey) {
		t.Fatalf("%d tombstones (oldest kept: %v), want the 3 newest", len(x.tombs), x.tombstoned(first, k.PubKey))
	}
}

func TestStats(t *testing.T) {
	a, b := testkit.NewKey(), testkit.NewKey()
	x := newIndex()
	x.Apply(a.Announcement("r", []string{testkit.GraspCloneURL(service, a.PubKey, "r")}, []string{service, "wss://a.example", "wss://b.example"}, nil))
	x.Apply(b.Announcement("r", []string{testkit.GraspCloneURL(service, b.PubKey, "r")}, []string{service, "wss://b.example"}, nil))
	x.Apply(b.Announcement("elsewhere", []string{"https://x.example/y.git"}, []string{"wss://c.example"}, nil))
	x.Apply(a.Issue(testkit.RepoRef(a.PubKey, "r"), "i", testkit.WithTags(nostr.Tag{"a", testkit.RepoRef(b.PubKey, "r")})))
	if got, want := x.Stats(), (Stats{Repos: 2, RootEvents: 2, Relays: 2}); got != want {
		t.Fatalf("Stats = %+v, want %+v", got, want)
	}
}

// A hosted repository's entry names its recursive maintainers, the
// coordinates of their stored announcements and the roots tagging those
// coordinates; each event that changes them reports the repository changed,
// whatever the order, and a maintainer's deletion takes them out again.
func TestMaintainersAndTheirCoordinates(t *testing.T) {
	owner, m1, m2, contributor := testkit.NewKey(), testkit.NewKey(), testkit.NewKey(), testkit.NewKey()
	ref := nip34.RepoRef{PubKey: owner.PubKey, Identifier: "p"}
	m1Ref := testkit.RepoRef(m1.PubKey, "p")
	ownerAnn := owner.Announcement("p", []string{testkit.GraspCloneURL(service, owner.PubKey, "p")}, []string{service, "wss://a.example"}, []string{m1.PubKey, "not-a-key"})
	m1Ann := m1.Announcement("p", []string{"https://git.example.org/m1/p.git"}, []string{"wss://m1.example"}, []string{m2.PubKey, owner.PubKey})
	issue := contributor.Issue(m1Ref, "filed on the maintainer's coordinate")
	sorted := func(v ...string) []string { s := slices.Clone(v); slices.Sort(s); return s }

	x := newIndex()
	x.Apply(ownerAnn)
	e := x.Entry(ref)
	if !reflect.DeepEqual(e.Maintainers, []string{m1.PubKey}) || len(e.MaintainerRefs) != 0 {
		t.Fatalf("before the maintainer's announcement: maintainers %v, refs %v", e.Maintainers, e.MaintainerRefs)
	}
	if changed := x.Apply(issue); !containsRef(changed, ref) {
		t.Fatalf("an issue on the maintainer's coordinate changed %v, want %s among them", changed, ref)
	}
	if changed := x.Apply(m1Ann); !containsRef(changed, ref) {
		t.Fatalf("the maintainer's announcement changed %v, want %s among them", changed, ref)
	}
	e = x.Entry(ref)
	if want := sorted(m1.PubKey, m2.PubKey); !reflect.DeepEqual(e.Maintainers, want) {
		t.Fatalf("maintainers %v, want %v (recursive, owner excluded)", e.Maintainers, want)
	}
	if !reflect.DeepEqual(e.MaintainerRefs, []string{m1Ref}) || !reflect.DeepEqual(e.RootEventIds, []string{issue.ID}) {
		t.Fatalf("refs %v roots %v, want [%s] and the issue", e.MaintainerRefs, e.RootEventIds, m1Ref)
	}
	if !reflect.DeepEqual(e.Relays, []string{"wss://a.example"}) {
		t.Fatalf("relays %v: a maintainer's announcement must not add its relays", e.Relays)
	}

	// The same events in the other order give the same entry.
	y := newIndex()
	for _, evt := range []*nostr.Event{m1Ann, issue, ownerAnn} {
		y.Apply(evt)
	}
	if a, b := x.Entry(ref), y.Entry(ref); !reflect.DeepEqual(a.Maintainers, b.Maintainers) ||
		!reflect.DeepEqual(a.MaintainerRefs, b.MaintainerRefs) || !reflect.DeepEqual(a.RootEventIds, b.RootEventIds) {
		t.Fatalf("order matters: %v / %v", a, b)
	}

	if changed := x.Apply(m1.Deletion([]*nostr.Event{m1Ann})); !containsRef(changed, ref) {
		t.Fatalf("the maintainer's deletion changed %v, want %s among them", changed, ref)
	}
	e = x.Entry(ref)
	if !reflect.DeepEqual(e.Maintainers, []string{m1.PubKey}) || len(e.MaintainerRefs) != 0 || len(e.RootEventIds) != 0 {
		t.Fatalf("after the deletion: maintainers %v, refs %v, roots %v", e.Maintainers, e.MaintainerRefs, e.RootEventIds)
	}
}

func containsRef(refs []nip34.RepoRef, ref nip34.RepoRef) bool {
	for _, r := range refs {
		if r == ref {
			return true
		}
	}
	return false
}
