package relayconn

import (
	"context"
	"strconv"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/relaylimits"
)

// How the connection answers a relay that refuses a subscription for one of
// its limits (docs/sync.md, "What relays allow").

// refusalBurst is how close together subscription refusals are taken as
// answering REQs sent together.
const refusalBurst = 2 * time.Second

// refused ends a subscription the relay refused (its CLOSED, or a NOTICE
// taken as refusing it): a refusal of the subscription count lowers the
// gate to what was open without it, so the caller's retry waits for a slot
// instead of being refused again; every limit is told to OnLimit.
func (c *Conn) refused(s *Subscription, r relaylimits.Refusal, reason string) {
	open := c.gate.inUse()
	if r == relaylimits.TooManySubscriptions {
		c.gate.lower(open - 1)
	}
	if r.IsLimit() && c.opts.OnLimit != nil {
		c.opts.OnLimit(r, reason, open, s.filters, s.size)
	}
	select {
	case s.closed <- reason:
	default:
	}
	if s.hd != nil {
		// Queued behind the events that came before it; the
		// subscription ends now, its queue is still delivered.
		c.enqueue(s, delivery{closed: &reason})
	}
	c.forget(s)
}

// NewID returns a subscription id unique on this connection.
func (c *Conn) NewID() string { return "g" + strconv.FormatUint(c.serial.Add(1), 36) }

func (c *Conn) forget(s *Subscription) {
	c.mu.Lock()
	delete(c.subs, s.ID)
	delete(c.unanswered, s)
	c.mu.Unlock()
	s.end()
}

// resendUnanswered answers a NOTICE refusing a subscription over the
// relay's count without naming it: every REQ still unanswered may be the
// one, so each gives its slot back and is sent again, under the same id,
// once the gate (lowered to what was open less one) has a slot for it. A
// REQ the relay had accepted is replaced by its resending (strfry and
// nostr-rs-relay replace a subscription whose id is reused), so the worst a
// wrong guess costs is a budget learned lower than the relay's and some
// events twice. The caller sees nothing but a later EOSE.
func (c *Conn) resendUnanswered(text string) {
	// Refusals that come together answer REQs sent together: each says one
	// more of them is not open, so the budget is what was open when the
	// first came less their number, not less one at each (the slots given
	// back meanwhile would be counted twice).
	now := time.Now()
	c.mu.Lock()
	if now.Sub(c.burstAt) > refusalBurst {
		c.burstOpen, c.burstN = c.gate.inUse(), 0
	}
	c.burstN++
	c.burstAt = now
	open := c.burstOpen - c.burstN + 1 // what was open, the refused one included
	pending := make(map[*Subscription][]byte, len(c.unanswered))
	for s, data := range c.unanswered {
		pending[s] = data
	}
	c.mu.Unlock()
	c.gate.lower(open - 1)
	if c.opts.OnLimit != nil {
		filters := 0
		for s := range pending {
			filters = max(filters, s.filters)
		}
		c.opts.OnLimit(relaylimits.TooManySubscriptions, text, open, filters, 0)
	}
	for s, data := range pending {
		if !s.slot.CompareAndSwap(true, false) {
			continue // being resent already, or ended
		}
		c.loops.Add(1)
		go func() {
			defer c.loops.Done()
			// CLOSE first: the relay may have accepted this one (another
			// was refused); its slot is ours again only once the relay
			// has freed it, or our count would fall below the relay's.
			wctx, wcancel := context.WithTimeout(c.ctx, c.opts.WriteTimeout)
			_ = c.Write(wctx, nostr.CloseEnvelope(s.ID))
			wcancel()
			c.gate.release(s.live)
			ctx, cancel := context.WithCancel(c.ctx)
			defer cancel()
			go func() {
				select {
				case <-s.done:
					cancel()
				case <-ctx.Done():
				}
			}()
			if err := c.gate.acquire(ctx, c.ctx, s.live, nil); err != nil {
				return
			}
			s.slot.Store(true)
			select {
			case <-s.done:
				// Ended while waiting: give the slot back.
				if s.slot.CompareAndSwap(true, false) {
					c.gate.release(s.live)
				}
				return
			default:
			}
			if err := c.WriteRaw(WithPurpose(ctx, "req_resent"), data); err != nil {
				return // the connection is ending
			}
		}()
	}
}
