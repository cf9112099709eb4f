package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// signed builds and signs an event of kind with exactly tags.
func signed(k testkit.Key, kind int, content string, tags ...nostr.Tag) *nostr.Event {
	return k.Sign(&nostr.Event{Kind: kind, Content: content, Tags: tags, CreatedAt: nostr.Now()})
}

// Each tag variation alone is synced: a, A and q naming the repository
// (layer 2), e, E and q naming a root (layer 3). Every event carries only
// the one tag, so a filter missing a tag name misses its event.
func TestTagVariations(t *testing.T) {
	remote := testrelay.Start(t, testrelay.Options{Negentropy: true})
	app := start(t, nil)
	owner, other := testkit.NewKey(), testkit.NewKey()
	repo := testkit.RepoRef(owner.PubKey, "tags")
	root := other.Issue(repo, "the root")
	cases := map[string]*nostr.Event{
		"a on repo": signed(other, 1621, "issue by a", nostr.Tag{"a", repo}),
		"A on repo": signed(other, 1111, "comment by A", nostr.Tag{"A", repo}),
		"q on repo": signed(other, 1, "note quoting the repo", nostr.Tag{"q", repo}),
		"e on root": signed(other, 1111, "comment by e", nostr.Tag{"e", root.ID}),
		"E on root": signed(other, 1111, "comment by E", nostr.Tag{"E", root.ID}),
		"q on root": signed(other, 1, "note quoting the root", nostr.Tag{"q", root.ID}),
	}
	remote.Add(t, root)
	for _, e := range cases {
		remote.Add(t, e)
	}
	unrelated := signed(other, 1621, "other repo", nostr.Tag{"a", testkit.RepoRef(other.PubKey, "tags")})
	remote.Add(t, unrelated)
	announce(t, app, ourAnnouncement(owner, app, "tags", []string{remote.URL}, nil))
	mustArrive(t, app, 20*time.Second, root)
	for name, e := range cases {
		t.Run(name, func(t *testing.T) { mustArrive(t, app, 10*time.Second, e) })
	}
	mustNotArrive(t, app, 0, unrelated)
}

// A maintainer's announcement (not listing us, on the remote only, older
// than the owner's) and the state of a maintainer's maintainer arrive; a
// state by a stranger does not. An issue tagging only the maintainer's
// coordinate is synced too (layer 2 names the maintainers' stored
// coordinates): TestMaintainerCoordinateSynced.
func TestMaintainersRecursive(t *testing.T) {
	remote := testrelay.Start(t, testrelay.Options{Negentropy: true})
	app := start(t, nil)
	owner, m1, m2, stranger, contributor := testkit.NewKey(), testkit.NewKey(), testkit.NewKey(), testkit.NewKey(), testkit.NewKey()
	earlier := testkit.At(nostr.Timestamp(time.Now().Add(-time.Hour).Unix()))
	m1Ann := m1.Announcement("proj", []string{"https://git.example.org/m1/proj.git"}, []string{remote.URL}, []string{m2.PubKey}, earlier)
	m2Ann := m2.Announcement("proj", []string{"https://git.example.org/m2/proj.git"}, []string{remote.URL}, nil, earlier)
	m2State := m2.State("proj", map[string]string{"refs/heads/main": testkit.FakeCommit()})
	strangerState := stranger.State("proj", map[string]string{"refs/heads/main": testkit.FakeCommit()})
	m1Issue := contributor.Issue(testkit.RepoRef(m1.PubKey, "proj"), "filed on the maintainer's repo")
	remote.Add(t, m1Ann, m2Ann, m2State, strangerState, m1Issue)
	announce(t, app, ourAnnouncement(owner, app, "proj", []string{remote.URL}, []string{m1.PubKey}))
	mustArrive(t, app, 20*time.Second, m1Ann, m2Ann, m2State)
	mustNotArrive(t, app, time.Second, strangerState)
}

// TestLiveIssueThenComment runs liveIssueThenComment against graspd in-process.
func TestLiveIssueThenComment(t *testing.T) { liveIssueThenComment(t, start) }

// Live: once the repository is synced, an issue and immediately a comment on
// it (before any layer 3 subscription for the issue can exist) both arrive.
func liveIssueThenComment(t *testing.T, start starter) {
	remote := testrelay.Start(t, testrelay.Options{})
	app := start(t, nil)
	owner, contributor := testkit.NewKey(), testkit.NewKey()
	repo := testkit.RepoRef(owner.PubKey, "live")
	first := contributor.Issue(repo, "history")
	remote.Add(t, first)
	announce(t, app, ourAnnouncement(owner, app, "live", []string{remote.URL}, nil))
	mustArrive(t, app, 20*time.Second, first)
	waitConnected(t, app, remote.URL, true)
	for i := 0; i < 5; i++ {
		issue := contributor.Issue(repo, "live one")
		comment := owner.Comment(issue, issue, "on it")
		reply := contributor.Comment(issue, comment, "thanks")
		mustPublish(t, remote, issue, comment, reply)
		mustArrive(t, app, 15*time.Second, issue, comment, reply)
	}
}

// waitConnected waits until the fetcher's session to url is (or is not)
// open.
func waitConnected(t *testing.T, app appWithMetrics, url string, want bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		got, err := RelayConnected(ctx, app, url)
		if err == nil && got == want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("relay %s connected = %v, want %v (err %v)", url, got, want, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
