package ingester

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
)

// recordingMsg is a delivered message that records when it is acked.
type recordingMsg struct {
	jetstream.Msg // nil: calling anything not overridden panics
	name          string
	data          []byte
	acks          *[]string
}

func (m *recordingMsg) Data() []byte         { return m.data }
func (m *recordingMsg) Headers() nats.Header { return nats.Header{} }
func (m *recordingMsg) Subject() string      { return "grasp.events.0" }
func (m *recordingMsg) InProgress() error    { return nil }
func (m *recordingMsg) Ack() error           { *m.acks = append(*m.acks, m.name); return nil }
func (m *recordingMsg) Nak() error           { *m.acks = append(*m.acks, "nak "+m.name); return nil }
func (m *recordingMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{NumDelivered: 1, Timestamp: time.Now()}, nil
}

// TestBatchAckedInDeliveryOrder: a batch's messages are acked in the order
// they were delivered, although they are settled out of it (a malformed
// message at once, an announcement when its pass is written, an issue on it
// one pass later), so the work-queue stream removes them in sequence order
// (see ackSettled); and each accepted event is acked only once stored.
// testIngester is an ingester on an embedded NATS server and a fresh store,
// for driving verify and decide directly (Run is not started: nothing may
// park).
func testIngester(t *testing.T) (*Ingester, *store.Store) {
	t.Helper()
	n := natstest.Start(t)
	b, err := bus.ConnectInProcess(n.Server, t.Name(), bus.DefaultNames())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return New(Config{}, b, st, testService, slog.New(slog.NewTextHandler(io.Discard, nil)), nil), st
}

const testService = "wss://git.example.com"

// messages makes recording messages of events (nil: not event JSON).
func messages(t *testing.T, acks *[]string, named map[string]*nostr.Event, order ...string) []jetstream.Msg {
	t.Helper()
	var out []jetstream.Msg
	for _, name := range order {
		data := []byte("not an event")
		if evt := named[name]; evt != nil {
			var err error
			if data, err = json.Marshal(evt); err != nil {
				t.Fatal(err)
			}
		}
		out = append(out, &recordingMsg{name: name, data: data, acks: acks})
	}
	return out
}

// TestBatchAckedInDeliveryOrder: a batch's messages are acked in the order
// they were delivered, although they are settled out of it (a malformed
// message at once, an announcement when its pass is written, an issue on it
// one pass later), so the work-queue stream removes them in sequence order
// (see ackSettled); and each accepted event is acked only once stored.
func TestBatchAckedInDeliveryOrder(t *testing.T) {
	i, st := testIngester(t)
	alice := testkit.NewKey()
	ann := alice.Announcement("repo", []string{testkit.GraspCloneURL(testService, alice.PubKey, "repo")}, []string{testService}, nil)
	issue := alice.Issue(testkit.RepoRef(alice.PubKey, "repo"), "crash")
	var acks []string
	ctx := context.Background()
	msgs := messages(t, &acks, map[string]*nostr.Event{"announcement": ann, "issue": issue}, "announcement", "issue", "malformed")
	if failed := i.decide(ctx, i.verify(ctx, msgs)); len(failed) > 0 {
		t.Fatalf("%d items failed: %v", len(failed), failed[0].err)
	}
	if want := []string{"announcement", "issue", "malformed"}; !slices.Equal(acks, want) {
		t.Errorf("acked %q, want %q (delivery order)", acks, want)
	}
	for _, e := range []*nostr.Event{ann, issue} {
		if got, err := st.Query(ctx, nostr.Filter{IDs: []string{e.ID}, Limit: 1}); err != nil || len(got) != 1 {
			t.Errorf("kind %d acked but not stored (err %v)", e.Kind, err)
		}
	}
	if s := i.Stats(); s.Stored != 2 {
		t.Errorf("stored counter %d, want 2", s.Stored)
	}
}

// TestPrefetchFindsStoredDeletions: the batch prefetch answers "is this
// event deleted by its author?" for the whole batch, from every stored
// deletion while there are few, from the "e" tag index otherwise (see
// batch.deletions); either way an event whose deletion is stored is refused
// and the others of the batch are stored.
func TestPrefetchFindsStoredDeletions(t *testing.T) {
	for _, others := range []int{0, fewDeletions - 2, fewDeletions + 5} {
		t.Run(fmt.Sprintf("%d other deletions", others), func(t *testing.T) {
			i, st := testIngester(t)
			ctx := context.Background()
			alice, bob := testkit.NewKey(), testkit.NewKey()
			ann := alice.Announcement("repo", []string{testkit.GraspCloneURL(testService, alice.PubKey, "repo")}, []string{testService}, nil)
			ref := testkit.RepoRef(alice.PubKey, "repo")
			deleted, kept := bob.Issue(ref, "deleted"), bob.Issue(ref, "kept")
			save := []*nostr.Event{ann, bob.Deletion([]*nostr.Event{deleted})}
			for n := range others {
				save = append(save, bob.Deletion([]*nostr.Event{bob.Note(fmt.Sprint("gone ", n))}))
			}
			for _, e := range save {
				if _, err := st.Save(ctx, e); err != nil {
					t.Fatal(err)
				}
			}
			var acks []string
			msgs := messages(t, &acks, map[string]*nostr.Event{"deleted": deleted, "kept": kept}, "deleted", "kept")
			if failed := i.decide(ctx, i.verify(ctx, msgs)); len(failed) > 0 {
				t.Fatalf("%d items failed: %v", len(failed), failed[0].err)
			}
			if s := i.Stats(); s.Stored != 1 || s.Refused["deleted"] != 1 {
				t.Errorf("stored %d, refused %v; want the kept issue stored, the deleted one refused", s.Stored, s.Refused)
			}
			if got, err := st.Query(ctx, nostr.Filter{IDs: []string{deleted.ID, kept.ID}, Limit: 2}); err != nil || len(got) != 1 || got[0].ID != kept.ID {
				t.Errorf("store holds %d of the two (err %v), want the kept one", len(got), err)
			}
			if !slices.Equal(acks, []string{"deleted", "kept"}) {
				t.Errorf("acked %q", acks)
			}
			if many := others+1 >= fewDeletions; i.manyDeletions.Load() != many {
				t.Errorf("manyDeletions %v after %d stored deletions, want %v", !many, others+1, many)
			}
			// Again, with what the first batch found remembered.
			again := bob.Issue(ref, "deleted too")
			if _, err := st.Save(ctx, bob.Deletion([]*nostr.Event{again})); err != nil {
				t.Fatal(err)
			}
			msgs = messages(t, &acks, map[string]*nostr.Event{"again": again, "kept": kept}, "again", "kept")
			if failed := i.decide(ctx, i.verify(ctx, msgs)); len(failed) > 0 {
				t.Fatalf("%d items failed: %v", len(failed), failed[0].err)
			}
			if s := i.Stats(); s.Stored != 1 || s.Refused["deleted"] != 2 || s.Duplicates != 1 {
				t.Errorf("second batch: stored %d, duplicates %d, refused %v; want the deleted one refused, the kept one a duplicate", s.Stored, s.Duplicates, s.Refused)
			}
		})
	}
}
