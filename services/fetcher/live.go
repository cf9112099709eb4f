package fetcher

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
	"github.com/grasp-sync/grasp-sync/pkg/relaylimits"
)

// liveGroup is one live REQ the planner asked for. While its REQ is open
// it holds no goroutine: the connection's delivery goroutine calls its
// handler (relayconn.Handler) for each event, EOSE and CLOSED, and a
// context.AfterFunc ends it when it is cancelled (issue 32: a goroutine per
// live REQ was most of what graspd held at rest). A goroutine runs it only
// while it waits: out a rate-limit cooldown before subscribing, for a slot
// of the relay's subscription budget, and, when the relay closes the
// subscription (CLOSED), while it reports that and reopens it with backoff
// for as long as the group exists. ReplaceLive and DropRelay cancel exactly
// the groups that existed, pending reopens included; CloseLive those opened
// under the ids it names.
type liveGroup struct {
	// id is the planner's name for the set the group belongs to
	// (AddFilters.live_id, ReplaceLive.live_id); "" unnamed.
	id string
	// purpose says why the group's REQ is sent (grasp_fetcher_sent_bytes_total:
	// live_new, live_merge, live_replace, live_repack); a reopen after the
	// relay closed it is live_reopen.
	purpose string
	// opened is set once the group's REQ was sent (by the one goroutine
	// running runLive at a time): a later one is a reopen.
	opened bool
	// filters are kept compact for the group's life (liveFilter).
	filters liveFilters
	cancel  context.CancelFunc
	done    chan struct{}
	// live is closed once the relay has registered the subscription (its
	// EOSE arrived) or the group ended, so a ReplaceLive can keep the old
	// groups open until the new ones are in place.
	live     chan struct{}
	liveOnce sync.Once
	// starved is closed when the group's REQ has to wait for a slot of
	// the relay's subscription budget: a replacement waiting on it then
	// closes the groups it replaces first, whose slots it needs.
	starved    chan struct{}
	starveOnce sync.Once

	// pub gathers the group's events into batch messages; it is used by
	// one goroutine at a time (the delivery goroutine while the REQ is
	// open, the one ending the group after).
	pub *windowPublisher
	// closes counts the relay's closings, for the backoff.
	closes int

	// mu guards the hand-over between the goroutine opening the REQ, the
	// handler's CLOSED and the group's cancellation: stop is set while the
	// REQ is open and the group at rest (context.AfterFunc's stop);
	// closedEarly is a CLOSED that came before stop was set.
	mu          sync.Mutex
	stop        func() bool
	closedEarly *string

	// A group that also reads its batch's history (combined.go): ctx is
	// its context; waiting is set until the batch's turn opens it (or its
	// cancellation ends it unopened); first collects what the relay sends
	// before the first open's EOSE, each filter asked with its limit in
	// firstLimits (0: none of its history).
	ctx         context.Context
	waiting     bool
	first       *firstPage
	firstLimits []int
}

func (g *liveGroup) markLive()    { g.liveOnce.Do(func() { close(g.live) }) }
func (g *liveGroup) markStarved() { g.starveOnce.Do(func() { close(g.starved) }) }

// liveReopenMax caps the backoff of a live subscription the relay keeps
// closing.
const liveReopenMax = 10 * time.Minute

// openLive starts live groups for fs, each with limit 0 (only new
// events), named id: one group per REQ, the filters packed into as few
// REQs as the relay's budget allows (message size, filters per REQ, and
// at most LiveFiltersPerREQ filters; relaylimits.Pack). purpose says why
// (liveGroup.purpose).
func (w *relayWorker) openLive(fs []nostr.Filter, id, purpose string) {
	w.openLiveGroups(fs, id, purpose, false)
}

// openLiveGroups is openLive; with deferred, a set that fits one REQ is
// not opened but returned, waiting for its batch's turn (combined.go).
// Otherwise it returns nil.
func (w *relayWorker) openLiveGroups(fs []nostr.Filter, id, purpose string, deferred bool) *liveGroup {
	if w.sess == nil || len(fs) == 0 {
		return nil
	}
	lim := w.lims.effective()
	lim.MaxFilters = min(lim.MaxFilters, w.f.cfg.LiveFiltersPerREQ)
	lim.MaxSubscriptions, lim.MaxLimit = 0, 0
	live := make([]nostr.Filter, len(fs))
	for i, f := range fs {
		f.Limit, f.LimitZero = 0, true
		live[i] = f
	}
	share := hexShare{}
	chunks := relaylimits.Pack(live, lim)
	deferred = deferred && len(chunks) == 1
	for _, chunk := range chunks {
		ctx, cancel := context.WithCancel(w.sess.ctx)
		g := &liveGroup{id: id, purpose: purpose, filters: compactFilters(chunk, share), cancel: cancel, done: make(chan struct{}),
			live: make(chan struct{}), starved: make(chan struct{}), pub: w.f.newWindowPublisher(), ctx: ctx}
		w.live[g] = struct{}{}
		if deferred {
			g.waiting = true
			// Cancelled before its turn (closed by name, replaced, the
			// session's end): it ends unopened.
			context.AfterFunc(ctx, func() {
				g.mu.Lock()
				unopened := g.waiting
				g.waiting = false
				g.mu.Unlock()
				if unopened {
					w.endLive(g)
				}
			})
			return g
		}
		s := w.sess
		w.tasks.Add(1)
		go func() {
			defer w.tasks.Done()
			w.runLive(ctx, s, g, nil)
		}()
	}
	return nil
}

