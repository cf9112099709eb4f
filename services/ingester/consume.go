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
	"github.com/grasp-sync/grasp-sync/pkg/policy"
	"github.com/grasp-sync/grasp-sync/pkg/rejected"
	"github.com/grasp-sync/grasp-sync/pkg/store"
)

// Headers the ingester reads or writes.
const (
	// HeaderFetchedAt is when the fetcher received the event (Unix
	// nanoseconds, decimal). Optional: without it the stream's timestamp
	// starts the fetch → stored latency.
	HeaderFetchedAt = "Grasp-Fetched-At"
	// HeaderDeadReason carries why a message was dead-lettered.
	HeaderDeadReason = "Grasp-Dead-Reason"
	// HeaderDeadSubject is the subject the dead-lettered message came from.
	HeaderDeadSubject = "Grasp-Dead-Subject"
	// HeaderDeadDeliveries is how often it was delivered before giving up.
	HeaderDeadDeliveries = "Grasp-Dead-Deliveries"
)

// outageBackoffStart is the first wait between store probes in an outage.
const outageBackoffStart = 50 * time.Millisecond

// verdict is what one evaluated event calls for.
type verdict int

const (
	verdictStore     verdict = iota // accepted: store and publish it
	verdictDuplicate                // already stored: ack
	verdictPark                     // refused for something missing: park it
	verdictRefuse                   // refused for good: count and ack
	verdictRetry                    // the store could not be read: infrastructure failure
)

// judge maps a policy decision to what the ingester does with the message.
func judge(d policy.Decision) verdict {
	switch {
	case d.Accept:
		return verdictStore
	case d.Reason == policy.ReasonStoreError:
		return verdictRetry
	case d.Reason == policy.ReasonDuplicate:
		return verdictDuplicate
	case d.Parkable():
		return verdictPark
	default:
		return verdictRefuse
	}
}

// verified reports whether a decision with this reason was reached after the
// id and the signature checked out (policy.Evaluate checks integrity first;
// size and shape refusals come before the signature check).
func verified(r policy.Reason) bool {
	switch r {
	case policy.ReasonBadID, policy.ReasonBadSignature, policy.ReasonMalformed, policy.ReasonTooLarge,
		policy.ReasonTooManyTags, policy.ReasonFuture, policy.ReasonExpired:
		return false
	}
	return true
}

