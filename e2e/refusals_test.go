package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// metricAtLeast polls app's metrics until the sum of name (matching match)
// reaches want, and returns the value it read.
func metricAtLeast(t *testing.T, app Target, wait time.Duration, want float64, name string, match ...string) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var got float64
	for {
		if m, err := app.Metrics(ctx); err == nil {
			if got = MetricSum(m, name, match...); got >= want {
				return got
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s%v = %v after %s, want ≥ %v", name, match, got, wait, want)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// metricNow reads one metric sum.
func metricNow(t *testing.T, app Target, name string, match ...string) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := app.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return MetricSum(m, name, match...)
}

// Foreign announcements (not listing us, by authors who maintain nothing we
// serve) are refused once and then remembered: a daily resync through NIP-77
// counts them as held and does not download them again.
func TestForeignAnnouncementsNotFetchedAgain(t *testing.T) {
	remote := testrelay.Start(t, testrelay.Options{Negentropy: true})
	app := start(t, Env{"GRASP_PLANNER_RESYNC_MIN": "4s", "GRASP_PLANNER_RESYNC_MAX": "5s"})
	owner, contributor := testkit.NewKey(), testkit.NewKey()
	const foreign = 6
	for i := 0; i < foreign; i++ {
		k := testkit.NewKey()
		d := fmt.Sprintf("foreign-%d", i)
		remote.Add(t, k.Announcement(d, []string{"https://elsewhere.example/" + d + ".git"}, []string{"wss://elsewhere.example"}, nil))
	}
	issue := contributor.Issue(testkit.RepoRef(owner.PubKey, "ours"), "ours")
	remote.Add(t, issue)
	announce(t, app, ourAnnouncement(owner, app, "ours", []string{remote.URL}, nil))
	mustArrive(t, app, 20*time.Second, issue)
	metricAtLeast(t, app, 20*time.Second, foreign, "grasp_ingester_refused_total", `reason="not-maintainer"`)

	// Between two daily resyncs that both start after the refusals, nothing
	// is received in history: our events are stored, the foreign ones
	// remembered.
	daily := metricNow(t, app, "grasp_planner_reconnects_total", `kind="daily"`)
	metricAtLeast(t, app, 30*time.Second, daily+1, "grasp_planner_reconnects_total", `kind="daily"`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := WaitQuiescent(ctx, app, []string{remote.URL}, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	before := metricNow(t, app, "grasp_fetcher_events_received_total", `mode="historic"`)
	daily = metricNow(t, app, "grasp_planner_reconnects_total", `kind="daily"`)
	metricAtLeast(t, app, 30*time.Second, daily+1, "grasp_planner_reconnects_total", `kind="daily"`)
	if err := WaitQuiescent(ctx, app, []string{remote.URL}, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if after := metricNow(t, app, "grasp_fetcher_events_received_total", `mode="historic"`); after != before {
		t.Fatalf("a daily resync received %v events in history, want 0 (the %d foreign announcements are remembered)", after-before, foreign)
	}
}

// A maintainer's announcement refused (and remembered) while the owner did
// not name them is fetched again as soon as the owner does, and stored; then
// their state, an issue tagging only their coordinate and a comment on it
// follow.
func TestRefusedMaintainerRevived(t *testing.T) {
	remote := testrelay.Start(t, testrelay.Options{Negentropy: true})
	app := start(t, nil)
	owner, m, contributor := testkit.NewKey(), testkit.NewKey(), testkit.NewKey()
	earlier := testkit.At(nostr.Timestamp(time.Now().Add(-time.Hour).Unix()))
	mAnn := m.Announcement("proj", []string{"https://git.example.org/m/proj.git"}, []string{remote.URL}, nil, earlier)
	mState := m.State("proj", map[string]string{"refs/heads/main": testkit.FakeCommit()})
	issue := contributor.Issue(testkit.RepoRef(m.PubKey, "proj"), "filed on the maintainer's coordinate")
	comment := contributor.Comment(issue, issue, "and a reply")
	ownerIssue := contributor.Issue(testkit.RepoRef(owner.PubKey, "proj"), "filed on the owner's coordinate")
	remote.Add(t, mAnn, mState, issue, comment, ownerIssue)

	announce(t, app, ourAnnouncement(owner, app, "proj", []string{remote.URL}, nil, testkit.At(nostr.Now()-60)))
	mustArrive(t, app, 20*time.Second, ownerIssue)
	metricAtLeast(t, app, 20*time.Second, 1, "grasp_ingester_refused_total", `reason="not-listed"`)
	mustNotArrive(t, app, 0, mAnn)

	announce(t, app, ourAnnouncement(owner, app, "proj", []string{remote.URL}, []string{m.PubKey}))
	mustArrive(t, app, 20*time.Second, mAnn, mState, issue, comment)
}

// An issue on a remote relay that tags a repository only by a maintainer's
// coordinate (the owner's announcement names the maintainer and lists us)
// is synced, and so is a comment on it; one tagging the coordinate of an
// announcement by someone who maintains nothing of ours is not.
func TestMaintainerCoordinateSynced(t *testing.T) {
	remote := testrelay.Start(t, testrelay.Options{Negentropy: true})
	app := start(t, nil)
	owner, m, stranger, contributor := testkit.NewKey(), testkit.NewKey(), testkit.NewKey(), testkit.NewKey()
	mAnn := m.Announcement("proj", []string{"https://git.example.org/m/proj.git"}, []string{remote.URL}, nil)
	strangerAnn := stranger.Announcement("proj", []string{"https://git.example.org/s/proj.git"}, []string{remote.URL}, nil)
	issue := contributor.Issue(testkit.RepoRef(m.PubKey, "proj"), "filed on the maintainer's coordinate")
	comment := contributor.Comment(issue, issue, "a reply")
	patch := contributor.Patch(testkit.RepoRef(stranger.PubKey, "proj"))
	remote.Add(t, mAnn, strangerAnn, issue, comment, patch)
	announce(t, app, ourAnnouncement(owner, app, "proj", []string{remote.URL}, []string{m.PubKey}))
	mustArrive(t, app, 20*time.Second, mAnn, issue, comment)
	mustNotArrive(t, app, time.Second, strangerAnn, patch)
}
