package target

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

func openMirror(t *testing.T) *store.Store {
	t.Helper()
	m, err := store.Open(filepath.Join(t.TempDir(), "mirror"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func inMirror(t *testing.T, m *store.Store, id string) bool {
	t.Helper()
	evts, err := m.Query(context.Background(), nostr.Filter{IDs: []string{id}})
	if err != nil {
		t.Fatal(err)
	}
	return len(evts) == 1
}

// countEvents counts the EVENT messages the relay receives from now on.
func countEvents(r *testrelay.Relay) *atomic.Int64 {
	var n atomic.Int64
	r.Khatru.RejectEvent = append(r.Khatru.RejectEvent, func(context.Context, *nostr.Event) (bool, string) {
		n.Add(1)
		return false, ""
	})
	return &n
}

// Events others wrote to the target directly (a comment, a status, a state:
// what discovery's self-subscription does not read) are in the mirror after
// a refresh, without anything being published to the target; an event the
// mirror holds and the target lacks is counted and kept; kinds sync does
// not fetch are left alone.
func TestMirrorRefreshDownloadsWhatOthersWrote(t *testing.T) {
	ctx := testCtx(t)
	r := testrelay.Start(t, testrelay.Options{Negentropy: true, MaxLimit: 2})
	mirror := openMirror(t)
	owner, other := testkit.NewKey(), testkit.NewKey()
	ref := testkit.RepoRef(owner.PubKey, "r")
	ann := owner.Announcement("r", nil, []string{r.URL}, nil)
	issue := owner.Issue(ref, "root")
	// Ours: published through the mirror's Store, so on both sides.
	p, _ := newPublisher(t, Settings{Relay: r.URL})
	for _, e := range []*nostr.Event{ann, issue} {
		if _, err := (&Store{Mirror: mirror, Pub: p}).Save(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	// Theirs: written to the target by another key, not through us.
	comment := other.Comment(issue, issue, "written on the target")
	status := owner.Status(testkit.KindStatusClosed, issue)
	state := owner.State("r", map[string]string{"refs/heads/main": testkit.FakeCommit()})
	note := other.Note("not a kind sync fetches")
	if err := testrelay.Publish(ctx, r.URL, comment, status, state, note); err != nil {
		t.Fatal(err)
	}
	// Only in the mirror: the target dropped it.
	dropped := owner.Issue(ref, "dropped by the target")
	// Only in the mirror too, but replaced on the target by state.
	oldState := owner.State("r", map[string]string{"refs/heads/main": testkit.FakeCommit()}, testkit.At(state.CreatedAt-60))
	for _, e := range []*nostr.Event{dropped, oldState} {
		if _, err := mirror.Save(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	sent := countEvents(r)

	reg := prometheus.NewRegistry()
	rf := NewRefresher(Settings{Relay: r.URL, RefreshInterval: time.Hour}, mirror, clock.NewFake(time.Unix(1_800_000_000, 0)), quiet(), reg)
	res, err := rf.Refresh(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Fetched != 3 || res.MissingOnTarget != 1 || res.Unsupported || res.Partial {
		t.Fatalf("refresh %+v; want 3 fetched (paged past the target's limit of 2), 1 missing on the target (the replaced state is not)", res)
	}
	for _, e := range []*nostr.Event{comment, status, state, dropped, ann, issue} {
		if !inMirror(t, mirror, e.ID) {
			t.Fatalf("kind %d %s not in the mirror after the refresh", e.Kind, e.ID)
		}
	}
	if inMirror(t, mirror, oldState.ID) {
		t.Fatal("the older state the target replaced is still in the mirror")
	}
	if inMirror(t, mirror, note.ID) {
		t.Fatal("a kind-1 note was mirrored: not a kind sync fetches")
	}
	if sent.Load() != 0 || has(t, r, dropped.ID) {
		t.Fatalf("the refresh published to the target (%d EVENTs)", sent.Load())
	}
	if f := testutil.ToFloat64(rf.m.fetched); f != 3 {
		t.Fatalf("grasp_target_mirror_fetched_total %v", f)
	}
	if g := testutil.ToFloat64(rf.m.missing); g != 1 {
		t.Fatalf("grasp_target_mirror_missing_on_target %v", g)
	}

	// A second refresh finds nothing to fetch.
	res, err = rf.Refresh(ctx)
	if err != nil || res.Fetched != 0 || res.MissingOnTarget != 1 {
		t.Fatalf("second refresh %+v, %v", res, err)
	}
	if ok := testutil.ToFloat64(rf.m.result.WithLabelValues("ok")); ok != 2 {
		t.Fatalf("grasp_target_mirror_refresh_total{result=ok} %v", ok)
	}
}

// A target without NIP-77: the refresh reports unsupported and changes
// nothing.
func TestMirrorRefreshWithoutNIP77(t *testing.T) {
	ctx := testCtx(t)
	r := testrelay.Start(t, testrelay.Options{})
	mirror := openMirror(t)
	k := testkit.NewKey()
	issue := k.Issue(testkit.RepoRef(k.PubKey, "r"), "on the target only")
	if err := testrelay.Publish(ctx, r.URL, issue); err != nil {
		t.Fatal(err)
	}
	rf := NewRefresher(Settings{Relay: r.URL, RefreshInterval: time.Hour}, mirror, clock.Real{}, quiet(), nil)
	res, err := rf.Refresh(ctx)
	if err != nil || !res.Unsupported || res.Fetched != 0 {
		t.Fatalf("refresh %+v, %v; want unsupported, nothing fetched", res, err)
	}
	if inMirror(t, mirror, issue.ID) {
		t.Fatal("the mirror changed")
	}
	if u := testutil.ToFloat64(rf.m.result.WithLabelValues("unsupported")); u != 1 {
		t.Fatalf("grasp_target_mirror_refresh_total{result=unsupported} %v", u)
	}
}

// Run refreshes after its start delay and again after each interval of the
// injected clock.
func TestMirrorRefreshRunsOnTheClock(t *testing.T) {
	ctx, cancel := context.WithCancel(testCtx(t))
	r := testrelay.Start(t, testrelay.Options{Negentropy: true})
	mirror := openMirror(t)
	k := testkit.NewKey()
	ref := testkit.RepoRef(k.PubKey, "r")
	clk := clock.NewFake(time.Unix(1_800_000_000, 0))
	rf := NewRefresher(Settings{Relay: r.URL, RefreshInterval: time.Hour}, mirror, clk, quiet(), nil)
	done := make(chan error, 1)
	go func() { done <- rf.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})

	for n, advance := range []time.Duration{rf.StartDelay, time.Hour} {
		e := k.Issue(ref, fmt.Sprintf("written on the target before round %d", n))
		if err := testrelay.Publish(ctx, r.URL, e); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return clk.Waiters() > 0 })
		if inMirror(t, mirror, e.ID) {
			t.Fatalf("round %d: mirrored before the clock moved", n)
		}
		clk.Advance(advance)
		waitFor(t, func() bool { return inMirror(t, mirror, e.ID) })
	}
}

// waitFor polls cond until it holds (the test's context bounds it).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
