package e2e

import (
	"testing"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// TestLayer2ThenLayer3 runs layer2ThenLayer3 against graspd in-process.
func TestLayer2ThenLayer3(t *testing.T) { layer2ThenLayer3(t, start) }

// Discovery through layer 2 then layer 3: the announcement on our relay
// lists a REQ-only and a NIP-77 remote; a patch and an issue (layer 2,
// tagged with the repository) and a comment on the issue (layer 3, tagged
// only with the issue's id) arrive from each.
func layer2ThenLayer3(t *testing.T, start starter) {
	plain := testrelay.Start(t, testrelay.Options{})
	neg := testrelay.Start(t, testrelay.Options{Negentropy: true})
	app := start(t, nil)
	owner, contributor := testkit.NewKey(), testkit.NewKey()
	repo := testkit.RepoRef(owner.PubKey, "layers")
	var want []*nostrEvent
	for _, r := range []*testrelay.Relay{plain, neg} {
		patch := contributor.Patch(repo)
		issue := contributor.Issue(repo, "broken on "+r.URL)
		comment := owner.Comment(issue, issue, "looking")
		reply := contributor.Comment(issue, comment, "thanks")
		r.Add(t, patch, issue, comment, reply)
		want = append(want, patch, issue, comment, reply)
	}
	announce(t, app, ourAnnouncement(owner, app, "layers", []string{plain.URL, neg.URL}, nil))
	mustArrive(t, app, 20*time.Second, want...)
}

// An announcement published only to a remote bootstrap relay (never to us)
// that lists us is found through layer 1 and its repository synced; an
// announcement that does not list us, and a host-confusion one (our host in
// a clone URL path, a look-alike relay URL), are not, nor is their content.
func TestBootstrapLayer1(t *testing.T) {
	boot := testrelay.Start(t, testrelay.Options{Negentropy: true})
	app := start(t, Env{"GRASP_BOOTSTRAP_RELAYS": boot.URL})
	owner, stranger, confuser, contributor := testkit.NewKey(), testkit.NewKey(), testkit.NewKey(), testkit.NewKey()

	ours := ourAnnouncement(owner, app, "found", []string{boot.URL}, nil)
	notOurs := stranger.Announcement("elsewhere",
		[]string{"https://git.example.org/" + stranger.PubKey + "/elsewhere.git"}, []string{boot.URL}, nil)
	host := app.PublicURL()[len("ws://"):]
	confused := confuser.Announcement("confused",
		[]string{"https://evil.example.org/" + host + "/confused.git", "https://" + host + ".evil.example.org/x/confused.git"},
		[]string{"wss://evil.example.org/" + host, boot.URL}, nil)
	issue := contributor.Issue(testkit.RepoRef(owner.PubKey, "found"), "via bootstrap")
	strangerIssue := contributor.Issue(testkit.RepoRef(stranger.PubKey, "elsewhere"), "not ours")
	confusedIssue := contributor.Issue(testkit.RepoRef(confuser.PubKey, "confused"), "not ours either")
	boot.Add(t, ours, notOurs, confused, issue, strangerIssue, confusedIssue)

	mustArrive(t, app, 20*time.Second, ours, issue)
	mustNotArrive(t, app, 2*time.Second, notOurs, confused, strangerIssue, confusedIssue)
}

// History is synced from a REQ-only remote and from a NIP-77 one.
func TestHistoryWithAndWithoutNegentropy(t *testing.T) {
	for _, neg := range []bool{false, true} {
		name := "REQ"
		if neg {
			name = "NIP-77"
		}
		t.Run(name, func(t *testing.T) {
			remote := testrelay.Start(t, testrelay.Options{Negentropy: neg, MaxLimit: 100}) // = the fetcher's RelayMinCap
			app := start(t, nil)
			owner, contributor := testkit.NewKey(), testkit.NewKey()
			repo := testkit.RepoRef(owner.PubKey, "history")
			var want []*nostrEvent
			base := time.Now().Add(-48 * time.Hour).Unix()
			for i := 0; i < 250; i++ {
				issue := contributor.Issue(repo, "old issue", testkit.At(nostrTimestamp(base+int64(i*60))))
				want = append(want, issue)
				if i%10 == 0 {
					want = append(want, owner.Comment(issue, issue, "ack", testkit.At(nostrTimestamp(base+int64(i*60+30)))))
				}
			}
			remote.Add(t, want...)
			announce(t, app, ourAnnouncement(owner, app, "history", []string{remote.URL}, nil))
			mustArrive(t, app, 30*time.Second, want...)
		})
	}
}

// TestHistory5000CappedAt500 runs history5000CappedAt500 against graspd in-process.
func TestHistory5000CappedAt500(t *testing.T) { history5000CappedAt500(t, start) }

// History of 5,000 issues through a relay that caps every REQ at 500 (like
// strfry): the fetcher must page with until to get them all.
func history5000CappedAt500(t *testing.T, start starter) {
	if testing.Short() {
		t.Skip("SKIP: -short")
	}
	remote := testrelay.Start(t, testrelay.Options{MaxLimit: 500})
	app := start(t, nil)
	owner, contributor := testkit.NewKey(), testkit.NewKey()
	repo := testkit.RepoRef(owner.PubKey, "big")
	want := make([]*nostrEvent, 0, 5000)
	base := time.Now().Add(-30 * 24 * time.Hour).Unix()
	for i := 0; i < 5000; i++ {
		// Several issues share a second, so paging must not lose ties.
		want = append(want, contributor.Issue(repo, "old", testkit.At(nostrTimestamp(base+int64(i/3)))))
	}
	remote.Add(t, want...)
	began := time.Now()
	announce(t, app, ourAnnouncement(owner, app, "big", []string{remote.URL}, nil))
	mustArrive(t, app, 90*time.Second, want...)
	t.Logf("5,000 issues stored %s after the announcement", time.Since(began).Round(10*time.Millisecond))
}
