package ingester_test

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/services/ingester"
)

// heldStore is a real store whose first SaveBatch holding the trigger event
// is held until release is closed, and whose first fail such calls fail
// every event (a write that does not commit).
type heldStore struct {
	ingester.Store
	trigger string
	fail    int
	held    chan struct{} // closed when the write is held
	release chan struct{}
	mu      sync.Mutex
	calls   int
}

func newHeldStore(st ingester.Store, trigger *nostr.Event, fail int) *heldStore {
	return &heldStore{Store: st, trigger: trigger.ID, fail: fail, held: make(chan struct{}), release: make(chan struct{})}
}

func (h *heldStore) SaveBatch(ctx context.Context, evts []*nostr.Event) []store.SaveResult {
	if !slices.ContainsFunc(evts, func(e *nostr.Event) bool { return e.ID == h.trigger }) {
		return h.Store.SaveBatch(ctx, evts)
	}
	h.mu.Lock()
	h.calls++
	n := h.calls
	h.mu.Unlock()
	if n == 1 {
		close(h.held)
		select {
		case <-h.release:
		case <-ctx.Done():
		}
	}
	if n <= h.fail {
		res := make([]store.SaveResult, len(evts))
		for k := range res {
			res[k].Err = errStoreDown
		}
		return res
	}
	return h.Store.SaveBatch(ctx, evts)
}

// overlapEnv is one replica over a heldStore, with a served repository
// (announcement stored beforehand) to put issues and comments on.
type overlapEnv struct {
	*env
	r     *replica
	held  *heldStore
	alice testkit.Key
	ann   *nostr.Event
	ref   string
	want  map[string]bool // what the store must end up holding
}

// startOverlap starts the replica with the write of trigger held (and its
// first fail attempts failed).
func startOverlap(t *testing.T, e *env, alice testkit.Key, trigger *nostr.Event, fail int) *overlapEnv {
	t.Helper()
	ann := served(alice, "repo")
	if _, err := e.raw.Save(context.Background(), ann); err != nil {
		t.Fatal(err)
	}
	o := &overlapEnv{env: e, alice: alice, ann: ann, ref: testkit.RepoRef(alice.PubKey, "repo"), want: map[string]bool{ann.ID: true}}
	o.held = newHeldStore(e.store, trigger, fail)
	cfg := fastConfig()
	cfg.AckWait = 30 * time.Second // nothing here may be redelivered for being slow
	o.r = e.start(t, cfg, o.held)
	e.waitPulling(t, cfg.Consumer, 1)
	return o
}

// send publishes evts as one message (a batch message when several): the
// ingester verifies and decides a message's events together.
func (o *overlapEnv) send(t *testing.T, evts ...*nostr.Event) {
	t.Helper()
	var ds []delivery
	for _, e := range evts {
		data, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, delivery{data: data, msgID: e.ID, relay: "wss://a.example"})
	}
	if n := o.publishBatched(t, ds, 64); n != 1 {
		t.Fatalf("%d messages, want 1", n)
	}
}

// waitHeld waits until the trigger's write is held.
func (o *overlapEnv) waitHeld(t *testing.T) {
	t.Helper()
	select {
	case <-o.held.held:
	case <-time.After(time.Minute):
		t.Fatal("the batch's write never began")
	}
}

// unacked is how many messages the ingester holds delivered and not acked.
func (o *overlapEnv) unacked(t *testing.T) int {
	t.Helper()
	ctx := context.Background()
	cons, err := o.bus.JS.Consumer(ctx, o.bus.Names.EventsStream(), "ingester")
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.NumAckPending
}

// refusals is how many events the replica refused so far.
func (o *overlapEnv) refusals() int64 {
	var n int64
	for _, c := range o.r.ing.Stats().Refused {
		n += c
	}
	return n
}