// replaceLive opens the new live groups before closing the old ones (make
// before break): the old groups are cancelled only once every new group's
// subscription is registered at the relay or has ended, so no event falls
// between them; the ingesters drop the duplicates the overlap delivers. It
// does not block the worker: the old groups are retired in the background.
func (w *relayWorker) replaceLive(fs []nostr.Filter, id string) {
	old := w.live
	w.live = map[*liveGroup]struct{}{}
	w.openLive(fs, id, "live_replace")
	fresh := make([]*liveGroup, 0, len(w.live))
	for g := range w.live {
		fresh = append(fresh, g)
	}
	w.retire(old, fresh)
}

// closeLiveSets closes the live groups opened under ids. With after set,
// they are closed once every group opened under after so far is
// registered at the relay (make before break, like replaceLive): the
// planner opens a merged set under a new id, then closes the sets it
// merged. The groups leave w.live at once, so a later ReplaceLive or
// CloseLive does not count them; unknown ids are ignored.
func (w *relayWorker) closeLiveSets(ids []string, after string) {
	if len(ids) == 0 {
		return
	}
	names := make(map[string]struct{}, len(ids))
	for _, id := range ids {
		if id != "" {
			names[id] = struct{}{}
		}
	}
	old := map[*liveGroup]struct{}{}
	var fresh []*liveGroup
	for g := range w.live {
		if _, ok := names[g.id]; ok {
			old[g] = struct{}{}
			delete(w.live, g)
		} else if after != "" && g.id == after {
			fresh = append(fresh, g)
		}
	}
	w.retire(old, fresh)
}

// retire cancels the old groups once every fresh group's subscription is
// registered at the relay or has ended, in the background so the worker
// is not blocked.
func (w *relayWorker) retire(old map[*liveGroup]struct{}, fresh []*liveGroup) {
	if len(old) == 0 {
		return
	}
	w.tasks.Add(1)
	go func() {
		defer w.tasks.Done()
		for _, g := range fresh {
			// Closed on EOSE, or when the group ends (session end
			// included). A group waiting for a subscription slot would
			// wait for the old groups' slots forever: the old ones are
			// closed first then (break before make), within the relay's
			// budget; the gap is the time to reopen.
			select {
			case <-g.live:
			case <-g.starved:
				w.f.m.liveBreakBeforeMake.Inc()
			}
		}
		for g := range old {
			g.cancel()
		}
		for g := range old {
			<-g.done
		}
	}()
}

// closeLive cancels every live group and waits for them to close their
// subscriptions.
func (w *relayWorker) closeLive() {
	for g := range w.live {
		g.cancel()
	}
	for g := range w.live {
		<-g.done
	}
	w.live = map[*liveGroup]struct{}{}
}

