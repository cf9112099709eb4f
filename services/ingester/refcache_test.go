package ingester_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/services/ingester"
)

// TestDeletedParentIsNotRemembered: the decide stage remembers the events
// this ingester stored, to answer the policy's lookups of referenced events
// without reading the store (docs/decisions/0054-ingester-memory-of-stored-events.md); an issue deleted after that, whether through this
// ingester or by another writer that says so on grasp.stored.5, no longer
// anchors the next comment on it: the comment is parked, not stored. The
// clock is fake and never advances, so nothing expires: only invalidation
// can make the deletion take effect.
func TestDeletedParentIsNotRemembered(t *testing.T) {
	ctx := context.Background()
	p := startPipelineWith(t, func(i *ingester.Ingester) *ingester.Ingester { return i.WithClock(clock.NewFake(time.Now())) })
	b, st, ing := p.bus, p.store, p.ing
	owner, author, other := testkit.NewKey(), testkit.NewKey(), testkit.NewKey()
	base := nostr.Now() - 1000
	at := func(n int) testkit.Option { return testkit.At(base + nostr.Timestamp(n)) }

	// settled waits until evt is stored or parked, and acked, and reports
	// whether it was stored without being parked.
	settled := func(evt *nostr.Event) bool {
		t.Helper()
		parked := ing.Stats().Parked
		p.fetch(t, evt)
		waitUntil(t, "event "+evt.ID[:8]+" stored or parked, and acked", func() bool {
			cons, err := b.JS.Consumer(ctx, b.Names.EventsStream(), "ingester")
			if err != nil {
				return false
			}
			info, err := cons.Info(ctx)
			return err == nil && info.NumPending == 0 && info.NumAckPending == 0 &&
				(p.has(t, evt.ID) || ing.Stats().Parked > parked)
		})
		return ing.Stats().Parked == parked && p.has(t, evt.ID)
	}

	if !settled(served(owner, "r")) {
		t.Fatal("the announcement was not stored")
	}
	// Its notice came back: the caches are in use from here on.
	waitUntil(t, "own notice taken", func() bool { return ing.AnnouncementNotices() >= 1 })
	repo := testkit.RepoRef(owner.PubKey, "r")
	byIngester, byRelay := author.Issue(repo, "one", at(1)), author.Issue(repo, "two", at(2))
	for _, issue := range []*nostr.Event{byIngester, byRelay} {
		if !settled(issue) {
			t.Fatal("an issue was not stored")
		}
		if !settled(other.Comment(issue, issue, "first", at(3))) {
			t.Fatal("a comment on a stored issue was not stored")
		}
	}

	// The author deletes the first issue through this ingester.
	if !settled(author.Deletion([]*nostr.Event{byIngester}, at(4))) || p.has(t, byIngester.ID) {
		t.Fatal("the deletion was not stored and applied")
	}
	if settled(other.Comment(byIngester, byIngester, "second", at(5))) {
		t.Fatal("a comment on an issue deleted through this ingester was stored (stale memory of stored events)")
	}

	// Another writer (a relay) stores the deletion of the second issue,
	// applies it and says so.
	waitUntil(t, "own notices taken", func() bool { return ing.AnnouncementNotices() >= 2 })
	before := ing.AnnouncementNotices()
	del := author.Deletion([]*nostr.Event{byRelay}, at(6))
	if _, err := store.SaveAccepted(ctx, st, del, nil); err != nil {
		t.Fatal(err)
	}
	if p.has(t, byRelay.ID) {
		t.Fatal("the other writer's deletion was not applied")
	}
	data, err := json.Marshal(del)
	if err != nil {
		t.Fatal(err)
	}
	msg := nats.NewMsg(b.Names.StoredSubject(del.Kind))
	msg.Data = data
	msg.Header.Set(bus.HeaderOrigin, "relay-test")
	if err := b.Conn.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the other writer's notice taken", func() bool { return ing.AnnouncementNotices() > before })
	if settled(other.Comment(byRelay, byRelay, "second", at(7))) {
		t.Fatal("a comment on an issue another writer deleted was stored (stale memory of stored events)")
	}
}
