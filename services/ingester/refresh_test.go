package ingester_test

import (
	"context"
	"testing"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
	"github.com/grasp-sync/grasp-sync/services/ingester/target"
)

// In bolt-on mode the ingester runs the mirror refresh on its clock: an
// issue someone else wrote to the target directly reaches the mirror (our
// store) without passing through the bus, once the clock has moved past the
// refresh's start delay.
func TestBoltOnIngesterRefreshesTheMirror(t *testing.T) {
	w := startLostWake(t)
	tr := testrelay.Start(t, testrelay.Options{Negentropy: true})
	w.cfg.Settings = target.Settings{Relay: tr.URL, RefreshInterval: time.Hour}
	k := testkit.NewKey()
	issue := k.Issue(testkit.RepoRef(k.PubKey, "repo"), "written on the target")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := testrelay.Publish(ctx, tr.URL, issue); err != nil {
		t.Fatal(err)
	}
	w.start(t)
	// Advance a minute at a time until the refresh ran (its timer may be
	// armed after any one advance).
	waitFor(t, "the issue in the mirror", func() bool {
		if w.has(t, issue.ID) {
			return true
		}
		w.clk.Advance(time.Minute)
		time.Sleep(50 * time.Millisecond)
		return w.has(t, issue.ID)
	})
}
