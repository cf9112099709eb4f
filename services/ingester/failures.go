package ingester

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/services/ingester/target"
)

// When an event cannot be processed: a store outage (messages held, the
// store probed), a failure while the store is healthy (redelivery), and the
// dead letter after MaxDeliver deliveries.

// Headers of a dead letter.
const (
	// HeaderDeadReason carries why a message was dead-lettered.
	HeaderDeadReason = "Grasp-Dead-Reason"
	// HeaderDeadSubject is the subject the dead-lettered message came from.
	HeaderDeadSubject = "Grasp-Dead-Subject"
	// HeaderDeadDeliveries is how often it was delivered before giving up.
	HeaderDeadDeliveries = "Grasp-Dead-Deliveries"
)

// outageBackoffStart is the first wait between store probes in an outage.
const outageBackoffStart = 50 * time.Millisecond

// storeReachable probes the store with a lookup that finds nothing and, in
// bolt-on mode, asks the target store whether a write would be tried now
// (connected, not paused, a token of the publish rate at hand).
func (i *Ingester) storeReachable(ctx context.Context) bool {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := i.store.Query(pctx, nostr.Filter{IDs: []string{probeID}, Limit: 1}); err != nil {
		return false
	}
	if r, ok := i.store.(interface{ Reachable(context.Context) error }); ok {
		return r.Reachable(pctx) == nil
	}
	return true
}

// targetUnavailable reports whether one of the items failed because the
// target relay could not be asked now (target.ErrUnavailable): such
// items are held like in a store outage, never counted against MaxDeliver
// (a target that rate-limits us for hours must not dead-letter anything).
func targetUnavailable(items []*item) bool {
	for _, it := range items {
		if errors.Is(it.err, target.ErrUnavailable) {
			return true
		}
	}
	return false
}

// probeID is an id no event has (no one knows a preimage of it).
const probeID = "0000000000000000000000000000000000000000000000000000000000000000"

// failedItems settles the items that failed while the store answers
// probes, message by message. A one-event message goes to failed. A batch
// message is redelivered whole (its settled events are found duplicates
// then) until its MaxDeliver-th delivery; then each of its failed events is
// dead-lettered alone and the message acked, so one poisoned event never
// takes its neighbours with it (docs/decisions/0053-events-travel-in-batches.md).
func (i *Ingester) failedItems(ctx context.Context, items []*item) {
	byMsg := map[*delivery][]*item{}
	var order []*delivery
	for _, it := range items {
		if _, ok := byMsg[it.del]; !ok {
			order = append(order, it.del)
		}
		byMsg[it.del] = append(byMsg[it.del], it)
	}
	for _, d := range order {
		failed := byMsg[d]
		if failed[0].index < 0 {
			i.failed(ctx, d.msg, failed[0].err)
			continue
		}
		i.failedBatch(ctx, d, failed)
	}
}

// failedBatch handles the failed events of one batch message (see
// failedItems).
func (i *Ingester) failedBatch(ctx context.Context, d *delivery, failed []*item) {
	relay := failed[0].relay
	md, err := d.msg.Metadata()
	if err != nil || md.NumDelivered < uint64(i.cfg.MaxDeliver) {
		i.log.Warn("events failed, their message will be redelivered", "relay", relay, "subject", d.msg.Subject(),
			"failed", len(failed), "events", d.events, "err", failed[0].err)
		_ = d.msg.NakWithDelay(i.cfg.RetryDelay)
		return
	}
	for _, it := range failed {
		again, err := i.deadLetterEvent(ctx, it, md, it.err)
		if err != nil {
			i.log.Error("dead-lettering failed: will be redelivered", "relay", relay, "err", err)
			_ = d.msg.NakWithDelay(i.cfg.RetryDelay)
			return
		}
		if !again {
			i.m.incDeadLettered("store-error")
			i.log.Error("event dead-lettered", "relay", relay, "subject", d.msg.Subject(), "index", it.index,
				"deliveries", md.NumDelivered, "err", it.err)
		}
	}
	d.settled += len(failed)
	if d.settled < d.events {
		// Not every other event was settled (cannot happen: settle decides
		// the whole batch first); its redelivery finds the dead-lettered
		// ones dropped as duplicates by the dead-letter stream.
		_ = d.msg.NakWithDelay(i.cfg.RetryDelay)
		return
	}
	_ = d.msg.Ack() // removes it from the work queue
}

// deadLetterEvent copies one event of a batch message to the dead-letter
// subject, in the one-event format with the message's headers, so an
// operator replays it like any dead letter. Its Nats-Msg-Id names the
// stream message and the event's place in it: dead-lettered once however
// often the message is redelivered (again reports a repeat).
func (i *Ingester) deadLetterEvent(ctx context.Context, it *item, md *jetstream.MsgMetadata, cause error) (again bool, err error) {
	out := nats.NewMsg(i.bus.Names.DeadLetterSubject())
	out.Data = it.data
	for k, v := range it.msg.Headers() {
		if k != bus.HeaderEvents {
			out.Header[k] = v
		}
	}
	out.Header.Set(HeaderDeadReason, cause.Error())
	out.Header.Set(HeaderDeadSubject, it.msg.Subject())
	out.Header.Set(HeaderDeadDeliveries, strconv.FormatUint(md.NumDelivered, 10))
	out.Header.Set(nats.MsgIdHdr, md.Stream+":"+strconv.FormatUint(md.Sequence.Stream, 10)+":"+strconv.Itoa(it.index))
	ack, err := i.bus.JS.PublishMsg(ctx, out)
	if err != nil {
		return false, fmt.Errorf("publish to %s: %w", i.bus.Names.DeadLetterSubject(), err)
	}
	return ack.Duplicate, nil
}

