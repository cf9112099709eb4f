package fetcher

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
)

// windowPublisher publishes events asynchronously with at most Window
// events awaiting acknowledgement: when the window is full it waits for the
// oldest message, so a slow stream pushes back on the relay read instead of
// filling memory. Events are gathered into batch messages of up to
// maxEvents events and bus.EventBatchMaxBytes (send publishes what is
// gathered; callers send at the end of a page or when no event is waiting),
// so the stream and the ingesters handle one message per batch
// (docs/decisions/0053-events-travel-in-batches.md); a batch of one is
// published in the one-event format, with its event's Nats-Msg-Id. A
// publish that fails is retried synchronously; Flush reports a loss, so a
// batch is never confirmed with an event missing. Acknowledged ids are
// remembered in recent (nil: not remembered), so that other copies of the
// same event are not published again (recentIDs).
type windowPublisher struct {
	js jetstream.JetStream
	// bytes is the fetcher's bound on the bytes awaiting acknowledgement
	// (Config.PublishMaxBytes), shared by every windowPublisher and given
	// back by js's acknowledgement handlers; nil: unbounded.
	bytes   *bus.ByteGate
	m       *metrics
	window  int
	recent  *recentIDs
	byID    *recentIDs // the same publishes by event id alone
	now     func() time.Time
	after   func(time.Duration) <-chan time.Time
	pending []pendingPub
	// inFlight is how many events the pending messages carry.
	inFlight int
	// maxEvents is Config.PublishBatch; buf holds the events gathered for
	// the next message, bufBytes their size with line breaks.
	maxEvents int
	buf       []gathered
	bufBytes  int
	// unsettled holds the keys gathered or awaiting acknowledgement: a
	// second copy of one of them from the same batch or subscription (a
	// batch's filters overlap: one event answers several) is not sent
	// again. One-event messages had the stream drop it by Nats-Msg-Id; a
	// batch message's id covers the whole batch (docs/decisions/0053-events-travel-in-batches.md). Bounded by the window and the batch.
	unsettled map[recentKey]struct{}
	// claims is the fetcher's copyClaims for a historic batch (nil: a live
	// subscription's, or none): the batch holds back a copy another batch
	// has claimed (waiting) instead of publishing it.
	claims  *copyClaims
	waiting []heldCopy
}

// heldCopy is an event held back while another publisher's copy of it is
// on its way to the stream: published after all if that claim fails.
type heldCopy struct {
	c     *claim
	msg   *nats.Msg
	keys  keyPair
	since time.Time
}

// claimWait is how long a held-back copy waits for the claim it waits on
// before it is published anyway: far longer than an acknowledgement takes,
// short of the publish retries' 30 s (publishRetryFor), so a claimant
// stuck behind a stalled stream costs a duplicate, not a batch.
const claimWait = 5 * time.Second

// gathered is one event waiting in a windowPublisher's batch: its
// one-event message and the keys to remember once acknowledged.
type gathered struct {
	msg   *nats.Msg
	keys  keyPair
	claim *claim // nil: not claimed (no copyClaims, or published anyway)
}

// keyPair is an event's Nats-Msg-Id recentKey and its id's.
type keyPair struct{ key, id recentKey }

// pendingPub is one publish awaiting its acknowledgement; keys are its
// events' keys, remembered once acknowledged.
type pendingPub struct {
	fut    jetstream.PubAckFuture
	msg    *nats.Msg
	keys   []keyPair
	claims []*claim
}

// newWindowPublisher is the fetcher's publisher for one batch or live
// subscription.
func (f *Fetcher) newWindowPublisher() *windowPublisher {
	return &windowPublisher{js: f.pubJS, bytes: f.pubBytes, m: f.m, window: f.cfg.PublishWindow, recent: f.recent, byID: f.recentByID, now: f.clock.Now, after: f.clock.After,
		maxEvents: f.cfg.PublishBatch}
}

