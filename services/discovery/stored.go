package discovery

import (
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nbd-wtf/go-nostr"
)

// DefaultStoredQueue bounds the stored-event announcements waiting for the
// index goroutine. Only discovery's kinds are received (announcements,
// roots, grasp lists, deletions), not the bulk of synced events.
const DefaultStoredQueue = 4096

// storedFeed receives the announcements writers publish on
// grasp.stored.<kind> after storing an event (the ingester for synced
// events, the relay for client events), for discovery's Kinds.
//
// Why: the self-subscription alone cannot see what the ingester stores while
// the websocket to the own relay is down — the catch-up after a reconnect
// reads with a since, and synced history carries old created_at values. The
// writers' announcements do not depend on the relay being reachable, so
// roots stored during such a gap still reach the index while NATS is up.
// These events were accepted by the policy and stored by a writer of this
// service; they go through the same RepoSyncIndex.Apply as the
// self-subscription's, which is idempotent and order-independent, so an
// event received both ways (the relay also broadcasts these announcements
// to its live subscribers) counts once.
//
// The feed is core NATS: it loses what is published while this process is
// disconnected from NATS, and drops what does not fit in the queue. The live
// self-subscription does not make up for that on its own: the relay
// broadcasts the ingester's events from the same announcements (and loses
// them when its own connection does), and it disconnects a client that
// stops reading, with what it had not yet sent. So a NATS reconnect ends a
// live session (at most one per Config.FeedGapMinLive), and any loss since a
// lost session's start makes the next one read the whole history instead
// of a catch-up (term.gap; docs/decisions/0068-discovery-feed-gap-rereads.md).
type storedFeed struct {
	events chan *nostr.Event
	subs   []*nats.Subscription
	// dropped counts announcements not queued (queue full).
	dropped atomic.Uint64
}

// gapMark is what the stored feed may have lost, as of one moment: the
// announcements dropped and the NATS reconnections so far.
type gapMark struct {
	dropped, reconnects uint64
}

// subscribeStored starts the stored feed for Kinds; close it with stop.
func (d *Discovery) subscribeStored(log *slog.Logger) (*storedFeed, error) {
	f := &storedFeed{events: make(chan *nostr.Event, d.storedQueue)}
	// One subscription on the family's wildcard, filtered here by subject:
	// the NATS permissions (deploy/validate derives them from the code)
	// grant subscribers the wildcard, and a subject check is cheaper than
	// decoding what discovery does not index.
	wanted := make(map[string]bool, len(Kinds))
	for _, k := range Kinds {
		wanted[d.bus.Names.StoredSubject(k)] = true
	}
	handler := func(msg *nats.Msg) {
		if !wanted[msg.Subject] {
			return
		}
		var evt nostr.Event
		// go-nostr's generated decoder, without encoding/json's
		// validation pass over the whole message.
		if err := evt.UnmarshalJSON(msg.Data); err != nil {
			log.Warn("undecodable stored event", "subject", msg.Subject, "err", err)
			return
		}
		select {
		case f.events <- &evt:
		default:
			f.dropped.Add(1)
			d.metrics.storedDropped.Inc()
		}
	}
	subject := d.bus.Names.StoredSubjects()
	sub, err := d.bus.Conn.Subscribe(subject, handler)
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", subject, err)
	}
	f.subs = append(f.subs, sub)
	// Flush so the subscriptions are registered at the server before the
	// history read starts: nothing stored afterwards can fall between the
	// two.
	if err := d.bus.Conn.Flush(); err != nil {
		f.stop()
		return nil, fmt.Errorf("subscribe stored events: %w", err)
	}
	return f, nil
}

// stop unsubscribes. A callback already running may still queue an event;
// nothing reads it any more and the channel is garbage.
func (f *storedFeed) stop() {
	for _, s := range f.subs {
		_ = s.Unsubscribe()
	}
}

// mark returns what the feed may have lost so far.
func (d *Discovery) mark(f *storedFeed) gapMark {
	return gapMark{dropped: f.dropped.Load(), reconnects: d.bus.Conn.Stats().Reconnects}
}

// reconnected reports whether NATS reconnected, or is down, since m was
// taken.
func (d *Discovery) reconnected(m gapMark) bool {
	return d.bus.Conn.Stats().Reconnects != m.reconnects || !d.bus.Conn.IsConnected()
}

// complete reports whether the feed carried every stored event of discovery's
// kinds since m was taken: nothing dropped, NATS neither reconnected nor
// down.
func (d *Discovery) complete(f *storedFeed, m gapMark) bool {
	return d.mark(f) == m && d.bus.Conn.IsConnected()
}

// applyStored folds in one announced stored event; like a live event, it
// arms the batch window when an entry may have changed.
func (d *Discovery) applyStored(t *term, evt *nostr.Event) {
	d.metrics.storedSeen.Inc()
	if d.fold(t, evt) {
		d.changed(t)
	}
}
