package fetcher

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/history"
	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
	"github.com/grasp-sync/grasp-sync/pkg/relaylimits"
)

// req reads f completely with REQ+EOSE, paginating with until while pages
// may have been capped: a short page ends the read only when the relay has
// returned a longer one on this connection, otherwise one more page is
// asked (docs/decisions/0021-history-crowded-second.md). A capped page that falls entirely inside one second
// makes that second read on its own, split into narrower REQs until each
// comes back under the cap (history.Reader; docs/decisions/0021-history-crowded-second.md). NIP-77 is
// not tried for such a slice here: this path runs only when NIP-77 is
// disabled or has failed for the session, and when it works it reads the
// whole filter without a cap. A slice that cannot be narrowed further is
// returned as a *history.IncompleteError after everything else was read.
func (b *batchRun) req(f nostr.Filter) error {
	w := b.w
	lim := w.lims.effective()
	pageSize := min(w.f.cfg.PageSize, lim.MaxLimit)
	f.Limit, f.LimitZero = pageSize, false
	rd := &history.Reader{
		Page: func(_ context.Context, pf nostr.Filter) ([]*nostr.Event, error) {
			page, n, err := b.page(pf)
			b.bytes += n
			w.f.m.historicBytes.WithLabelValues("req").Add(float64(n))
			return page, err
		},
		Full:          min(pageSize, w.f.cfg.RelayMinCap),
		MaxPages:      w.f.cfg.MaxPages,
		ShortPageEnds: true,
		Cap:           &b.s.relayCap,
	}
	st, err := rd.Read(b.s.ctx, f, func(evts []*nostr.Event) error { return b.deliver(f, evts) })
	w.f.m.crowdedSeconds.Add(float64(st.Seconds))
	if errors.Is(err, history.ErrTooDeep) {
		return fmt.Errorf("%s: %w", w.url, err)
	}
	if errors.Is(err, history.ErrIncomplete) {
		w.log.Warn("history slice cannot be read completely with REQ", "session", b.s.id, "batch", b.id, "err", err)
	}
	return err
}

// deliver publishes a page of f's history: together, as one message.
func (b *batchRun) deliver(f nostr.Filter, evts []*nostr.Event) error {
	if len(evts) == 0 {
		return nil
	}
	var lacked map[string]bool
	if b.countMissed && !b.refetching {
		var err error
		if lacked, err = b.lacked(evts); err != nil {
			return err
		}
	}
	for _, evt := range evts {
		if !b.s.looseTags.Load() && !matchesIgnoringLimit(nostr.Filters{f}, evt) {
			b.s.looseTags.Store(true)
		}
		if err := b.emit(evt, reqFilters{f}, lacked[evt.ID]); err != nil {
			return err
		}
	}
	return b.pub.send(b.s.ctx) // a page travels together
}

// lacked returns the ids of a REQ page's events that a resync batch counts
// as missed: those the local set lacks whose ids the events stream has not
// just taken (another copy, live or from another relay, is on its way to
// the store), as the NIP-77 path decides with dropHeld and deferPublished.
func (b *batchRun) lacked(evts []*nostr.Event) (map[string]bool, error) {
	missing := make(map[string]struct{}, len(evts))
	for _, evt := range evts {
		missing[evt.ID] = struct{}{}
	}
	if err := b.dropHeld(missing); err != nil {
		return nil, err
	}
	b.deferPublished(missing)
	out := make(map[string]bool, len(missing))
	for id := range missing {
		out[id] = true
	}
	return out, nil
}

// emit publishes one historic event; missed: count it as missed if it is
// published.
func (b *batchRun) emit(evt *nostr.Event, fs reqFilters, missed bool) error {
	b.received++
	var published bool
	var err error
	if b.refetching {
		published, err = b.w.publishAs(b.s.ctx, b.pub, evt, fs, b.s.id, b.id, "historic", bus.EventMsgID(evt.ID, evt.Sig)+":refetch:"+b.id)
	} else {
		published, err = b.w.publish(b.s.ctx, b.pub, evt, fs, b.s.id, b.id, "historic")
	}
	if published && missed {
		if _, dup := b.counted[evt.ID]; !dup {
			if b.counted == nil {
				b.counted = map[string]struct{}{}
			}
			b.counted[evt.ID] = struct{}{}
			b.missed++
		}
	}
	return err
}

