package fetcher_test

import (
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// signAll builds n events with build, signing on every core.
func signAll(n int, build func(i int) *nostr.Event) []*nostr.Event {
	out := make([]*nostr.Event, n)
	var wg sync.WaitGroup
	for w := range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for i := w; i < n; i += runtime.GOMAXPROCS(0) {
				out[i] = build(i)
			}
		})
	}
	wg.Wait()
	return out
}

// A relay capping REQs at 100 holds 1,000 events with one created_at on
// one repository (layer 2: issues tagging its coordinate) and on one root
// (layer 3: comments on one issue). With NIP-77 the batch gets every event
// and is OK; without it the one-second slice of a single tag value cannot
// be narrowed, and the batch is reported INCOMPLETE (counted), never OK,
// while everything outside that slice is still fetched.
func TestCrowdedSecondOneRepositoryAndOneRoot(t *testing.T) {
	const at = nostr.Timestamp(1_700_000_000)
	owner, author := testkit.NewKey(), testkit.NewKey()
	repo := testkit.RepoRef(owner.PubKey, "crowded")
	issue := author.Issue(repo, "root", testkit.At(at-100))
	older := author.Issue(repo, "older", testkit.At(at-10))
	layer2 := signAll(1000, func(i int) *nostr.Event { return author.Issue(repo, fmt.Sprint("issue ", i), testkit.At(at)) })
	layer3 := signAll(1000, func(i int) *nostr.Event {
		return author.Comment(issue, issue, fmt.Sprint("comment ", i), testkit.At(at))
	})
	for _, nip77 := range []bool{true, false} {
		r := testrelay.Start(t, testrelay.Options{MaxLimit: 100, Negentropy: nip77})
		r.Add(t, append(append([]*nostr.Event{issue, older}, layer2...), layer3...)...)
		for _, tc := range []struct {
			layer  string
			filter nostr.Filter
			crowd  []*nostr.Event
			rest   []*nostr.Event
		}{
			{"layer 2", nostr.Filter{Tags: nostr.TagMap{"a": {repo}}}, layer2, []*nostr.Event{issue, older}},
			{"layer 3", nostr.Filter{Tags: nostr.TagMap{"e": {issue.ID}}}, layer3, nil},
		} {
			t.Run(fmt.Sprintf("%s nip77=%v", tc.layer, nip77), func(t *testing.T) {
				e := newEnv(t)
				f := e.start(baseConfig("a"), nil)
				s := e.connectRelay(r.URL)
				e.addFilters(0, r.URL, s, "b1", []nostr.Filter{tc.filter}, nil)
				done := e.batchDone(r.URL, "b1")
				t.Logf("batch: %v", done)
				e.waitEvents(tc.rest)
				if nip77 {
					if done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK {
						t.Fatalf("batch %v, want OK", done)
					}
					e.waitEvents(tc.crowd)
					return
				}
				if done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_INCOMPLETE || done.GetIncompleteSlices() != 1 {
					t.Fatalf("batch %v, want INCOMPLETE with one slice", done)
				}
				if got := metric(t, f.reg, "grasp_fetcher_incomplete_slices_total", nil); got != 1 {
					t.Errorf("incomplete slices metric = %v, want 1", got)
				}
				if got := metric(t, f.reg, "grasp_fetcher_batches_total", map[string]string{"outcome": "INCOMPLETE", "method": "REQ"}); got != 1 {
					t.Errorf("incomplete batches metric = %v, want 1", got)
				}
			})
		}
	}
}

// Without NIP-77, 1,000 events of one second spread over 20 repositories
// of one batch (50 each) are all fetched through a relay capping at 100:
// the slice is split into halves of its coordinate list until each part
// comes back under the cap.
func TestCrowdedSecondSplitByRepository(t *testing.T) {
	const at = nostr.Timestamp(1_700_000_000)
	owner, author := testkit.NewKey(), testkit.NewKey()
	var repos []string
	for i := range 20 {
		repos = append(repos, testkit.RepoRef(owner.PubKey, fmt.Sprintf("repo-%02d", i)))
	}
	evts := signAll(1000, func(i int) *nostr.Event { return author.Issue(repos[i%20], fmt.Sprint("issue ", i), testkit.At(at)) })
	r := testrelay.Start(t, testrelay.Options{MaxLimit: 100})
	r.Add(t, evts...)
	e := newEnv(t)
	f := e.start(baseConfig("a"), nil)
	s := e.connectRelay(r.URL)
	e.addFilters(0, r.URL, s, "b1", []nostr.Filter{{Tags: nostr.TagMap{"a": repos}}}, nil)
	done := e.batchDone(r.URL, "b1")
	if done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK || done.GetMethod() != graspv1.SyncMethod_SYNC_METHOD_REQ {
		t.Fatalf("batch %v", done)
	}
	e.waitEvents(evts)
	if got := metric(t, f.reg, "grasp_fetcher_crowded_seconds_total", nil); got != 1 {
		t.Errorf("crowded seconds metric = %v, want 1", got)
	}
	t.Logf("1,000 same-second events in %d REQs", done.GetPages())
}

// A relay capping REQs at 50, below the fetcher's RelayMinCap (100),
// holds 230 issues of one repository over distinct seconds: every 50-event
// page could be the relay's cap, so the read goes on until a page shorter
// than one the relay has returned, and all 230 arrive before the batch is
// OK. A later batch on the same connection whose first page is shorter
// than the 50 seen ends after that page.
func TestRelayCappingBelowMinCapReadCompletely(t *testing.T) {
	const at = nostr.Timestamp(1_700_000_000)
	owner, author := testkit.NewKey(), testkit.NewKey()
	repo, small := testkit.RepoRef(owner.PubKey, "capped"), testkit.RepoRef(owner.PubKey, "small")
	issues := signAll(230, func(i int) *nostr.Event {
		return author.Issue(repo, fmt.Sprint("issue ", i), testkit.At(at-nostr.Timestamp(i)))
	})
	few := signAll(30, func(i int) *nostr.Event {
		return author.Issue(small, fmt.Sprint("issue ", i), testkit.At(at-nostr.Timestamp(i)))
	})
	r := testrelay.Start(t, testrelay.Options{MaxLimit: 50})
	r.Add(t, append(issues, few...)...)
	e := newEnv(t)
	e.start(baseConfig("a"), nil)
	s := e.connectRelay(r.URL)
	e.addFilters(0, r.URL, s, "b1", []nostr.Filter{{Tags: nostr.TagMap{"a": {repo}}}}, nil)
	done := e.batchDone(r.URL, "b1")
	if done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK || done.GetMethod() != graspv1.SyncMethod_SYNC_METHOD_REQ {
		t.Fatalf("batch %v", done)
	}
	if done.GetEventsReceived() != 230 {
		t.Errorf("batch received %d events, want 230", done.GetEventsReceived())
	}
	e.waitEvents(issues)
	t.Logf("230 events capped at 50 in %d REQs", done.GetPages())

	e.addFilters(0, r.URL, s, "b2", []nostr.Filter{{Tags: nostr.TagMap{"a": {small}}}}, nil)
	done = e.batchDone(r.URL, "b2")
	if done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK {
		t.Fatalf("batch %v", done)
	}
	e.waitEvents(few)
	if done.GetPages() != 1 {
		t.Errorf("30 events after pages of 50 took %d REQs, want 1", done.GetPages())
	}
}