// newBatchPublisher is newWindowPublisher for a historic batch: it claims
// what it gathers and holds back copies other batches have claimed
// (copyClaims). A live subscription's publisher does neither: its events
// are delivered on the connection's reader, which must not wait, and it
// sends them without a batch's end to bound how long its claims would be
// held.
func (f *Fetcher) newBatchPublisher() *windowPublisher {
	p := f.newWindowPublisher()
	p.claims = f.claims
	return p
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
		p.pop()
	}
}

func (p *windowPublisher) pop() {
	for _, k := range p.pending[0].keys {
		delete(p.unsettled, k.key)
	}
	p.inFlight -= max(1, len(p.pending[0].keys))
	p.pending = p.pending[1:]
}

func (p *windowPublisher) acked(pp pendingPub) {
	if p.recent != nil && len(pp.keys) > 0 {
		now := p.now()
		for _, k := range pp.keys {
			p.recent.add(k.key, now)
			p.byID.add(k.id, now)
		}
	}
	if p.claims != nil && len(pp.claims) > 0 {
		// Once remembered as acknowledged (above), the claims go; the
		// acknowledgement handler may not have settled them yet, or a
		// synchronous retry (settle) was what succeeded.
		p.claims.settle([]*nats.Msg{pp.msg}, pp.claims, true)
	}
}

// add gathers an event's one-event message (key is its Nats-Msg-Id's
// recentKey, id its event id's) into the next batch, publishing the batch
// when it is full; with batches off (maxEvents ≤ 1) it publishes msg at
// once.
func (p *windowPublisher) add(ctx context.Context, msg *nats.Msg, key, id recentKey) error {
	if p.maxEvents <= 1 {
		return p.publishKeys(ctx, msg, []keyPair{{key, id}}, nil)
	}
	if _, dup := p.unsettled[key]; dup {
		return nil
	}
	var c *claim
	if p.claims != nil {
		var mine bool
		if c, mine = p.claims.take(key, p, p.now()); !mine {
			return p.hold(ctx, heldCopy{c: c, msg: msg, keys: keyPair{key, id}, since: p.now()})
		}
	}
	return p.gather(ctx, msg, keyPair{key, id}, c)
}

// gather adds an event to the next batch message, publishing the batch when
// it is full.
func (p *windowPublisher) gather(ctx context.Context, msg *nats.Msg, keys keyPair, c *claim) error {
	if p.unsettled == nil {
		p.unsettled = map[recentKey]struct{}{}
	}
	p.unsettled[keys.key] = struct{}{}
	if len(p.buf) > 0 && (p.bufBytes+len(msg.Data)+1 > bus.EventBatchMaxBytes || !sameOrigin(p.buf[0].msg, msg)) {
		if err := p.send(ctx); err != nil {
			p.releaseClaims([]*claim{c}, nil)
			return err
		}
	}
	p.buf = append(p.buf, gathered{msg: msg, keys: keys, claim: c})
	p.bufBytes += len(msg.Data) + 1
	if len(p.buf) >= p.maxEvents || p.bufBytes >= bus.EventBatchMaxBytes {
		return p.send(ctx)
	}
	return nil
}

// sameOrigin reports whether two one-event messages may share a batch: the
// headers naming relay, session, batch and mode are the batch's.
func sameOrigin(a, b *nats.Msg) bool {
	if a.Subject != b.Subject {
		return false
	}
	for _, h := range []string{bus.HeaderRelay, bus.HeaderSession, bus.HeaderBatch, bus.HeaderMode} {
		if a.Header.Get(h) != b.Header.Get(h) {
			return false
		}
	}
	return true
}

