package syncbaseline_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/syncbaseline"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// TestSyncBaselineStoresEveryLayer: the benchmark's baseline brings a
// repository's layer-2 events, its state (30618, which carries no "a" tag)
// and the comments on its roots (layer 3) from every relay listing it,
// checks every copy and stores each event once; an event of another
// repository stays behind.
func TestSyncBaselineStoresEveryLayer(t *testing.T) {
	owner, who := testkit.NewKey(), testkit.NewKey()
	repo := testkit.RepoRef(owner.PubKey, "bench-repo")
	issue := who.Issue(repo, "an issue")
	patch := who.Patch(repo)
	comment := who.Comment(issue, issue, "a comment")
	state := owner.State("bench-repo", map[string]string{"refs/heads/main": "0123456789abcdef0123456789abcdef01234567"})
	other := who.Issue(testkit.RepoRef(owner.PubKey, "not-listed"), "elsewhere")
	want := []*nostr.Event{issue, patch, comment, state}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var relays []syncbaseline.Relay
	for range 2 {
		r := testrelay.Start(t, testrelay.Options{MaxLimit: 500})
		for _, e := range append([]*nostr.Event{other}, want...) {
			if err := r.Store.SaveEvent(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		relays = append(relays, syncbaseline.Relay{URL: r.URL, Repos: []string{repo}})
	}
	st, err := store.Open(filepath.Join(t.TempDir(), "events"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()

	stats, err := syncbaseline.Sync(ctx, st, relays)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range want {
		if ok, err := st.Has(ctx, e.ID); err != nil || !ok {
			t.Errorf("kind %d event %s not stored (%v)", e.Kind, e.ID, err)
		}
	}
	if ok, _ := st.Has(ctx, other.ID); ok {
		t.Errorf("the unlisted repository's issue was stored")
	}
	if stats.Stored != int64(len(want)) {
		t.Errorf("stored %d, want %d", stats.Stored, len(want))
	}
	// Every copy is received and verified: at least each event from each
	// relay.
	if stats.Received < int64(2*len(want)) || stats.Verified != stats.Received {
		t.Errorf("received %d, verified %d: want every copy from both relays (≥ %d) checked", stats.Received, stats.Verified, 2*len(want))
	}
}