// consume attaches to the shared durable consumer and feeds its messages to
// Workers evaluation workers until ctx is done. The iterator pulls FetchBatch
// messages at a time, so one replica holds a bounded number of messages
// (and bytes: each is at most the NATS max payload) whatever the backlog.
func (i *Ingester) consume(ctx context.Context) error {
	cons, err := i.bus.JS.CreateOrUpdateConsumer(ctx, i.bus.Names.EventsStream(), jetstream.ConsumerConfig{
		Durable:       i.cfg.Consumer,
		Description:   "ingesters: verify, decide, store (shared by every replica)",
		FilterSubject: i.bus.Names.EventsSubjects(),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       i.cfg.AckWait,
		// The ingester counts deliveries itself and dead-letters at
		// MaxDeliver: the server's own limit would leave the message in the
		// work-queue stream, undeliverable, forever.
		MaxDeliver:    -1,
		MaxAckPending: max(1024, 4*i.cfg.FetchBatch),
	})
	if err != nil {
		return fmt.Errorf("consumer %s on %s: %w", i.cfg.Consumer, i.bus.Names.EventsStream(), err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(i.cfg.FetchBatch))
	if err != nil {
		return fmt.Errorf("consume %s: %w", i.cfg.Consumer, err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()

	// A short queue: messages wait in the iterator's buffer (one pull)
	// rather than here, so a replica holds about FetchBatch+2×Workers
	// messages and none waits long enough to be redelivered needlessly.
	jobs := make(chan jetstream.Msg, i.cfg.Workers)
	var wg sync.WaitGroup
	for range i.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for msg := range jobs {
				i.handle(ctx, msg)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		i.watchLag(ctx, cons)
	}()
	defer wg.Wait()
	defer close(jobs)

	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			if errors.Is(err, nats.ErrConnectionClosed) {
				return fmt.Errorf("consume %s: %w", i.cfg.Consumer, err)
			}
			i.log.Warn("consumer fetch failed", "consumer", i.cfg.Consumer, "err", err)
			select { // do not spin on a persistent error
			case <-ctx.Done():
				return nil
			case <-i.clk.After(100 * time.Millisecond):
			}
			continue
		}
		select {
		case jobs <- msg:
		case <-ctx.Done():
			// Not acked: redelivered to another replica after AckWait.
			return nil
		}
	}
}

// handle processes one message to its end: ack once the event is stored or
// definitively refused; during a store outage hold it (telling the server it
// is in progress) and retry with backoff; otherwise redeliver it later or,
// after MaxDeliver deliveries, dead-letter it.
func (i *Ingester) handle(ctx context.Context, msg jetstream.Msg) {
	i.m.incConsumed()
	relay := msg.Headers().Get(bus.HeaderRelay)
	wait := outageBackoffStart
	for {
		outcome, err := i.process(ctx, msg)
		if err == nil {
			if i.outage.end() {
				i.m.outage.Set(0)
				i.log.Info("store reachable again: resuming", "consumer", i.cfg.Consumer)
			}
			i.count(outcome, msg)
			if err := msg.Ack(); err != nil && ctx.Err() == nil {
				i.log.Warn("ack failed: the event will be redelivered and found a duplicate", "relay", relay, "err", err)
			}
			return
		}
		if ctx.Err() != nil {
			_ = msg.Nak() // another replica takes it at once
			return
		}
		if i.storeReachable(ctx) {
			i.failed(ctx, msg, err)
			return
		}
		if i.outage.begin() {
			i.m.outage.Set(1)
			i.log.Warn("store unreachable: holding messages and backing off", "consumer", i.cfg.Consumer, "err", err)
		}
		// Held, not nak'ed: a redelivery would count against MaxDeliver
		// and only meet the same outage.
		_ = msg.InProgress()
		select {
		case <-ctx.Done():
			_ = msg.Nak()
			return
		case <-i.clk.After(wait):
		}
		wait = min(2*wait, i.cfg.OutageBackoffMax, i.cfg.AckWait/2)
	}
}

// process evaluates one message's event and does what the decision calls
// for. It returns the outcome to count, or an infrastructure error (the
// message is then retried; every step is idempotent).
func (i *Ingester) process(ctx context.Context, msg jetstream.Msg) (string, error) {
	evt, err := decode(msg.Data())
	if err != nil {
		i.log.Debug("malformed event", "relay", msg.Headers().Get(bus.HeaderRelay), "err", err)
		return outcomeMalformed, nil
	}
	if evt.Kind == 5 {
		i.deletions.Lock()
		defer i.deletions.Unlock()
	} else {
		i.deletions.RLock()
		defer i.deletions.RUnlock()
	}
	d := i.policy.Evaluate(ctx, evt)
	relay := msg.Headers().Get(bus.HeaderRelay)
	switch judge(d) {
	case verdictRetry:
		return "", fmt.Errorf("evaluate %s: %w", evt.ID, d.Err)
	case verdictDuplicate:
		if evt.Kind == 5 {
			// A stored deletion whose application failed before is applied
			// again on redelivery (idempotent).
			if err := i.applyDeletion(ctx, evt); err != nil {
				return "", err
			}
		}
		if md, err := msg.Metadata(); err == nil && md.NumDelivered > 1 {
			// A redelivery: an earlier attempt may have stored the event
			// and died before the wake loop saw it, leaving its dependents
			// parked. Waking them again is idempotent.
			if err := i.wakeFor(ctx, evt); err != nil {
				return "", err
			}
		}
		return outcomeDuplicate, nil
	case verdictPark:
		if err := i.park(ctx, evt, d, relay); err != nil {
			return "", err
		}
		return outcomeParked, nil
	case verdictRefuse:
		i.log.Debug("event refused", "id", evt.ID, "kind", evt.Kind, "reason", string(d.Reason), "relay", relay)
		i.remember(ctx, evt, d.Reason, relay)
		return string(d.Reason), nil
	}
	stored, err := i.storeAccepted(ctx, evt, msg.Data())
	switch {
	case errors.Is(err, store.ErrUnstorable):
		i.log.Debug("accepted event cannot be stored", "id", evt.ID, "kind", evt.Kind, "relay", relay, "err", err)
		return outcomeUnstorable, nil
	case err != nil:
		return "", err
	case !stored:
		return outcomeDuplicate, nil
	}
	return outcomeStored, nil
}

// count records the outcome of one acked message.
func (i *Ingester) count(outcome string, msg jetstream.Msg) {
	if outcome != outcomeMalformed && verified(policy.Reason(outcome)) {
		i.m.incVerified()
	}
	switch outcome {
	case outcomeStored:
		i.m.storedAfter(i.clk.Now().Sub(fetchedAt(msg)))
	case outcomeDuplicate:
		i.m.incDuplicate()
	case outcomeParked:
		i.m.incParked()
	default:
		i.m.incRefused(outcome)
	}
}

// fetchedAt is when the fetcher received the message's event: its
// HeaderFetchedAt, else the stream's timestamp.
func fetchedAt(msg jetstream.Msg) time.Time {
	if v := msg.Headers().Get(HeaderFetchedAt); v != "" {
		if ns, err := strconv.ParseInt(v, 10, 64); err == nil {
			return time.Unix(0, ns)
		}
	}
	if md, err := msg.Metadata(); err == nil {
		return md.Timestamp
	}
	return time.Time{}
}

// storeReachable probes the store with a lookup that finds nothing.
func (i *Ingester) storeReachable(ctx context.Context) bool {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := i.store.Query(pctx, nostr.Filter{IDs: []string{probeID}, Limit: 1})
	return err == nil
}

// probeID is an id no event has (no one knows a preimage of it).
const probeID = "0000000000000000000000000000000000000000000000000000000000000000"

// failed handles a message whose processing failed while the store answers
// probes: the failure is the message's own, so it is redelivered after
// RetryDelay, and after MaxDeliver deliveries dead-lettered.
func (i *Ingester) failed(ctx context.Context, msg jetstream.Msg, cause error) {
	relay := msg.Headers().Get(bus.HeaderRelay)
	md, err := msg.Metadata()
	if err == nil && md.NumDelivered >= uint64(i.cfg.MaxDeliver) {
		if err := i.deadLetter(ctx, msg, md.NumDelivered, cause); err != nil {
			i.log.Error("dead-lettering failed: will be redelivered", "relay", relay, "err", err)
			_ = msg.NakWithDelay(i.cfg.RetryDelay)
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
	_, err := i.bus.JS.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        i.bus.Names.DeadLetterStream(),
		Subjects:    []string{i.bus.Names.DeadLetterSubject()},
		Description: "events the ingesters gave up on after MaxDeliver failures (reason in Grasp-Dead-Reason)",
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      7 * 24 * time.Hour,
		MaxBytes:    256 << 20,
		Discard:     jetstream.DiscardOld,
		Replicas:    max(1, replicas),
	})
	if err != nil {
		return fmt.Errorf("create stream %s: %w", i.bus.Names.DeadLetterStream(), err)
	}
	return nil
}

// deadLetter copies a message, headers included, to the dead-letter subject
// with why it was given up.
func (i *Ingester) deadLetter(ctx context.Context, msg jetstream.Msg, deliveries uint64, cause error) error {
	out := nats.NewMsg(i.bus.Names.DeadLetterSubject())
	out.Data = msg.Data()
	for k, v := range msg.Headers() {
		out.Header[k] = v
	}
	out.Header.Set(HeaderDeadReason, cause.Error())
	out.Header.Set(HeaderDeadSubject, msg.Subject())
	out.Header.Set(HeaderDeadDeliveries, strconv.FormatUint(deliveries, 10))
	if _, err := i.bus.JS.PublishMsg(ctx, out); err != nil {
		return fmt.Errorf("publish to %s: %w", i.bus.Names.DeadLetterSubject(), err)
	}
	return nil
}

// watchLag refreshes the consumer lag gauges every LagInterval.
func (i *Ingester) watchLag(ctx context.Context, cons jetstream.Consumer) {
	for {
		if info, err := cons.Info(ctx); err == nil {
			i.m.pending.Set(float64(info.NumPending))
			i.m.ackPending.Set(float64(info.NumAckPending))
		} else if ctx.Err() == nil {
			i.log.Debug("consumer info failed", "consumer", i.cfg.Consumer, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-i.clk.After(i.cfg.LagInterval):
		}
	}
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

// rememberable reports whether a refusal holds for every copy of the event
// and for good, so fetchers may count the event as held (pkg/rejected) and
// not fetch it again: not forgeries (a forged copy must not hide the real
// event), not "future" (time makes it acceptable), not refusals that depend
// on announcements that may still change (not-listed, not-maintainer).
func rememberable(r policy.Reason) bool {
	switch r {
	case policy.ReasonTooLarge, policy.ReasonTooManyTags, policy.ReasonMalformed, policy.ReasonExpired,
		policy.ReasonDeleted, policy.ReasonDeleteOthers, policy.ReasonBadIdentifier, policy.ReasonOlderVersion:
		return true
	}
	return false
}

// remember records a refusal for good in the rejected-events bucket. Best
// effort: a lost record only means the event may be fetched (and refused)
// again at the next resync.
func (i *Ingester) remember(ctx context.Context, evt *nostr.Event, r policy.Reason, relay string) {
	if i.rejected == nil || !rememberable(r) {
		return
	}
	if err := rejected.Add(ctx, i.rejected, evt, string(r)); err != nil && ctx.Err() == nil {
		i.log.Warn("recording a refused event failed", "id", evt.ID, "reason", string(r), "relay", relay, "err", err)
	}
}
