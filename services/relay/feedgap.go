package relay

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
)

// The relay's live subscriptions learn of events other writers store (the
// ingester) from core-NATS announcements (onStored). An announcement missed
// — published while the relay's NATS connection was down, or dropped from
// its subscription's queue as a slow consumer — is an event no live
// subscriber gets, and nothing tells the subscriber so: to it the relay is
// only quiet. Synced history has old created_at, so a client that catches
// up with since after a reconnect would miss it too; it can only know to
// read again if its connection ends. So after such a gap the relay drops
// every client connection, with a NOTICE and a close frame that say why
// (docs/decisions/0070-relay-drops-clients-after-feed-gap.md). The own
// discovery is the client that matters: it re-reads its relay's whole
// history when its session is lost after its own feed dropped anything.

// feedGapCheck is how often the relay looks for a gap in its stored feed.
const feedGapCheck = time.Second

// feedGapReason is the NOTICE and close reason a dropped client gets.
const feedGapReason = "error: this relay's live feed may have missed stored events; subscribe again and read what you need from the store"

// FeedMark is what a gap in the stored feed is judged by: NATS reconnects
// of the relay's connection and messages its subscription dropped.
type FeedMark struct {
	Reconnects uint64
	Dropped    int
}

// GapSince reports whether the feed may have lost announcements between
// mark m and now.
func (now FeedMark) GapSince(m FeedMark) bool {
	return now.Reconnects != m.Reconnects || now.Dropped != m.Dropped
}

// watchStoredFeed drops every client after a gap in sub's feed, at most
// once per FeedGapMinInterval, until ctx ends.
func (r *Relay) watchStoredFeed(ctx context.Context, sub *nats.Subscription) {
	mark := func() FeedMark {
		// Dropped fails only for a subscription already closed.
		d, _ := sub.Dropped()
		return FeedMark{Reconnects: r.bus.Conn.Stats().Reconnects, Dropped: d}
	}
	last, dropped := mark(), time.Time{}
	t := time.NewTicker(feedGapCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := mark()
		// A gap within the interval waits for it: last is not moved, so it
		// is still seen when the interval has passed.
		if !now.GapSince(last) || time.Since(dropped) < r.cfg.FeedGapMinInterval {
			continue
		}
		// Counted first: a client that sees its connection close may
		// read the metric at once (TestFeedGapDropsClients did, and found 0).
		r.feedGapDrops.Inc()
		n := r.clients.dropAll(feedGapReason)
		r.log.Warn("stored-event feed may have missed events: dropped every client so that their live subscriptions start again",
			"reconnects", now.Reconnects-last.Reconnects, "dropped_announcements", now.Dropped-last.Dropped, "clients", n)
		last, dropped = now, time.Now()
	}
}