// send publishes the gathered events: one alone as it is (its own
// Nats-Msg-Id, so the stream still drops a copy another relay's worker
// published moments ago), several as one batch message (bus.HeaderEvents,
// one event per line, Nats-Msg-Id bus.EventBatchMsgID).
func (p *windowPublisher) send(ctx context.Context) error {
	if len(p.buf) == 0 {
		return nil
	}
	defer func() {
		clear(p.buf)
		p.buf, p.bufBytes = p.buf[:0], 0
	}()
	var claims []*claim
	for _, g := range p.buf {
		if g.claim != nil {
			claims = append(claims, g.claim)
		}
	}
	if len(p.buf) == 1 {
		return p.publishKeys(ctx, p.buf[0].msg, []keyPair{p.buf[0].keys}, claims)
	}
	first := p.buf[0].msg
	msg := nats.NewMsg(first.Subject)
	for k, v := range first.Header {
		if k != nats.MsgIdHdr {
			msg.Header[k] = v
		}
	}
	data := make([]byte, 0, p.bufBytes)
	ids := make([]string, len(p.buf))
	keys := make([]keyPair, len(p.buf))
	for n, g := range p.buf {
		data = append(data, g.msg.Data...)
		data = append(data, '\n')
		ids[n] = g.msg.Header.Get(nats.MsgIdHdr)
		keys[n] = g.keys
	}
	msg.Data = data
	msg.Header.Set(bus.HeaderEvents, strconv.Itoa(len(p.buf)))
	msg.Header.Set(nats.MsgIdHdr, bus.EventBatchMsgID(ids))
	return p.publishKeys(ctx, msg, keys, claims)
}

// publishKeys publishes msg, which carries the events of keys (remembered
// once the stream acknowledges it; none for a message that is no event) and
// the claims this publisher holds on them (settled by the
// acknowledgement). On an error the claims are given up.
func (p *windowPublisher) publishKeys(ctx context.Context, msg *nats.Msg, keys []keyPair, claims []*claim) error {
	if err := p.publishClaimed(ctx, msg, keys, claims); err != nil {
		p.releaseClaims(claims, []*nats.Msg{msg})
		return err
	}
	return nil
}

func (p *windowPublisher) publishClaimed(ctx context.Context, msg *nats.Msg, keys []keyPair, claims []*claim) error {
	if p.recent != nil || p.claims != nil {
		p.reap()
	}
	n := max(1, len(keys))
	for len(p.pending) > 0 && p.inFlight+n > p.window {
		if err := p.settle(ctx, p.pending[0]); err != nil {
			return err
		}
		p.pop()
	}
	if p.bytes != nil {
		// Room among the bytes every publisher of this fetcher has
		// awaiting acknowledgement; the acknowledgement handlers make it,
		// whoever waits for them.
		if _, err := p.bytes.Acquire(ctx, int64(len(msg.Data))); err != nil {
			return err
		}
		if p.m != nil {
			p.m.publishBytes.Set(float64(p.bytes.Used()))
		}
	}
	if p.claims != nil {
		// Before the publish: its acknowledgement handler may run first.
		p.claims.ride(msg, claims)
	}
	for {
		fut, err := p.js.PublishMsgAsync(msg)
		if err == nil {
			p.pending = append(p.pending, pendingPub{fut: fut, msg: msg, keys: keys, claims: claims})
			p.inFlight += n
			return nil
		}
		if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			if p.bytes != nil {
				p.bytes.Release(int64(len(msg.Data))) // never sent: no handler will
			}
			return fmt.Errorf("publish event: %w", err)
		}
		// The connection-wide window is full (other relays): wait.
		select {
		case <-p.js.PublishAsyncComplete():
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			if p.bytes != nil {
				p.bytes.Release(int64(len(msg.Data)))
			}
			return ctx.Err()
		}
	}
}

// releaseClaims gives up claims (and forgets msgs): a copy held back on
// them is published by its holder.
func (p *windowPublisher) releaseClaims(claims []*claim, msgs []*nats.Msg) {
	if p.claims == nil {
		return
	}
	cs := claims[:0:0]
	for _, c := range claims {
		if c != nil {
			cs = append(cs, c)
		}
	}
	p.claims.settle(msgs, cs, false)
}

// hold holds back a copy another publisher has claimed, first settling the
// oldest held copy when a window's worth are held.
func (p *windowPublisher) hold(ctx context.Context, h heldCopy) error {
	p.waiting = append(p.waiting, h)
	if len(p.waiting) < p.window {
		return nil
	}
	return p.resolveHeld(ctx, 1)
}

