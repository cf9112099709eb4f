package ingester

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/policy"
	"github.com/grasp-sync/grasp-sync/pkg/store"
)

// settle decides a verified batch and acks what is done. Items that failed
// for an infrastructure reason are retried: during a store outage all of
// them, held (not redelivered, not counted against MaxDeliver) with
// backoff until the store answers; while the store answers, each alone (one
// event the backend keeps rejecting must not fail its batch-mates) and then
// redelivered later or dead-lettered.
func (i *Ingester) settle(ctx context.Context, items []*item) {
	// Batching keeps messages longer than handling them one by one would;
	// a batch that has waited a third of AckWait is kept alive so it is
	// not redelivered (and counted twice) while it is being decided.
	if len(items) > 0 && i.clk.Now().Sub(items[0].received) > i.cfg.AckWait/3 {
		keepAlive(items)
	}
	failed := i.decide(ctx, items)
	wait := outageBackoffStart
	for len(failed) > 0 {
		if ctx.Err() != nil {
			eachMsg(failed, func(m jetstream.Msg) { _ = m.Nak() }) // another replica takes it at once
			return
		}
		if !targetUnavailable(failed) && i.storeReachable(ctx) {
			if len(failed) > 1 {
				var still []*item
				for _, it := range failed {
					still = append(still, i.decide(ctx, []*item{it})...)
				}
				if failed = still; len(failed) == 0 || targetUnavailable(failed) || !i.storeReachable(ctx) {
					continue
				}
			}
			i.failedItems(ctx, failed)
			return
		}
		if i.outage.begin() {
			i.m.outage.Set(1)
			if i.target != nil {
				// Bolt-on mode: the target is our store; waiting for its
				// publish rate or a rate-limit pause is routine.
				i.log.Info("target relay busy or unreachable: holding messages and backing off", "consumer", i.cfg.Consumer, "err", failed[0].err)
			} else {
				i.log.Warn("store unreachable: holding messages and backing off", "consumer", i.cfg.Consumer, "err", failed[0].err)
			}
		}
		// Held, not nak'ed: a redelivery would count against MaxDeliver
		// and only meet the same outage.
		keepAlive(failed)
		select {
		case <-ctx.Done():
			continue
		case <-i.clk.After(wait):
		}
		wait = min(2*wait, i.cfg.OutageBackoffMax, i.cfg.AckWait/2)
		failed = i.decide(ctx, failed)
	}
	if i.outage.end() {
		i.m.outage.Set(0)
		i.log.Info("store reachable again: resuming", "consumer", i.cfg.Consumer)
	}
}

// decide applies the policy to items in order and settles each: refusals,
// duplicates and parked events are acked at once, accepted events once
// written (with the rest of the batch). It returns the items that failed.
func (i *Ingester) decide(ctx context.Context, items []*item) []*item {
	deletion := false
	for _, it := range items {
		deletion = deletion || it.evt != nil && it.evt.Kind == nip34.KindDeletion
	}
	// A deletion is decided and applied with nothing else of this replica
	// in progress (wake-ups of parked events included): a target being
	// evaluated and stored meanwhile could escape it.
	if deletion {
		i.deletions.Lock()
		defer i.deletions.Unlock()
	} else {
		i.deletions.RLock()
		defer i.deletions.RUnlock()
	}
	// Sized for the lookups per event the prefetch caches (its id, its
	// deletion, a reference).
	b := &batch{i: i, pending: newPendingSet(), deferred: newPendingSet(), cache: make(map[string]lookup, 3*len(items))}
	b.prefetch(ctx, items)
	pol := *i.policy
	pol.Store = b
	// Passes: an event whose decision depends on one accepted (or itself
	// deferred) earlier in this pass is deferred to the next pass, after
	// the write. Each pass decides at least its first event, so this ends;
	// a batch needs as many writes as its longest dependency chain, not one
	// per dependency.
	for todo := items; len(todo) > 0; {
		var later []*item
		for _, it := range todo {
			it.err = nil
			switch it.check {
			case checkMalformed:
				i.done(it, outcomeMalformed)
			case checkBadID:
				i.done(it, string(policy.ReasonBadID))
			case checkStored:
				i.duplicate(ctx, it)
			case checkForged, checkVerified:
				if it.check == checkVerified && b.pending.has(it.evt.ID) {
					i.done(it, outcomeDuplicate) // a copy of an event accepted earlier in this batch
					continue
				}
				var d policy.Decision
				if it.check == checkForged {
					// Evaluate, not a bare bad-signature refusal: a
					// cheaper check it makes first (size, shape, time)
					// names the refusal, as for any other caller. It
					// refuses before reading the store.
					d = pol.Evaluate(ctx, it.evt)
				} else {
					d = pol.EvaluateVerified(ctx, it.evt)
				}
				if errors.Is(d.Err, errDeferred) {
					b.deferred.add(it)
					later = append(later, it)
					continue
				}
				i.apply(ctx, b, it, d)
			}
		}
		_ = b.flush(ctx) // failures are on the items
		b.deferred = newPendingSet()
		todo = later
	}
	i.ackSettled(items)
	var failed []*item
	for _, it := range items {
		if it.err != nil {
			failed = append(failed, it)
		}
	}
	return failed
}