// runLive opens the group's REQ (after a CLOSED with its reason, when
// closed is set) and returns once it is open, the group at rest; it ends
// the group when the group is cancelled or cannot be opened again.
func (w *relayWorker) runLive(ctx context.Context, s *session, g *liveGroup, closed *string) {
	for {
		if closed != nil {
			if !w.liveClosed(ctx, s, g, *closed) {
				w.endLive(g)
				return
			}
			closed = nil
		}
		if err := w.cooldown.Wait(ctx); err != nil {
			w.endLive(g)
			return
		}
		// unopened counts the subscription out of the gauge once, when
		// the relay closes it or the group ends.
		unopened := sync.OnceFunc(func() { w.f.m.liveSubs.WithLabelValues(w.url).Dec() })
		fs := g.filters.filters()
		// The first open of a combined group asks for the batch's history
		// too; a reopen asks for what is new only.
		var first *firstPage
		if !g.opened && g.first != nil {
			first = g.first
			for i := range fs {
				fs[i].Limit, fs[i].LimitZero = g.firstLimits[i], g.firstLimits[i] == 0
			}
		}
		h := &relayconn.Handler{
			Event: func(evt *nostr.Event, more bool) {
				if first != nil && first.add(evt) {
					return
				}
				w.liveEvent(ctx, s, g, evt, more)
			},
			EOSE: func() {
				if first != nil {
					first.eose()
				}
				g.markLive()
			},
			Closed: func(reason string) {
				if first != nil {
					first.fail()
				}
				unopened()
				w.liveClosedBy(ctx, s, g, reason)
			},
		}
		purpose := g.purpose
		if g.opened {
			purpose = "live_reopen"
		}
		sub, err := s.conn.SubscribeLive(relayconn.WithPurpose(ctx, purpose), fs, func() {
			g.markStarved()
			w.askFitLive()
		}, h)
		if err != nil && first != nil {
			first.fail()
		}
		var tooLarge *relayconn.TooLargeError
		if errors.As(err, &tooLarge) {
			// The budget went down since the group was packed: open its
			// filters again in REQs that fit.
			w.askRepack(ctx, g)
			w.endLive(g)
			return
		}
		if err != nil {
			w.endLive(g) // the connection is gone: the session ends
			return
		}
		w.f.m.reqs.WithLabelValues("live", "").Inc()
		g.opened = true
		w.f.m.liveSubs.WithLabelValues(w.url).Inc()
		g.mu.Lock()
		if g.closedEarly != nil {
			// The relay closed it before it was handed over.
			closed, g.closedEarly = g.closedEarly, nil
			g.mu.Unlock()
			continue
		}
		g.stop = context.AfterFunc(ctx, func() {
			sub.Close() // waits out a handler call in progress
			unopened()
			w.endLive(g)
		})
		g.mu.Unlock()
		return // at rest: the handler and the AfterFunc take it from here
	}
}

// liveEvent publishes one event of the group's subscription (on the
// connection's delivery goroutine).
func (w *relayWorker) liveEvent(ctx context.Context, s *session, g *liveGroup, evt *nostr.Event, more bool) {
	if _, err := w.publish(ctx, g.pub, evt, g.filters, s.id, "", "live"); err != nil && ctx.Err() == nil {
		w.log.Warn("live event not published", "session", s.id, "id", evt.ID, "err", err)
	}
	// A burst travels together; a lone event does not wait for company.
	if !more {
		if err := g.pub.send(ctx); err != nil && ctx.Err() == nil {
			w.log.Warn("live events not published", "session", s.id, "err", err)
		}
	}
}

// liveClosedBy takes the relay's CLOSED of the group's subscription (on the
// connection's delivery goroutine, which must not wait): a goroutine
// reopens it, unless the group is being cancelled, whose AfterFunc ends it.
func (w *relayWorker) liveClosedBy(ctx context.Context, s *session, g *liveGroup, reason string) {
	g.mu.Lock()
	if g.stop == nil {
		g.closedEarly = &reason // runLive has not handed it over yet
		g.mu.Unlock()
		return
	}
	stopped := g.stop()
	g.stop = nil
	g.mu.Unlock()
	if !stopped {
		return // cancelled meanwhile: endLive runs
	}
	// The group's done is still open, so endSession has not reached
	// tasks.Wait: this Add does not race it.
	w.tasks.Add(1)
	go func() {
		defer w.tasks.Done()
		w.runLive(ctx, s, g, &reason)
	}()
}

// endLive ends the group once its subscription is closed: its events
// flushed to the stream, done closed.
func (w *relayWorker) endLive(g *liveGroup) {
	fctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if err := g.pub.flush(fctx); err != nil {
		w.log.Warn("live events not acknowledged", "err", err)
	}
	cancel()
	g.markLive()
	close(g.done)
}

