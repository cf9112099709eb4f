package ingester_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

// TestDependenciesWithinOneBatch: events that depend on each other are
// queued before the ingester starts, so they reach it in the same batches.
// The result must be what one-by-one ingestion gives: an issue and its
// comment after their announcement are stored; a target deleted later in
// the batch is removed, one deleted earlier in the batch is refused; of two
// versions of an announcement the newer stays; a forged copy of a valid
// event (same id, another signature) is never stored, before or after the
// valid one, and no copy is stored twice.
func TestDependenciesWithinOneBatch(t *testing.T) {
	alice, bob := testkit.NewKey(), testkit.NewKey()
	base := nostr.Now() - 1000
	annV1 := alice.Announcement("repo", []string{testkit.GraspCloneURL(service, alice.PubKey, "repo")}, []string{service}, nil, testkit.At(base))
	annV2 := alice.Announcement("repo", []string{testkit.GraspCloneURL(service, alice.PubKey, "repo")}, []string{service}, nil, testkit.At(base+1))
	ref := testkit.RepoRef(alice.PubKey, "repo")
	issue := bob.Issue(ref, "crash", testkit.At(base+2))
	comment := alice.Comment(issue, issue, "thanks", testkit.At(base+3))
	reply := bob.Comment(issue, comment, "welcome", testkit.At(base+4))
	laterDeleted := bob.Issue(ref, "oops", testkit.At(base+5))
	delLater := bob.Deletion([]*nostr.Event{laterDeleted}, testkit.At(base+6))
	deletedFirst := bob.Issue(ref, "never mind", testkit.At(base+7))
	delFirst := bob.Deletion([]*nostr.Event{deletedFirst}, testkit.At(base+8))
	forge := func(e *nostr.Event) *nostr.Event {
		f := *e
		f.Sig = reply.Sig // a well-formed signature, of another event
		return &f
	}
	forgedBefore, forgedAfter := forge(issue), forge(comment)

	var ds []delivery
	add := func(e *nostr.Event, msgID string) {
		data, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, delivery{data: data, msgID: msgID, relay: "wss://remote.example"})
	}
	add(annV1, annV1.ID)
	add(forgedBefore, "forged-"+issue.ID)
	add(issue, issue.ID)
	add(annV2, annV2.ID)
	add(comment, comment.ID)
	add(forgedAfter, "forged-"+comment.ID)
	add(reply, reply.ID)
	add(comment, "") // a copy from another relay, in the same batch
	add(laterDeleted, laterDeleted.ID)
	add(delLater, delLater.ID)
	add(delFirst, delFirst.ID)
	add(deletedFirst, deletedFirst.ID)

	e := newEnv(t)
	e.publish(t, ds)
	r := e.start(t, fastConfig(), nil)
	want := map[string]bool{annV2.ID: true, issue.ID: true, comment.ID: true, reply.ID: true, delLater.ID: true, delFirst.ID: true}
	e.waitDrained(t, want, time.Minute)
	e.assertExactly(t, want)
	for _, valid := range []*nostr.Event{issue, comment} {
		got, err := e.raw.Query(context.Background(), nostr.Filter{IDs: []string{valid.ID}})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].Sig != valid.Sig {
			t.Errorf("kind %d %.8s: stored %d copies, want the validly signed one", valid.Kind, valid.ID, len(got))
		}
	}
	// A forged copy of a stored event now costs no signature check: it is a
	// duplicate of the stored one, which stays as it is.
	before := r.ing.Stats()
	late := forge(issue)
	data, err := json.Marshal(late)
	if err != nil {
		t.Fatal(err)
	}
	e.publish(t, []delivery{{data: data, msgID: "late-forged-" + issue.ID, relay: "wss://remote.example"}})
	waitUntil(t, "the late forged copy handled", func() bool { return r.ing.Stats().Consumed > before.Consumed })
	e.waitDrained(t, want, time.Minute)
	e.assertExactly(t, want)
	if got, err := e.raw.Query(context.Background(), nostr.Filter{IDs: []string{issue.ID}}); err != nil || len(got) != 1 || got[0].Sig != issue.Sig {
		t.Fatalf("after a forged copy: %d stored copies (err %v), want the valid one", len(got), err)
	}
	if after := r.ing.Stats(); after.Duplicates != before.Duplicates+1 || after.Verified != before.Verified {
		t.Errorf("late forged copy: duplicates %d → %d, verified %d → %d; want one more duplicate, no verification",
			before.Duplicates, after.Duplicates, before.Verified, after.Verified)
	}
	st := r.ing.Stats()
	// + the announcement v1 (replaced by v2) and the issue deleted later
	// (stored, then removed by its deletion).
	if st.Stored != int64(len(want))+2 {
		t.Errorf("stored counter = %d, want %d", st.Stored, len(want)+2)
	}
	t.Logf("stats: %+v", st)
}
