package history_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/history"
	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// A relay that caps every REQ at 7 results still yields every event, even
// with ties on created_at across page boundaries.
func TestReadThroughCappedRelay(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := testrelay.Start(t, testrelay.Options{MaxLimit: 7})
	k := testkit.NewKey()
	want := map[string]bool{}
	for i := range 60 {
		evt := k.Note("n", testkit.At(nostr.Timestamp(1000+i/3))) // three per second
		r.Add(t, evt)
		want[evt.ID] = true
	}
	c, err := relayconn.Dial(ctx, r.URL, relayconn.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := map[string]bool{}
	st, err := history.Read(ctx, c, nostr.Filter{Kinds: []int{1}, Limit: 500}, 500, 100, func(evts []*nostr.Event) error {
		for _, e := range evts {
			if got[e.ID] {
				t.Errorf("event %s delivered twice", e.ID)
			}
			got[e.ID] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("read %d of %d events in %d pages", len(got), len(want), st.Pages)
	}
}

// A relay capping REQs at 100 holds 1,000 events of one second tagging one
// repository (layer 2) and 1,000 comments on one issue (layer 3). With
// NIP-77 every one is read; without it the crowded slice cannot be narrowed
// (one tag value, every kind) and the read says so instead of ending as if
// complete. Either way every older event is still read.
func TestReadCrowdedSecondOnRealRelay(t *testing.T) {
	const at = nostr.Timestamp(1_700_000_000)
	owner, author := testkit.NewKey(), testkit.NewKey()
	repo := testkit.RepoRef(owner.PubKey, "crowded")
	issue := author.Issue(repo, "root", testkit.At(at-100))
	var layer2, layer3 []*nostr.Event
	for i := range 1000 {
		layer2 = append(layer2, author.Issue(repo, fmt.Sprintf("issue %d", i), testkit.At(at)))
		layer3 = append(layer3, author.Comment(issue, issue, fmt.Sprintf("comment %d", i), testkit.At(at)))
	}
	older := author.Issue(repo, "older", testkit.At(at-10))
	for _, nip77 := range []bool{true, false} {
		r := testrelay.Start(t, testrelay.Options{MaxLimit: 100, Negentropy: nip77})
		r.Add(t, append(append([]*nostr.Event{issue, older}, layer2...), layer3...)...)
		for _, tc := range []struct {
			layer  string
			filter nostr.Filter
			want   int
		}{
			{"layer 2", nostr.Filter{Tags: nostr.TagMap{"a": {repo}}, Limit: 500}, 1002},
			{"layer 3", nostr.Filter{Tags: nostr.TagMap{"e": {issue.ID}}, Limit: 500}, 1000},
		} {
			t.Run(fmt.Sprintf("%s nip77=%v", tc.layer, nip77), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				c, err := relayconn.Dial(ctx, r.URL, relayconn.Options{})
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				got := map[string]bool{}
				st, err := history.Read(ctx, c, tc.filter, 100, 1000, func(evts []*nostr.Event) error {
					for _, e := range evts {
						if got[e.ID] {
							t.Errorf("event %s delivered twice", e.ID)
						}
						got[e.ID] = true
					}
					return nil
				})
				t.Logf("read %d events in %d pages, %d crowded seconds, err %v", len(got), st.Pages, st.Seconds, err)
				if nip77 {
					if err != nil {
						t.Fatal(err)
					}
					if len(got) != tc.want {
						t.Fatalf("read %d of %d events", len(got), tc.want)
					}
					return
				}
				var inc *history.IncompleteError
				if !errors.As(err, &inc) || len(inc.Slices) != 1 || *inc.Slices[0].Since != at {
					t.Fatalf("err = %v, want the slice at %d reported incomplete", err, at)
				}
				if tc.layer == "layer 2" && !got[older.ID] || tc.layer == "layer 2" && !got[issue.ID] {
					t.Errorf("events below the crowded second were not read")
				}
			})
		}
	}
}
