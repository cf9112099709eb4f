package fetcher

import (
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// copyClaims is which events a publisher of this fetcher has gathered or is
// awaiting the events stream's acknowledgement of, by Nats-Msg-Id key,
// shared by every relay worker. An initial sync asks every relay listing a
// repository for the same filters at once, so the copies of one event
// arrive from several relays within moments of each other: recentIDs skips
// those read after the first copy was acknowledged, but not those read while
// it is on its way, and a batch message's own Nats-Msg-Id does not let the
// stream drop them. Every such copy was published, stored in the stream,
// delivered and decoded by an ingester to be found held (a third of what
// the ingesters consumed in the target world).
//
// A historic batch whose copy is claimed by another publisher holds it back
// (windowPublisher.waiting) instead of publishing it, and publishes it after
// all if the claim fails (the claimant's batch failed or its session ended
// before the acknowledgement) or is not settled within claimWait; a batch is
// confirmed only once every copy it held back was acknowledged, its own or
// the claimant's. Live subscriptions neither claim nor hold back: they must
// not wait on a batch (docs/decisions/0085-copies-claimed-while-in-flight.md).
type copyClaims struct {
	mu    sync.Mutex
	byKey map[recentKey]*claim
	// byMsg are the claims riding on each published message, settled by its
	// acknowledgement handler whoever waits for it.
	byMsg map[*nats.Msg][]*claim
}

// claim is one publisher's claim on an event. done is closed once it is
// settled; ok (read after done) says whether the stream acknowledged it.
type claim struct {
	key   recentKey
	owner *windowPublisher
	at    time.Time // when it was taken
	done  chan struct{}
	ok    bool
}

// claimStale is when a claim is taken over by the next publisher to ask:
// one never settled (a publisher that ended without close) must not hold
// every later copy of its event back for good.
const claimStale = 3 * claimWait

func newCopyClaims() *copyClaims {
	return &copyClaims{byKey: map[recentKey]*claim{}, byMsg: map[*nats.Msg][]*claim{}}
}

// take claims key for p at now, or returns the claim another publisher
// holds on it (mine false).
func (cc *copyClaims) take(key recentKey, p *windowPublisher, now time.Time) (c *claim, mine bool) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if c, ok := cc.byKey[key]; ok && (c.owner == p || now.Sub(c.at) < claimStale) {
		return c, c.owner == p
	}
	c = &claim{key: key, owner: p, at: now, done: make(chan struct{})}
	cc.byKey[key] = c
	return c, true
}

// ride records that msg carries the claims cs: its acknowledgement settles
// them (acked).
func (cc *copyClaims) ride(msg *nats.Msg, cs []*claim) {
	if len(cs) == 0 {
		return
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	cc.byMsg[msg] = cs
}

// acked settles the claims riding on msg as acknowledged: the
// acknowledgement handler calls it, whoever waits for the publish. The
// claims stay taken until their publisher has remembered the publish as
// acknowledged (recentIDs) and settles them itself, so that a copy read in
// between is still held back rather than published.
func (cc *copyClaims) acked(msg *nats.Msg) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	cs, ok := cc.byMsg[msg]
	if !ok {
		return
	}
	delete(cc.byMsg, msg)
	for _, c := range cs {
		cc.markLocked(c, true)
	}
}

// settle forgets msgs and gives up every claim of cs, settling those not
// settled yet: ok when their messages were acknowledged, failed when their
// publisher gives up on them (its batch failed, its session ended), so that
// whoever held a copy back publishes it.
func (cc *copyClaims) settle(msgs []*nats.Msg, cs []*claim, ok bool) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	for _, m := range msgs {
		delete(cc.byMsg, m)
	}
	for _, c := range cs {
		cc.markLocked(c, ok)
		if cc.byKey[c.key] == c {
			delete(cc.byKey, c.key)
		}
	}
}

// markLocked settles c once: later calls change nothing.
func (cc *copyClaims) markLocked(c *claim, ok bool) {
	select {
	case <-c.done:
		return
	default:
	}
	c.ok = ok
	close(c.done)
}

// len is how many claims are held (for tests).
func (cc *copyClaims) len() int {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return len(cc.byKey)
}
