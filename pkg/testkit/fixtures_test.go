package testkit_test

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip19"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

func TestFixturesAreValid(t *testing.T) {
	owner, other := testkit.NewKey(), testkit.NewKey()
	for _, evt := range testkit.EveryFixture(owner, other) {
		if !evt.CheckID() || evt.GetID() != evt.ID {
			t.Errorf("kind %d: id %s does not match content", evt.Kind, evt.ID)
		}
		if ok, err := evt.CheckSignature(); err != nil || !ok {
			t.Errorf("kind %d: bad signature (ok=%v, err=%v)", evt.Kind, ok, err)
		}
		if evt.CreatedAt == 0 {
			t.Errorf("kind %d: CreatedAt not set", evt.Kind)
		}
	}
}

func TestOptionsApplyBeforeSigning(t *testing.T) {
	k := testkit.NewKey()
	evt := k.Note("x", testkit.At(1234), testkit.WithTags(nostr.Tag{"t", "extra"}), testkit.WithContent("y"))
	if evt.CreatedAt != 1234 || evt.Content != "y" || evt.Tags.GetFirst([]string{"t", "extra"}) == nil {
		t.Fatalf("options not applied: %+v", evt)
	}
	if !evt.CheckID() {
		t.Fatal("id does not cover the options")
	}
	if ok, _ := evt.CheckSignature(); !ok {
		t.Fatal("signature does not cover the options")
	}
}

func TestRepoRefAndGraspCloneURL(t *testing.T) {
	k := testkit.NewKey()
	if got, want := testkit.RepoRef(k.PubKey, "x"), "30617:"+k.PubKey+":x"; got != want {
		t.Fatalf("RepoRef = %q, want %q", got, want)
	}
	npub, err := nip19.EncodePublicKey(k.PubKey)
	if err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{
		"ws://127.0.0.1:7777":     "http://127.0.0.1:7777/" + npub + "/x.git",
		"wss://grasp.example.com": "https://grasp.example.com/" + npub + "/x.git",
		"https://example.com/":    "https://example.com/" + npub + "/x.git",
	} {
		got := testkit.GraspCloneURL(in, k.PubKey, "x")
		if got != want {
			t.Errorf("GraspCloneURL(%q) = %q, want %q", in, got, want)
		}
	}
	if !strings.HasPrefix(testkit.GraspCloneURL("ws://127.0.0.1:7777", k.PubKey, "x"), "http://127.0.0.1:7777/npub1") {
		t.Error("clone url does not use an npub")
	}
}

func TestAnnouncementTags(t *testing.T) {
	k, m := testkit.NewKey(), testkit.NewKey()
	evt := k.Announcement("d1", []string{"c1", "c2"}, []string{"r1", "r2"}, []string{m.PubKey})
	if evt.Kind != 30617 {
		t.Fatalf("kind %d", evt.Kind)
	}
	want := nostr.Tags{{"d", "d1"}, {"name", "d1"}, {"clone", "c1", "c2"}, {"relays", "r1", "r2"}, {"maintainers", m.PubKey}}
	assertTags(t, evt.Tags, want)

	bare := k.Announcement("d2", nil, nil, nil)
	assertTags(t, bare.Tags, nostr.Tags{{"d", "d2"}, {"name", "d2"}})
}

func TestStateTags(t *testing.T) {
	k := testkit.NewKey()
	evt := k.State("d", map[string]string{"refs/tags/v1": "bb", "refs/heads/main": "aa"})
	assertTags(t, evt.Tags, nostr.Tags{{"d", "d"}, {"refs/heads/main", "aa"}, {"refs/tags/v1", "bb"}, {"HEAD", "ref: refs/heads/main"}})
	if evt.Kind != 30618 {
		t.Fatalf("kind %d", evt.Kind)
	}
}

func TestCommentTags(t *testing.T) {
	owner, a, b := testkit.NewKey(), testkit.NewKey(), testkit.NewKey()
	issue := a.Issue(testkit.RepoRef(owner.PubKey, "r"), "bug")
	top := b.Comment(issue, issue, "first")
	reply := a.Comment(issue, top, "second")
	if reply.Kind != 1111 {
		t.Fatalf("kind %d", reply.Kind)
	}
	assertTags(t, top.Tags, nostr.Tags{
		{"E", issue.ID, "", a.PubKey}, {"K", "1621"}, {"P", a.PubKey},
		{"e", issue.ID, "", a.PubKey}, {"k", "1621"}, {"p", a.PubKey},
	})
	assertTags(t, reply.Tags, nostr.Tags{
		{"E", issue.ID, "", a.PubKey}, {"K", "1621"}, {"P", a.PubKey},
		{"e", top.ID, "", b.PubKey}, {"k", "1111"}, {"p", b.PubKey},
	})

	ref := testkit.RepoRef(owner.PubKey, "r")
	rc := a.RepoComment(ref, "hi")
	assertTags(t, rc.Tags, nostr.Tags{{"A", ref}, {"K", "30617"}, {"P", owner.PubKey}, {"a", ref}, {"k", "30617"}, {"p", owner.PubKey}})
}