// resolveHeld settles held copies whose claims are settled, and waits for
// the oldest wait of them (at most claimWait each): a copy whose claim was
// acknowledged is dropped, one whose claim failed or did not settle in
// time is published.
func (p *windowPublisher) resolveHeld(ctx context.Context, wait int) error {
	if wait > 0 {
		// What this publisher gathered goes first: another's held copies
		// may wait on its claims while it waits on theirs.
		if err := p.send(ctx); err != nil {
			return err
		}
	}
	held := p.waiting
	p.waiting = nil
	var publish []heldCopy
	for i, h := range held {
		if i < wait {
			select {
			case <-h.c.done:
			case <-p.after(max(0, claimWait-p.now().Sub(h.since))):
			case <-ctx.Done():
				p.waiting = append(p.waiting, held[i:]...)
				return ctx.Err()
			}
		}
		select {
		case <-h.c.done:
			if h.c.ok {
				p.countHeld("dropped")
			} else {
				p.countHeld("published")
				publish = append(publish, h)
			}
		default:
			if i < wait {
				p.countHeld("published")
				publish = append(publish, heldCopy{msg: h.msg, keys: h.keys}) // waited long enough
			} else {
				p.waiting = append(p.waiting, h)
			}
		}
	}
	for _, h := range publish {
		if h.c == nil {
			if err := p.gather(ctx, h.msg, h.keys, nil); err != nil {
				return err
			}
			continue
		}
		if err := p.add(ctx, h.msg, h.keys.key, h.keys.id); err != nil {
			return err
		}
	}
	return nil
}

func (p *windowPublisher) countHeld(outcome string) {
	if p.m != nil {
		p.m.heldBack.WithLabelValues(outcome).Inc()
	}
}

// close gives up what the publisher still claims: called when its batch or
// subscription ends, after flush or without it (a failed batch).
func (p *windowPublisher) close() {
	if p.claims == nil {
		return
	}
	var cs []*claim
	var msgs []*nats.Msg
	for _, g := range p.buf {
		cs = append(cs, g.claim)
	}
	for _, pp := range p.pending {
		cs = append(cs, pp.claims...)
		msgs = append(msgs, pp.msg)
	}
	p.releaseClaims(cs, msgs)
	p.waiting = nil
}

// publishRetryFor is how long a publish that failed is tried again before
// its batch fails. A stream whose leader's node died answers no publish
// until its replicas have elected another (nats-server's Raft election
// timeouts are 4-9 s, after the lost leader is noticed); a failed batch waits
// for the planner's GRASP_PLANNER_FAILURE_RETRY (5 minutes by default), so
// giving up after ~3 s, as the fetcher did, delayed the last tenth of the
// faults row's world by 5 minutes (docs/measurements/2026-12-05-issue31-cluster-cpu.md).
const publishRetryFor = 30 * time.Second

// settle waits for one acknowledgement and retries its message on failure
// (a batch's Nats-Msg-Id makes a retry of one stored already harmless),
// with backoff from 200 ms to 2 s, for publishRetryFor.
func (p *windowPublisher) settle(ctx context.Context, pp pendingPub) error {
	fut := pp.fut
	select {
	case <-fut.Ok():
		p.acked(pp)
		return nil
	case err := <-fut.Err():
		last, wait := err, 200*time.Millisecond
		for deadline := p.now().Add(publishRetryFor); ; {
			select {
			case <-p.after(wait):
			case <-ctx.Done():
				return ctx.Err()
			}
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := p.js.PublishMsg(pctx, fut.Msg())
			cancel()
			if err == nil {
				p.acked(pp)
				return nil
			}
			last, wait = err, min(2*wait, 2*time.Second)
			if ctx.Err() != nil || !p.now().Before(deadline) {
				break
			}
		}
		return fmt.Errorf("publish event %s: %w", fut.Msg().Header.Get(nats.MsgIdHdr), last)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// flush publishes the gathered events and waits for every outstanding
// acknowledgement.
func (p *windowPublisher) flush(ctx context.Context) error {
	for len(p.waiting) > 0 {
		if err := p.resolveHeld(ctx, len(p.waiting)); err != nil {
			return err
		}
	}
	if err := p.send(ctx); err != nil {
		return err
	}
	for len(p.pending) > 0 {
		if err := p.settle(ctx, p.pending[0]); err != nil {
			return err
		}
		p.pop()
	}
	return nil
}