// ackSettled acks the messages of the settled items, in the batch's order
// (the order they were delivered in, normally the stream's). Settling
// happens out of that order — refusals at once, accepted events when their
// pass is written, a batch's dependants one pass later — and the work-queue
// stream removes a message when it is acked: removals out of sequence order
// leave holes in the stream's file blocks, which the server records and
// compacts by rewriting the block (~6 cpu-µs per ack in BenchmarkIngest;
// docs/measurements/2026-12-02-ingester-where-the-us-go-acks-in-order.md), while removals in order only advance
// the block's first sequence. Every ack still follows its event's store
// commit (or definitive refusal): the ack only moves to the end of decide.
//
// A message carrying a batch of events is acked with its last settled event:
// until then its redelivery brings them all again, and those settled already
// are found duplicates (stored once, counted stored once).
func (i *Ingester) ackSettled(items []*item) {
	for _, it := range items {
		if !it.settled {
			continue
		}
		it.settled = false
		if it.del.settled++; it.del.settled < it.del.events {
			continue
		}
		if err := it.msg.Ack(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			i.log.Warn("ack failed: the event will be redelivered and found a duplicate", "relay", it.relay, "err", err)
		}
	}
}

// apply does what a decision on an item calls for.
func (i *Ingester) apply(ctx context.Context, b *batch, it *item, d policy.Decision) {
	switch judge(d) {
	case verdictStore:
		b.pending.add(it)
	case verdictRetry:
		it.err = fmt.Errorf("evaluate %s: %w", it.evt.ID, d.Err)
	case verdictDuplicate:
		i.duplicate(ctx, it)
	case verdictPark:
		// Parked as verified: the immediate re-evaluation need not check
		// the signature again.
		if err := i.park(ctx, it.evt, d, it.relay, it.check == checkVerified); err != nil {
			it.err = err
			return
		}
		i.done(it, outcomeParked)
	case verdictRefuse:
		i.refuse(ctx, it, d)
	}
}

// refuse settles an item the policy refused for good.
func (i *Ingester) refuse(ctx context.Context, it *item, d policy.Decision) {
	if d.Reason == policy.ReasonStoreError {
		it.err = fmt.Errorf("evaluate %s: %w", it.evt.ID, d.Err)
		return
	}
	i.log.Debug("event refused", "id", it.evt.ID, "kind", it.evt.Kind, "reason", string(d.Reason), "relay", it.relay)
	i.remember(ctx, it.evt, d.Reason, it.relay)
	i.done(it, string(d.Reason))
}

// duplicate settles an item whose event is stored already.
func (i *Ingester) duplicate(ctx context.Context, it *item) {
	// A stored deletion whose application failed before is applied again
	// on redelivery (idempotent; nothing for other kinds).
	if err := store.ApplyDeletion(ctx, i.store, it.evt); err != nil {
		it.err = err
		return
	}
	if it.evt.Kind == nip34.KindDeletion {
		// It may just have removed announcements (an earlier attempt died
		// before applying it), with no notice to say so.
		i.forgetLookups()
	}
	if md, err := it.msg.Metadata(); err == nil && md.NumDelivered > 1 {
		// A redelivery: an earlier attempt may have stored the event and
		// died before announcing it, so neither the wake loops nor the
		// relays heard of it. Wake its dependants here (reliably: a failure
		// retries the message) and announce it again; both are idempotent
		// (relays broadcast by id, subscribers and discovery dedup by id).
		if err := i.wakeFor(ctx, it.evt); err != nil {
			it.err = err
			return
		}
		if err := i.reannounce(ctx, it.evt.ID); err != nil {
			it.err = err
			return
		}
	}
	i.done(it, outcomeDuplicate)
}

// reannounce publishes the stored copy of an event on grasp.stored.<kind>
// again. The stored copy, not the message: a duplicate's signature is not
// checked (its id is stored), and a forged copy must not be broadcast.
func (i *Ingester) reannounce(ctx context.Context, id string) error {
	found, err := i.store.Query(ctx, nostr.Filter{IDs: []string{id}, Limit: 1})
	if err != nil {
		return fmt.Errorf("re-announce %s: %w", id, err)
	}
	if len(found) == 0 {
		return nil // deleted meanwhile: nothing to announce
	}
	data, err := json.Marshal(found[0])
	if err != nil {
		return fmt.Errorf("re-announce %s: %w", id, err)
	}
	i.publishStored(found[0], data)
	return nil
}

// done counts an item's outcome and marks it settled: decide acks its
// message at the end of the batch (ackSettled).
func (i *Ingester) done(it *item, outcome string) {
	if it.check == checkVerified && verified(policy.Reason(outcome)) {
		i.m.incVerified()
	}
	switch outcome {
	case outcomeStored:
		i.m.storedAfter(i.clk.Now().Sub(publishedAt(it.msg)))
	case outcomeDuplicate:
		i.m.incDuplicate()
	case outcomeParked:
		i.m.incParked()
	default:
		i.m.incRefused(outcome)
	}
	it.settled = true
}
