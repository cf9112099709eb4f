package discovery

import (
	"reflect"
	"testing"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip19"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/policy"
	"github.com/grasp-sync/grasp-sync/pkg/relayurl"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

func archiveIndex(t *testing.T, whitelist string, all bool, maxOpen int) *RepoSyncIndex {
	t.Helper()
	w, err := policy.ParseArchiveWhitelist(whitelist)
	if err != nil {
		t.Fatal(err)
	}
	pol := &policy.Policy{ServiceURL: service}
	return NewRepoSyncIndex(RelayRules{
		ServiceURL: service, Guard: relayurl.Guard{}, MaxPerAnnouncement: 3, ListsService: pol.ListsService,
		Archive: policy.Archive{Whitelist: w, All: all}, MaxArchived: maxOpen,
	})
}

func npub(t *testing.T, k testkit.Key) string {
	t.Helper()
	n, err := nip19.EncodePublicKey(k.PubKey)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestIndexArchive: an announcement that does not list us gets an entry,
// marked archived, exactly when the archive settings match it and its author
// maintains no hosted repository with that identifier; open matches are
// bounded, first admitted first.
func TestIndexArchive(t *testing.T) {
	alice, bob, mallory := testkit.NewKey(), testkit.NewKey(), testkit.NewKey()
	elsewhere := func(k testkit.Key, d string, ts nostr.Timestamp, maintainers ...string) *nostr.Event {
		return k.Announcement(d, []string{"https://github.com/x/" + d + ".git"}, []string{"wss://remote.example"}, maintainers, testkit.At(ts))
	}
	ref := func(k testkit.Key, d string) nip34.RepoRef { return nip34.RepoRef{PubKey: k.PubKey, Identifier: d} }

	t.Run("npub: bob's repositories, not mallory's", func(t *testing.T) {
		x := archiveIndex(t, npub(t, bob), false, 0)
		x.Apply(elsewhere(bob, "tool", 1))
		x.Apply(elsewhere(mallory, "tool", 1))
		e := x.Entry(ref(bob, "tool"))
		if e == nil || !e.Archived || !reflect.DeepEqual(e.Relays, []string{"wss://remote.example"}) {
			t.Fatalf("bob's archived entry = %v", e)
		}
		if x.Entry(ref(mallory, "tool")) != nil {
			t.Fatal("mallory's repository archived")
		}
		if st := x.Stats(); st.Repos != 1 || st.Archived != 1 {
			t.Fatalf("stats %+v", st)
		}
	})
	t.Run("a repository listing us is hosted, not archived", func(t *testing.T) {
		x := archiveIndex(t, npub(t, bob), false, 0)
		x.Apply(bob.Announcement("tool", []string{testkit.GraspCloneURL(service, bob.PubKey, "tool")}, []string{service, "wss://remote.example"}, nil))
		if e := x.Entry(ref(bob, "tool")); e == nil || e.Archived {
			t.Fatalf("entry %v", e)
		}
	})
	t.Run("a maintainer of a hosted repository stays its coordinate", func(t *testing.T) {
		x := archiveIndex(t, npub(t, bob), false, 0)
		x.Apply(elsewhere(bob, "repo", 1))
		if e := x.Entry(ref(bob, "repo")); e == nil || !e.Archived {
			t.Fatalf("before alice: %v", e)
		}
		hosted := alice.Announcement("repo", []string{testkit.GraspCloneURL(service, alice.PubKey, "repo")}, []string{service}, []string{bob.PubKey}, testkit.At(2))
		changed := x.Apply(hosted)
		if x.Entry(ref(bob, "repo")) != nil {
			t.Fatal("bob's coordinate still archived after alice named him")
		}
		if !containsRef(changed, ref(bob, "repo")) {
			t.Fatalf("bob's entry change not reported: %v", changed)
		}
		if e := x.Entry(ref(alice, "repo")); e == nil || !reflect.DeepEqual(e.MaintainerRefs, []string{ref(bob, "repo").String()}) {
			t.Fatalf("alice's entry %v", e)
		}
		// Alice drops bob: his repository is archived again.
		x.Apply(alice.Announcement("repo", []string{testkit.GraspCloneURL(service, alice.PubKey, "repo")}, []string{service}, nil, testkit.At(3)))
		if e := x.Entry(ref(bob, "repo")); e == nil || !e.Archived {
			t.Fatalf("after alice dropped bob: %v", e)
		}
	})
	t.Run("open matches bounded, pinned ones not", func(t *testing.T) {
		x := archiveIndex(t, npub(t, bob), true, 2)
		x.Apply(elsewhere(mallory, "a", 1))
		annB := elsewhere(mallory, "b", 1)
		x.Apply(annB)
		x.Apply(elsewhere(mallory, "c", 1))
		x.Apply(elsewhere(bob, "x", 1))
		x.Apply(elsewhere(bob, "y", 1))
		for _, r := range []nip34.RepoRef{ref(mallory, "a"), ref(mallory, "b"), ref(bob, "x"), ref(bob, "y")} {
			if e := x.Entry(r); e == nil || !e.Archived {
				t.Fatalf("%s not archived", r)
			}
		}
		if x.Entry(ref(mallory, "c")) != nil {
			t.Fatal("third open archive admitted past the bound")
		}
		if st := x.Stats(); st.Archived != 4 || st.OverLimit != 1 || x.OverLimitTotal != 1 {
			t.Fatalf("stats %+v total %d", st, x.OverLimitTotal)
		}
		// A newer version of the first admitted keeps its place.
		x.Apply(elsewhere(mallory, "a", 5))
		if x.Entry(ref(mallory, "a")) == nil || x.Entry(ref(mallory, "c")) != nil {
			t.Fatal("bound changed by an update")
		}
		// A deleted open archive leaves room for the one waiting.
		changed := x.Apply(mallory.Deletion([]*nostr.Event{annB}, testkit.At(10)))
		if x.Entry(ref(mallory, "b")) != nil {
			t.Fatal("deleted archive still indexed")
		}
		if e := x.Entry(ref(mallory, "c")); e == nil || !e.Archived || !containsRef(changed, ref(mallory, "c")) {
			t.Fatalf("waiting archive not admitted when room was made (changed %v)", changed)
		}
		if st := x.Stats(); st.OverLimit != 0 {
			t.Fatalf("stats %+v", st)
		}
	})
	t.Run("identifier entry", func(t *testing.T) {
		x := archiveIndex(t, "tool", false, 10)
		x.Apply(elsewhere(mallory, "tool", 1))
		x.Apply(elsewhere(mallory, "other", 1))
		if e := x.Entry(ref(mallory, "tool")); e == nil || !e.Archived {
			t.Fatal("identifier entry not archived")
		}
		if x.Entry(ref(mallory, "other")) != nil {
			t.Fatal("other identifier archived")
		}
	})
}

// TestArchiveRelaysFromGraspLists: the GRASP servers a whitelisted
// maintainer lists (10317) are places to look for their announcements; a
// stranger's list, internal addresses and this service are not.
func TestArchiveRelaysFromGraspLists(t *testing.T) {
	bob, mallory := testkit.NewKey(), testkit.NewKey()
	x := archiveIndex(t, npub(t, bob)+"/tool", false, 0)
	x.Apply(mallory.GraspList([]string{"wss://mallory.example"}))
	x.Apply(bob.GraspList([]string{"wss://one.example/", service, "ws://10.0.0.1", "https://two.example"}, testkit.At(10)))
	if got, want := x.ArchiveRelays(), []string{"wss://one.example"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("archive relays %v, want %v", got, want)
	}
	x.Apply(bob.GraspList([]string{"wss://three.example"}, testkit.At(20)))
	x.Apply(bob.GraspList([]string{"wss://old.example"}, testkit.At(5)))
	if got, want := x.ArchiveRelays(), []string{"wss://three.example"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("after a newer list: %v, want %v", got, want)
	}
	// Relay lists (10002): write and unmarked relays, not read-only ones.
	x.Apply(bob.Sign(&nostr.Event{Kind: 10002, CreatedAt: 30, Tags: nostr.Tags{
		{"r", "wss://write.example", "write"}, {"r", "wss://both.example"}, {"r", "wss://read.example", "read"}}}))
	x.Apply(mallory.Sign(&nostr.Event{Kind: 10002, CreatedAt: 30, Tags: nostr.Tags{{"r", "wss://m.example"}}}))
	if got, want := x.ArchiveRelays(), []string{"wss://both.example", "wss://three.example", "wss://write.example"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("with a relay list: %v, want %v", got, want)
	}
	if got := archiveIndex(t, "", true, 1).ArchiveRelays(); len(got) != 0 {
		t.Fatalf("without whitelisted npubs: %v", got)
	}
}
