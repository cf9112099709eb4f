package discovery

import (
	"reflect"
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
	if x.Refused["private_address"] != 1 || x.Refused["invalid"] != 1 {
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
