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
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/services/ingester"
)

// TestAnnouncementCacheFollowsNewAnnouncements: the decide stage caches
// announcement lookups across batches (docs/decisions/0052-ingester-announcement-cache.md); a new announcement changes
// the maintainer set for the very next event, whether this ingester stored
// it (a maintainer removed: their next state is not accepted) or another
// writer did and said so on grasp.stored.30617 (a maintainer added: their
// next state is accepted at once, not parked and woken). The clock is fake
// and never advances, so no entry expires: only invalidation can make the
// change take effect.
func TestAnnouncementCacheFollowsNewAnnouncements(t *testing.T) {
	ctx := context.Background()
	p := startPipelineWith(t, func(i *ingester.Ingester) *ingester.Ingester { return i.WithClock(clock.NewFake(time.Now())) })
	b, st, ing := p.bus, p.store, p.ing

	owner, m1, m2 := testkit.NewKey(), testkit.NewKey(), testkit.NewKey()
	base := nostr.Now() - 1000
	at := func(n int) testkit.Option { return testkit.At(base + nostr.Timestamp(n)) }
	servedAt := func(n int, maintainers ...string) *nostr.Event {
		a := served(owner, "r", maintainers...)
		a.CreatedAt = base + nostr.Timestamp(n)
		return owner.Sign(a)
	}
	refs := map[string]string{"refs/heads/main": "1111111111111111111111111111111111111111"}
	// settled waits until evt is stored or parked and reports whether it
	// was stored without being parked.
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
			// Acked: the decision is counted (a parked event is stored
			// by its re-evaluation before it is counted as parked).
			return err == nil && info.NumPending == 0 && info.NumAckPending == 0 &&
				(p.has(t, evt.ID) || ing.Stats().Parked > parked)
		})
		return ing.Stats().Parked == parked && p.has(t, evt.ID)
	}

	// Owner's announcement names m1; m1's state is accepted, which caches
	// the announcements of "r".
	if !settled(servedAt(0, m1.PubKey)) {
		t.Fatal("the announcement was not stored")
	}
	if !settled(m1.State("r", refs, at(1))) {
		t.Fatal("a maintainer's state was not accepted")
	}
	// The owner drops m1, through this ingester: m1's next state must not
	// be accepted.
	if !settled(servedAt(2)) {
		t.Fatal("the new announcement was not stored")
	}
	if s := m1.State("r", refs, at(3)); settled(s) {
		t.Fatal("a state by a maintainer the newest announcement dropped was accepted (stale announcement cache)")
	}
	// The notices of both announcements came back: what comes next is the
	// other writer's.
	waitUntil(t, "own notices taken", func() bool { return ing.AnnouncementNotices() >= 2 })
	before := ing.AnnouncementNotices()
	// Another refused state of m1 reads the announcements of "r" again,
	// now that no invalidation can race it: they are cached.
	if s := m1.State("r", refs, at(6)); settled(s) {
		t.Fatal("a state by a dropped maintainer was accepted")
	}

	// Another writer (a relay) stores an announcement naming m2 and says so.
	ann3 := servedAt(4, m2.PubKey)
	if ok, err := st.Save(ctx, ann3); err != nil || !ok {
		t.Fatalf("save ann3: %v %v", ok, err)
	}
	data, err := json.Marshal(ann3)
	if err != nil {
		t.Fatal(err)
	}
	msg := nats.NewMsg(b.Names.StoredSubject(ann3.Kind))
	msg.Data = data
	msg.Header.Set(bus.HeaderOrigin, "relay-test")
	if err := b.Conn.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the other writer's notice taken", func() bool { return ing.AnnouncementNotices() > before })
	if s := m2.State("r", refs, at(7)); !settled(s) {
		t.Fatal("a state by a maintainer another writer's announcement added was not accepted at once (stale announcement cache)")
	}
}