// failed handles a message whose processing failed while the store answers
// probes: the failure is the message's own, so it is redelivered after
// RetryDelay, and after MaxDeliver deliveries dead-lettered.
func (i *Ingester) failed(ctx context.Context, msg jetstream.Msg, cause error) {
	relay := msg.Headers().Get(bus.HeaderRelay)
	md, err := msg.Metadata()
	if err == nil && md.NumDelivered >= uint64(i.cfg.MaxDeliver) {
		again, err := i.deadLetter(ctx, msg, md, cause)
		if err != nil {
			i.log.Error("dead-lettering failed: will be redelivered", "relay", relay, "err", err)
			_ = msg.NakWithDelay(i.cfg.RetryDelay)
			return
		}
		if again {
			// Redelivered (its AckWait ran out) before the ack of its
			// dead-lettering reached the server: the stream kept the first
			// dead letter, and the counter counts messages, not attempts.
			i.log.Debug("message already dead-lettered", "relay", relay, "subject", msg.Subject(), "deliveries", md.NumDelivered)
			_ = msg.Ack()
			return
		}
		i.m.incDeadLettered("store-error")
		i.log.Error("message dead-lettered", "relay", relay, "subject", msg.Subject(),
			"deliveries", md.NumDelivered, "err", cause)
		_ = msg.Ack() // removes it from the work queue
		return
	}
	i.log.Warn("event failed, will be redelivered", "relay", relay, "subject", msg.Subject(), "err", cause)
	_ = msg.NakWithDelay(i.cfg.RetryDelay)
}

// setupDeadLetter creates (or updates) the dead-letter stream with the
// events stream's replication.
func (i *Ingester) setupDeadLetter(ctx context.Context) error {
	replicas := 1
	if s, err := i.bus.JS.Stream(ctx, i.bus.Names.EventsStream()); err == nil {
		replicas = s.CachedInfo().Config.Replicas
	}
	// EnsureStream: ingesters starting together in a cluster race on this
	// create, and a lost answer must not end the process.
	_, err := bus.EnsureStream(ctx, i.bus.JS, jetstream.StreamConfig{
		Name:        i.bus.Names.DeadLetterStream(),
		Subjects:    []string{i.bus.Names.DeadLetterSubject()},
		Description: "events the ingesters gave up on after MaxDeliver failures (reason in Grasp-Dead-Reason)",
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      7 * 24 * time.Hour,
		MaxBytes:    256 << 20,
		Discard:     jetstream.DiscardOld,
		Replicas:    max(1, replicas),
		// Longer than a redelivery takes, so a message dead-lettered twice
		// (see deadLetter) is stored once.
		Duplicates: max(2*time.Minute, 2*i.cfg.AckWait),
	})
	return err
}

// deadLetter copies a message, headers included, to the dead-letter subject
// with why it was given up. again reports that this stream message was
// dead-lettered before (the dead-letter stream dropped the copy as a
// duplicate).
func (i *Ingester) deadLetter(ctx context.Context, msg jetstream.Msg, md *jetstream.MsgMetadata, cause error) (again bool, err error) {
	out := nats.NewMsg(i.bus.Names.DeadLetterSubject())
	out.Data = msg.Data()
	for k, v := range msg.Headers() {
		out.Header[k] = v
	}
	out.Header.Set(HeaderDeadReason, cause.Error())
	out.Header.Set(HeaderDeadSubject, msg.Subject())
	out.Header.Set(HeaderDeadDeliveries, strconv.FormatUint(md.NumDelivered, 10))
	// One stream message, one dead letter: a redelivery that fails again
	// before the ack of the first dead-lettering lands is dropped by the
	// dead-letter stream's de-duplication. (What the original Nats-Msg-Id
	// named, the event's id and a digest of its signature (bus.EventMsgID),
	// is in the data.)
	out.Header.Set(nats.MsgIdHdr, md.Stream+":"+strconv.FormatUint(md.Sequence.Stream, 10))
	ack, err := i.bus.JS.PublishMsg(ctx, out)
	if err != nil {
		return false, fmt.Errorf("publish to %s: %w", i.bus.Names.DeadLetterSubject(), err)
	}
	return ack.Duplicate, nil
}

// outageState tracks whether this replica is in a store outage, so the
// transition is logged once, not per message.
type outageState struct {
	mu sync.Mutex
	on bool
}

func (o *outageState) begin() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	was := o.on
	o.on = true
	return !was
}

func (o *outageState) end() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	was := o.on
	o.on = false
	return was
}