// waitDecidedWhileHeld waits until the replica refused refused events while
// the held write has not committed: the next batch was decided during the
// write (docs/decisions/0063-ingester-write-overlaps-decide.md). A decide
// stage that decides batches strictly one after the other never gets there.
func (o *overlapEnv) waitDecidedWhileHeld(t *testing.T, refused int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for o.refusals() < refused {
		if time.Now().After(deadline) {
			close(o.held.release)
			t.Fatalf("the next batch was not decided while the previous batch's write was held (%d refusals, want %d)", o.refusals(), refused)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// forStores runs fn on the embedded store and, with
// GRASP_TEST_POSTGRES_URL, on PostgreSQL.
func forStores(t *testing.T, fn func(t *testing.T, e *env)) {
	t.Helper()
	t.Run("embedded", func(t *testing.T) { fn(t, newEnv(t)) })
	t.Run("postgres", func(t *testing.T) { fn(t, newPostgresEnv(t)) })
}

// TestNextBatchDecidedDuringWrite: while batch N's write (an issue) is held
// before it commits, batch N+1 — a comment on that issue and an
// announcement that does not list us — is decided: the announcement is
// refused then. Neither message is acked before N's write commits; the
// comment waits for it (the issue counts as pending for N+1) and is stored
// once it commits, never parked as if its issue were missing.
func TestNextBatchDecidedDuringWrite(t *testing.T) {
	forStores(t, func(t *testing.T, e *env) {
		alice, bob := testkit.NewKey(), testkit.NewKey()
		ref := testkit.RepoRef(alice.PubKey, "repo")
		issue := bob.Issue(ref, "crash")
		o := startOverlap(t, e, alice, issue, 0)
		comment := bob.Comment(issue, issue, "me too")
		stranger := elsewhere(bob, "elsewhere")
		o.send(t, issue)
		o.waitHeld(t)
		o.send(t, comment, stranger)
		o.waitDecidedWhileHeld(t, 1)
		if n := o.unacked(t); n != 2 {
			t.Errorf("%d messages unacked while the first batch's write is held, want 2: nothing is acked before that write commits", n)
		}
		if s := o.r.ing.Stats(); s.Parked != 0 || s.Stored != 0 {
			t.Errorf("while the write is held: parked %d, stored %d; want the comment waiting, nothing stored", s.Parked, s.Stored)
		}
		close(o.held.release)
		o.want[issue.ID], o.want[comment.ID] = true, true
		e.waitDrained(t, o.want, time.Minute)
		e.assertExactly(t, o.want)
		if s := o.r.ing.Stats(); s.Stored != 2 || s.Parked != 0 {
			t.Errorf("stored %d, parked %d; want the issue and the comment stored, nothing parked", s.Stored, s.Parked)
		}
	})
}

// TestFailedWriteDuringNextBatch: batch N's write of two issues fails while
// batch N+1 (a comment on one of them, and a refusal) is being decided, and
// fails again when each is retried alone: N's message is not acked but
// redelivered, and N+1's comment, which depended on N, is not stored on
// N's account: it waits for the issue's actual store (parked meanwhile,
// then woken) — every event ends stored, once, nothing dead-lettered.
func TestFailedWriteDuringNextBatch(t *testing.T) {
	forStores(t, func(t *testing.T, e *env) {
		alice, bob := testkit.NewKey(), testkit.NewKey()
		ref := testkit.RepoRef(alice.PubKey, "repo")
		first, second := bob.Issue(ref, "crash"), bob.Issue(ref, "hang")
		// The batch and the first alone fail; the redelivery commits.
		o := startOverlap(t, e, alice, first, 2)
		comment := bob.Comment(first, first, "me too")
		o.send(t, first, second)
		o.waitHeld(t)
		o.send(t, comment, elsewhere(bob, "elsewhere"))
		o.waitDecidedWhileHeld(t, 1)
		close(o.held.release)
		o.want[first.ID], o.want[second.ID], o.want[comment.ID] = true, true, true
		e.waitDrained(t, o.want, time.Minute)
		e.assertExactly(t, o.want)
		s := o.r.ing.Stats()
		if s.DeadLettered != 0 {
			t.Errorf("%d dead-lettered", s.DeadLettered)
		}
		if s.Consumed < 6 {
			t.Errorf("consumed %d events, want 6: the failed batch's message redelivered whole", s.Consumed)
		}
		if s.Stored+s.Unparked < 3 {
			t.Errorf("stored %d, unparked %d: want each of the three stored", s.Stored, s.Unparked)
		}
	})
}

// TestDeletionAcrossOverlappedBatches: a deletion in the batch after its
// target's held write takes effect on the stored target (the deletion's
// batch waits for that write); a deletion whose write is held, and its
// target in the next batch, has the target refused as deleted (a write with
// a deletion is not overlapped).
func TestDeletionAcrossOverlappedBatches(t *testing.T) {
	t.Run("target then deletion", func(t *testing.T) { forStores(t, targetThenDeletion) })
	t.Run("deletion then target", func(t *testing.T) { forStores(t, deletionThenTarget) })
}

func targetThenDeletion(t *testing.T, e *env) {
	{
		alice, bob := testkit.NewKey(), testkit.NewKey()
		ref := testkit.RepoRef(alice.PubKey, "repo")
		target := bob.Issue(ref, "to be deleted")
		o := startOverlap(t, e, alice, target, 0)
		deletion := bob.Deletion([]*nostr.Event{target})
		o.send(t, target)
		o.waitHeld(t)
		o.send(t, deletion)
		waitUnacked(t, o, 2)
		close(o.held.release)
		o.want[deletion.ID] = true
		e.waitDrained(t, o.want, time.Minute)
		e.assertExactly(t, o.want)
	}
}

func deletionThenTarget(t *testing.T, e *env) {
	{
		alice, bob := testkit.NewKey(), testkit.NewKey()
		ref := testkit.RepoRef(alice.PubKey, "repo")
		target := bob.Issue(ref, "deleted before it came")
		deletion := bob.Deletion([]*nostr.Event{target})
		o := startOverlap(t, e, alice, deletion, 0)
		o.send(t, deletion)
		o.waitHeld(t)
		o.send(t, target)
		waitUnacked(t, o, 2)
		close(o.held.release)
		o.want[deletion.ID] = true
		e.waitDrained(t, o.want, time.Minute)
		e.assertExactly(t, o.want)
		if s := o.r.ing.Stats(); s.Refused["deleted"] != 1 {
			t.Errorf("refused %v, want the target refused as deleted", s.Refused)
		}
	}
}

// TestAnnouncementThenIssueAcrossBatches: an announcement whose write is
// held and an issue on its repository in the next batch: the issue is
// stored, not parked (a write that replaces stored events is not
// overlapped, so the issue is decided after it).
func TestAnnouncementThenIssueAcrossBatches(t *testing.T) {
	forStores(t, func(t *testing.T, e *env) {
		alice, carol := testkit.NewKey(), testkit.NewKey()
		fresh := served(carol, "fresh")
		o := startOverlap(t, e, alice, fresh, 0)
		issue := carol.Issue(testkit.RepoRef(carol.PubKey, "fresh"), "first")
		o.send(t, fresh)
		o.waitHeld(t)
		o.send(t, issue)
		waitUnacked(t, o, 2)
		close(o.held.release)
		o.want[fresh.ID], o.want[issue.ID] = true, true
		e.waitDrained(t, o.want, time.Minute)
		e.assertExactly(t, o.want)
		if s := o.r.ing.Stats(); s.Parked != 0 || s.Stored != 2 {
			t.Errorf("stored %d, parked %d; want both stored, nothing parked", s.Stored, s.Parked)
		}
	})
}

// waitUnacked waits until the replica holds n messages delivered, so the
// next batch is with the ingester before the held write is let go.
func waitUnacked(t *testing.T, o *overlapEnv, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for o.unacked(t) < n {
		if time.Now().After(deadline) {
			close(o.held.release)
			t.Fatalf("%d messages delivered, want %d", o.unacked(t), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