// page sends one REQ and returns what the relay sends before EOSE and the
// bytes it took. Rate limiting waits out the cooldown and asks again;
// "auth-required:" waits for our NIP-42 answer and asks again; any other
// CLOSED, a timeout or a lost connection is an error, never a silently short
// result.
func (b *batchRun) page(f nostr.Filter) ([]*nostr.Event, uint64, error) {
	w := b.w
	var bytes uint64
	for attempt := 0; ; attempt++ {
		if err := w.cooldown.Wait(b.s.ctx); err != nil {
			return nil, bytes, err
		}
		b.pages++
		purpose := "history"
		if len(f.IDs) > 0 {
			purpose = "ids"
		}
		w.f.m.reqs.WithLabelValues(purpose, b.kind).Inc()
		evts, n, reason, err := b.pageOnce(f)
		bytes += n
		if err != nil || reason == "" {
			return evts, bytes, err
		}
		switch refusal := relaylimits.Classify(reason); {
		case refusal == relaylimits.TooManySubscriptions && attempt < 100:
			// Over the relay's count: the connection lowered its gate,
			// so the REQ waits for a free slot and goes again.
			// It was sent all the same: grasp_fetcher_reqs_total counts it.
			b.pages--
			continue
		case refusal == relaylimits.TooManyFilters || refusal == relaylimits.MessageTooLarge:
			// One filter per REQ, at most IDsPerREQ ids: nothing smaller
			// to send.
			return evts, bytes, fmt.Errorf("REQ to %s refused at the smallest size we send: %s", w.url, reason)
		}
		w.f.m.subClosed.WithLabelValues("historic").Inc()
		switch {
		case IsRateLimit(reason) && attempt < 20:
			w.rateLimited("CLOSED: " + reason)
			w.reportFor(b.s.id, &graspv1.FetchReport{Report: &graspv1.FetchReport_SubscriptionClosed{SubscriptionClosed: &graspv1.SubscriptionClosed{
				Reason: reason, BatchId: b.id, RetryAt: w.cooldown.Until().UnixMilli()}}})
			continue
		case strings.HasPrefix(reason, "auth-required:") && attempt < 3 && b.s.auth.sk != "":
			actx, cancel := context.WithTimeout(b.s.ctx, w.f.cfg.PageTimeout)
			ok := b.s.auth.wait(actx)
			cancel()
			if ok {
				continue
			}
		}
		if readRefusal(reason) {
			return evts, bytes, &readRefusedError{reason: reason}
		}
		return evts, bytes, fmt.Errorf("REQ to %s closed: %s", w.url, reason)
	}
}

// readRefusedError is a read the relay refused us (auth-required: that we
// cannot answer, restricted:): the part is remembered as refused and
// skipped (batchRun.part), not failed, so the batch does not come back
// every few minutes; the refusal is asked again a day later.
type readRefusedError struct{ reason string }

func (e *readRefusedError) Error() string { return "read refused: " + e.reason }

func (b *batchRun) pageOnce(f nostr.Filter) (out []*nostr.Event, bytes uint64, closedReason string, err error) {
	purpose := "history"
	if len(f.IDs) > 0 {
		purpose = "ids"
	}
	ctx := b.s.ctx
	sub, err := b.s.conn.Subscribe(relayconn.WithPurpose(ctx, purpose), nostr.Filters{f})
	if err != nil {
		return nil, 0, "", fmt.Errorf("REQ: %w", err)
	}
	defer func() { bytes = sub.Bytes() }()
	defer sub.Close()
	timeout := b.w.f.clock.After(b.w.f.cfg.PageTimeout)
	for {
		select {
		case evt := <-sub.Events():
			out = append(out, evt)
		case <-sub.EOSE():
			return append(out, sub.Buffered()...), 0, "", nil
		case reason := <-sub.Closed():
			return out, 0, reason, nil
		case <-b.s.conn.Context().Done():
			return out, 0, "", fmt.Errorf("REQ to %s: %w", b.w.url, context.Cause(b.s.conn.Context()))
		case <-timeout:
			return out, 0, "", fmt.Errorf("REQ to %s: no EOSE within %s", b.w.url, b.w.f.cfg.PageTimeout)
		case <-ctx.Done():
			return out, 0, "", ctx.Err()
		}
	}
}
