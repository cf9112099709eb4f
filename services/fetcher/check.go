package fetcher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
)

// Reasons an event is dropped before publishing.
const (
	DropShape    = "shape"
	DropBadID    = "bad_id"
	DropNoMatch  = "no_match"
	DropTooLarge = "too_large"
)

// CheckEvent runs the cheap structural checks an event must pass before it
// is published for the ingesters: hex fields of the right length, a sane
// kind, id = hash of the content, and a match with what was asked for. The
// signature is the ingester's job (expensive, and it must check anyway).
// It returns "" for a good event, else the drop reason.
func CheckEvent(evt *nostr.Event, fs nostr.Filters) string {
	var m eventMatcher
	if len(fs) > 0 {
		m = reqFilters(fs)
	}
	return checkEvent(evt, m)
}

// eventMatcher is what an event was asked for with: a batch's filters
// (reqFilters) or a live group's compact ones (liveFilters).
type eventMatcher interface {
	matches(*nostr.Event) bool
}

// reqFilters are filters as sent.
type reqFilters nostr.Filters

func (fs reqFilters) matches(evt *nostr.Event) bool {
	return matchesIgnoringLimit(nostr.Filters(fs), evt)
}

// checkEvent is CheckEvent with any matcher (nil: no match check).
func checkEvent(evt *nostr.Event, m eventMatcher) string {
	if !nip34.IsEventID(evt.ID) || !nip34.IsPubKey(evt.PubKey) || !nip34.IsSignature(evt.Sig) || evt.Kind < 0 || evt.Kind > 65535 {
		return DropShape
	}
	for _, tag := range evt.Tags {
		if len(tag) == 0 {
			return DropShape
		}
	}
	if !evt.CheckID() {
		return DropBadID
	}
	if m != nil && !m.matches(evt) {
		return DropNoMatch
	}
	return ""
}

func matchesIgnoringLimit(fs nostr.Filters, evt *nostr.Event) bool {
	for _, f := range fs {
		if f.Matches(evt) {
			return true
		}
	}
	return false
}

// windowPublisher publishes events asynchronously with at most Window
// acknowledgements outstanding: when the window is full it waits for the
// oldest, so a slow stream pushes back on the relay read instead of filling
// memory. A publish that fails is retried synchronously; Flush reports a
// loss, so a batch is never confirmed with an event missing. Acknowledged
// ids are remembered in recent (nil: not remembered), so that other copies
// of the same event are not published again (recentIDs).
type windowPublisher struct {
	js      jetstream.JetStream
	window  int
	recent  *recentIDs
	byID    *recentIDs // the same publishes by event id alone
	now     func() time.Time
	pending []pendingPub
}

// pendingPub is one publish awaiting its acknowledgement; key is its
// Nats-Msg-Id's recentKey, remembered once acknowledged when remember is set.
type pendingPub struct {
	fut      jetstream.PubAckFuture
	key, id  recentKey
	remember bool
}

// newWindowPublisher is the fetcher's publisher for one batch or live
// subscription.
func (f *Fetcher) newWindowPublisher() *windowPublisher {
	return &windowPublisher{js: f.bus.JS, window: f.cfg.PublishWindow, recent: f.recent, byID: f.recentByID, now: f.clock.Now}
}

// published reports whether the stream acknowledged key moments ago.
func (p *windowPublisher) published(key recentKey) bool {
	if p.recent == nil {
		return false
	}
	return p.recent.has(key, p.now())
}

// reap pops the acknowledgements that have already arrived, oldest first,
// without waiting, so their ids are remembered while the other copies are
// still on their way.
func (p *windowPublisher) reap() {
	for len(p.pending) > 0 {
		select {
		case <-p.pending[0].fut.Ok():
		default:
			return
		}
		p.acked(p.pending[0])
		p.pending = p.pending[1:]
	}
}

func (p *windowPublisher) acked(pp pendingPub) {
	if pp.remember && p.recent != nil {
		now := p.now()
		p.recent.add(pp.key, now)
		p.byID.add(pp.id, now)
	}
}

func (p *windowPublisher) publish(ctx context.Context, msg *nats.Msg) error {
	return p.publishKey(ctx, msg, recentKey{}, recentKey{}, false)
}

// publishKey publishes msg; key is its Nats-Msg-Id's recentKey and id its
// event id's, remembered once the stream acknowledges it when remember is set.
func (p *windowPublisher) publishKey(ctx context.Context, msg *nats.Msg, key, id recentKey, remember bool) error {
	if p.recent != nil {
		p.reap()
	}
	for len(p.pending) >= p.window {
		if err := p.settle(ctx, p.pending[0]); err != nil {
			return err
		}
		p.pending = p.pending[1:]
	}
	for {
		fut, err := p.js.PublishMsgAsync(msg)
		if err == nil {
			p.pending = append(p.pending, pendingPub{fut: fut, key: key, id: id, remember: remember})
			return nil
		}
		if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			return fmt.Errorf("publish event: %w", err)
		}
		// The connection-wide window is full (other relays): wait.
		select {
		case <-p.js.PublishAsyncComplete():
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// settle waits for one acknowledgement and retries its message on failure.
func (p *windowPublisher) settle(ctx context.Context, pp pendingPub) error {
	fut := pp.fut
	select {
	case <-fut.Ok():
		p.acked(pp)
		return nil
	case err := <-fut.Err():
		var last error = err
		for attempt := range 3 {
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := p.js.PublishMsg(pctx, fut.Msg())
			cancel()
			if err == nil {
				p.acked(pp)
				return nil
			}
			last = err
			select {
			case <-time.After(time.Duration(attempt+1) * 200 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return fmt.Errorf("publish event %s: %w", fut.Msg().Header.Get(nats.MsgIdHdr), last)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// flush waits for every outstanding acknowledgement.
func (p *windowPublisher) flush(ctx context.Context) error {
	for len(p.pending) > 0 {
		if err := p.settle(ctx, p.pending[0]); err != nil {
			return err
		}
		p.pending = p.pending[1:]
	}
	return nil
}
