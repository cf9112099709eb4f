package ingester

import (
	"context"
	"encoding/json"
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
func TestBatchAckedInDeliveryOrder(t *testing.T) {
	n := testkit.StartNATS(t)
	b, err := bus.ConnectInProcess(n.Server, "ack-order-test", bus.DefaultNames())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	const service = "wss://git.example.com"
	i := New(Config{}, b, st, service, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)

	alice := testkit.NewKey()
	ann := alice.Announcement("repo", []string{testkit.GraspCloneURL(service, alice.PubKey, "repo")}, []string{service}, nil)
	issue := alice.Issue(testkit.RepoRef(alice.PubKey, "repo"), "crash")
	var acks []string
	msg := func(name string, evt *nostr.Event) *recordingMsg {
		data := []byte("not an event")
		if evt != nil {
			if data, err = json.Marshal(evt); err != nil {
				t.Fatal(err)
			}
		}
		return &recordingMsg{name: name, data: data, acks: &acks}
	}
	ctx := context.Background()
	items := i.verify(ctx, []jetstream.Msg{msg("announcement", ann), msg("issue", issue), msg("malformed", nil)})
	if failed := i.decide(ctx, items); len(failed) > 0 {
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
