package e2e

import (
	"context"
	"fmt"
	"testing"

	"github.com/grasp-sync/grasp-sync/pkg/filters"
	"github.com/grasp-sync/grasp-sync/pkg/negsync"
	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// A NIP-77 reconciliation between identical sets needs nothing: the daily
// resync's byte budget depends on it. Sets of several sizes against a real
// khatru relay.
func TestReconcileIdenticalNeedsNothing(t *testing.T) {
	for _, n := range []int{10, 300, 2000} {
		remote := testrelay.Start(t, testrelay.Options{Negentropy: true})
		owner := testkit.NewKey()
		repo := testkit.RepoRef(owner.PubKey, "n")
		var local []negsync.Item
		for i := 0; i < n; i++ {
			e := owner.Issue(repo, fmt.Sprint("x", i), testkit.At(nostrTimestamp(1_700_000_000+int64(i%97))))
			if err := remote.Store.SaveEvent(context.Background(), e); err != nil {
				t.Fatal(err)
			}
			local = append(local, negsync.Item{ID: e.ID, CreatedAt: e.CreatedAt})
		}
		c, err := relayconn.Dial(context.Background(), remote.URL, relayconn.Options{})
		if err != nil {
			t.Fatal(err)
		}
		res, err := negsync.Reconcile(context.Background(), c, filters.Layer2([]string{repo})[0], local, negsync.Options{FrameSize: 60000})
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Need) != 0 {
			t.Errorf("%d identical items: need %d, %d bytes in", n, len(res.Need), res.BytesIn)
		} else {
			t.Logf("%d identical items: %d bytes in", n, res.BytesIn)
		}
	}
}