func TestNIP34Tags(t *testing.T) {
	owner, c := testkit.NewKey(), testkit.NewKey()
	ref := testkit.RepoRef(owner.PubKey, "r")

	patch := c.Patch(ref)
	if patch.Kind != 1617 || !hasTag(patch, "a", ref) || !hasTag(patch, "t", "root") || !strings.Contains(patch.Content, "diff --git") {
		t.Fatalf("bad patch: %v", patch)
	}
	if other := c.Patch(ref, testkit.At(patch.CreatedAt)); other.ID == patch.ID {
		t.Fatal("two patches share an id")
	}

	pr := c.PullRequest(ref, "abc1234def")
	if pr.Kind != 1618 || !hasTag(pr, "a", ref) || !hasTag(pr, "c", "abc1234def") || pr.Tags.Find("subject") == nil {
		t.Fatalf("bad pull request: %v", pr)
	}
	upd := c.PullRequestUpdate(ref, pr, "fff")
	if upd.Kind != 1619 || !hasTag(upd, "a", ref) || !hasTag(upd, "E", pr.ID) || !hasTag(upd, "P", pr.PubKey) || !hasTag(upd, "c", "fff") {
		t.Fatalf("bad pull request update: %v", upd)
	}
	issue := c.Issue(ref, "subj")
	if issue.Kind != 1621 || !hasTag(issue, "a", ref) || !hasTag(issue, "subject", "subj") {
		t.Fatalf("bad issue: %v", issue)
	}

	for kind := testkit.KindStatusOpen; kind <= testkit.KindStatusDraft; kind++ {
		st := owner.Status(kind, patch)
		if st.Kind != kind || st.Tags.GetFirst([]string{"e", patch.ID, "", "root"}) == nil || !hasTag(st, "p", c.PubKey) || !hasTag(st, "a", ref) {
			t.Fatalf("bad status %d: %v", kind, st)
		}
		if got := hasTag(st, "q", patch.ID); got != (kind == testkit.KindStatusApplied) {
			t.Fatalf("status %d: has q tag = %v", kind, got)
		}
	}

	g := owner.GraspList([]string{"wss://a", "wss://b"})
	assertTags(t, g.Tags, nostr.Tags{{"g", "wss://a"}, {"g", "wss://b"}})
	if g.Kind != 10317 {
		t.Fatalf("kind %d", g.Kind)
	}
}

func TestDeletionTags(t *testing.T) {
	k := testkit.NewKey()
	ann := k.Announcement("r", nil, nil, nil)
	note := k.Note("n")
	note2 := k.Note("n2")
	grasp := k.GraspList(nil)
	del := k.Deletion([]*nostr.Event{ann, note, note2, grasp})
	assertTags(t, del.Tags, nostr.Tags{
		{"a", testkit.RepoRef(k.PubKey, "r")}, {"e", note.ID}, {"e", note2.ID},
		{"a", "10317:" + k.PubKey + ":"},
		{"k", "30617"}, {"k", "1"}, {"k", "10317"},
	})
	if del.Kind != 5 {
		t.Fatalf("kind %d", del.Kind)
	}
}

func hasTag(evt *nostr.Event, key, value string) bool {
	return slices.ContainsFunc(evt.Tags, func(t nostr.Tag) bool { return len(t) >= 2 && t[0] == key && t[1] == value })
}

func assertTags(t *testing.T, got, want nostr.Tags) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("tags:\n got %v\nwant %v", got, want)
	}
}

func ExampleKey_Announcement() {
	k := testkit.NewKey()
	ann := k.Announcement("grasp-sync",
		[]string{testkit.GraspCloneURL("wss://grasp.example.com", k.PubKey, "grasp-sync")},
		[]string{"wss://grasp.example.com"},
		nil,
		testkit.At(1700000000),
	)
	ok, _ := ann.CheckSignature()
	fmt.Println(ann.Kind, ann.Tags.GetD(), ann.CreatedAt, ann.CheckID(), ok)
	fmt.Println(strconv.Quote(ann.Tags.Find("relays")[1]))
	// Output:
	// 30617 grasp-sync 1700000000 true true
	// "wss://grasp.example.com"
}
