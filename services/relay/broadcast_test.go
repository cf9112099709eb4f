package relay

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
)

// TestStoredBroadcast: events other writers store reach live subscribers;
// events clients store are announced on grasp.stored.<kind>.
func TestStoredBroadcast(t *testing.T) {
	n := natstest.Start(t)
	ctx := context.Background()
	b, err := bus.Connect(ctx, n.URL, "relay-test", bus.DefaultNames(), bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	announced := make(chan *nats.Msg, 10)
	sub, err := b.Conn.ChanSubscribe(b.Names.StoredSubjects(), announced)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := b.Conn.Flush(); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, serverOpts{bus: b})

	c := dial(t, s.url)
	c.write(nostr.ReqEnvelope{SubscriptionID: "live", Filters: nostr.Filters{{Kinds: []int{1621}, Limit: 0, LimitZero: true}}})
	c.next(func(env nostr.Envelope, _ string) bool { _, ok := env.(*nostr.EOSEEnvelope); return ok })
	// The relay subscribed to grasp.stored.* on this same NATS connection
	// before it began serving, so the publication below is ordered after it.

	alice := testkit.NewKey()
	other := alice.Issue(testkit.RepoRef(alice.PubKey, "repo"), "from the ingester")
	data, _ := json.Marshal(other)
	msg := nats.NewMsg(b.Names.StoredSubject(other.Kind))
	msg.Data = data
	msg.Header.Set(bus.HeaderOrigin, "ingester")
	if err := b.Conn.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
	env, _ := c.next(func(env nostr.Envelope, _ string) bool { _, ok := env.(*nostr.EventEnvelope); return ok })
	if got := env.(*nostr.EventEnvelope).Event.ID; got != other.ID {
		t.Fatalf("live subscriber got %s, want %s", got, other.ID)
	}

	ann := served(alice, "repo")
	if ok, m := dial(t, s.url).publish(ann); !ok {
		t.Fatal(m)
	}
	deadline := time.After(5 * time.Second)
	for {
		select {
		case m := <-announced:
			if m.Header.Get(bus.HeaderOrigin) == "ingester" {
				continue // the test's own publication, which may arrive late
			}
			if m.Subject != b.Names.StoredSubject(30617) || !strings.Contains(string(m.Data), ann.ID) {
				t.Fatalf("announced %s %s", m.Subject, m.Data)
			}
			return
		case <-deadline:
			t.Fatal("client event not announced on grasp.stored.30617")
		}
	}
}