// liveClosed answers the relay's closing of the group's subscription:
// false when the group ends (its filters repacked, or cancelled while it
// waits to reopen), true when it is to be opened again.
func (w *relayWorker) liveClosed(ctx context.Context, s *session, g *liveGroup, reason string) bool {
	refusal := relaylimits.Classify(reason)
	switch {
	case refusal == relaylimits.TooManySubscriptions:
		// Over the relay's count: the connection lowered its gate, so
		// the REQ goes again once a slot is free. Not a closure of a
		// live subscription that was open: none was.
		return true
	case refusal.IsLimit():
		w.askRepack(ctx, g)
		return false
	}
	// The relay closed this subscription: the connection lives on.
	w.f.m.subClosed.WithLabelValues("live").Inc()
	g.closes++
	var wait time.Duration
	switch {
	case IsRateLimit(reason):
		w.rateLimited("CLOSED: " + reason)
		wait = w.cooldown.Until().Sub(w.f.clock.Now()) // cooldown.Wait does the waiting; this is for the report
	case strings.HasPrefix(reason, "auth-required:") && s.auth.sk != "" && g.closes <= 3:
		actx, cancel := context.WithTimeout(ctx, 15*time.Second)
		ok := s.auth.wait(actx)
		cancel()
		if ok {
			g.closes-- // an authentication retry is not the relay refusing us
			return true
		}
		wait = Backoff(w.f.cfg.BackoffBase, liveReopenMax, g.closes)
	case readRefusal(reason):
		// The relay will not serve this read to us: asked again a day
		// later, not in a loop.
		retry := w.refusedRead(s, g.filters.filters(), reason)
		wait = retry.Sub(w.f.clock.Now())
	default:
		wait = Backoff(w.f.cfg.BackoffBase, liveReopenMax, g.closes)
	}
	retryAt := w.f.clock.Now().Add(max(wait, 0))
	w.log.Warn("live subscription closed by relay", "session", s.id, "reason", reason, "retry_at", retryAt)
	w.reportFor(s.id, &graspv1.FetchReport{Report: &graspv1.FetchReport_SubscriptionClosed{SubscriptionClosed: &graspv1.SubscriptionClosed{
		Reason: reason, Live: true, RetryAt: retryAt.UnixMilli()}}})
	if !IsRateLimit(reason) {
		select {
		case <-w.f.clock.After(wait):
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// askRepack hands a live group the relay refused for its size or filter
// count to run, which opens its filters again within the budget now in
// force (relayWorker.run).
func (w *relayWorker) askRepack(ctx context.Context, g *liveGroup) {
	select {
	case w.repack <- g:
	case <-ctx.Done():
	}
}

// refusedRead remembers that the relay refused reads of fs's kinds and
// returns when they are asked again.
func (w *relayWorker) refusedRead(s *session, fs nostr.Filters, reason string) time.Time {
	now := w.f.clock.Now()
	var retry time.Time
	kinds := map[string]bool{}
	for _, f := range fs {
		kinds[filterKind(f)] = true
	}
	for kind := range kinds {
		retry = w.lims.refuse(kind, reason, now)
		w.f.m.readRefusals.WithLabelValues(relaylimits.Classify(reason).String()).Inc()
	}
	w.log.Warn("relay refuses a read; asking again later", "session", s.id, "reason", reason, "retry_at", retry)
	w.saveLimitsAsync(s)
	return retry
}

// publish checks an event and publishes it for the ingesters: subject
// grasp.events.<shard>, headers naming relay, session, batch and mode,
// gathered with its neighbours into one batch message (windowPublisher); an
// event alone carries Nats-Msg-Id = bus.EventMsgID (the same event from
// many relays is ingested once, a forged copy cannot shadow it), and the
// recent-ids memory skips copies of events acknowledged moments ago.
// It returns false for an event dropped by the checks or skipped as one the
// stream holds already.
func (w *relayWorker) publish(ctx context.Context, pub *windowPublisher, evt *nostr.Event, fs eventMatcher, session, batch, mode string) (bool, error) {
	return w.publishAs(ctx, pub, evt, fs, session, batch, mode, bus.EventMsgID(evt.ID, evt.Sig))
}

// publishAs is publish with an explicit Nats-Msg-Id: a refetched event must
// not be dropped as a duplicate of the copy refused moments ago.
func (w *relayWorker) publishAs(ctx context.Context, pub *windowPublisher, evt *nostr.Event, fs eventMatcher, session, batch, mode, msgID string) (bool, error) {
	w.f.m.events.WithLabelValues(w.url, mode).Inc()
	key := recentKeyOf(msgID)
	if pub.published(key) {
		// The stream holds this very id and signature already (another
		// relay's copy, moments ago) and would drop it as a duplicate:
		// skip the checks, the encoding and the publish.
		w.f.m.skippedPublished.Inc()
		return false, nil
	}
	if reason := checkEvent(evt, fs); reason != "" {
		w.f.m.dropped.WithLabelValues(reason).Inc()
		w.log.Debug("event dropped", "id", evt.ID, "reason", reason, "session", session, "batch", batch)
		return false, nil
	}
	data, err := evt.MarshalJSON()
	if err != nil {
		return false, fmt.Errorf("encode event %s: %w", evt.ID, err)
	}
	msg := nats.NewMsg(w.f.bus.Names.EventsSubject(w.shard))
	msg.Data = data
	msg.Header.Set(nats.MsgIdHdr, msgID)
	msg.Header.Set(bus.HeaderRelay, w.url)
	msg.Header.Set(bus.HeaderSession, session)
	msg.Header.Set(bus.HeaderMode, mode)
	bus.SetReadAt(msg.Header, w.f.clock.Now())
	if batch != "" {
		msg.Header.Set(bus.HeaderBatch, batch)
	}
	if err := pub.add(ctx, msg, key, recentKeyOf(evt.ID)); err != nil {
		return false, err
	}
	return true, nil
}
