package bus

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/grasp-sync/grasp-sync/pkg/clock"
)

// HeaderType names the protobuf message type of a control message (its full
// name, e.g. "grasp.v1.FetchCommand"), so `graspctl tap` can decode any
// subject without knowing it in advance.
const HeaderType = "Grasp-Type"

// Headers carried by events on EventsSubject.
const (
	HeaderRelay   = "Grasp-Relay"
	HeaderSession = "Grasp-Session"
	HeaderBatch   = "Grasp-Batch"
	HeaderMode    = "Grasp-Mode" // "live" or "historic"
	// HeaderOrigin names the writer instance on StoredSubject messages, so a
	// relay does not re-broadcast what it stored itself.
	HeaderOrigin = "Grasp-Origin"
)

// TypeName is the HeaderType value for a message.
func TypeName(m proto.Message) string { return string(m.ProtoReflect().Descriptor().FullName()) }

// NewMsg builds a NATS message carrying a protobuf control message.
func NewMsg(subject string, m proto.Message) (*nats.Msg, error) {
	data, err := proto.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("marshal %s: %w", TypeName(m), err)
	}
	msg := nats.NewMsg(subject)
	msg.Data = data
	msg.Header.Set(HeaderType, TypeName(m))
	return msg, nil
}

// Publish sends a control message to a stream subject and waits for the
// stream's acknowledgement.
func (b *Bus) Publish(ctx context.Context, subject string, m proto.Message) error {
	msg, err := NewMsg(subject, m)
	if err != nil {
		return err
	}
	if _, err := b.JS.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("publish %s to %s: %w", TypeName(m), subject, err)
	}
	return nil
}

// Decode unmarshals a control message, checking its Grasp-Type header.
func Decode(data []byte, header nats.Header, into proto.Message) error {
	if got, want := header.Get(HeaderType), TypeName(into); got != "" && got != want {
		return fmt.Errorf("message type %q, want %q", got, want)
	}
	if err := proto.Unmarshal(data, into); err != nil {
		return fmt.Errorf("unmarshal %s: %w", TypeName(into), err)
	}
	return nil
}

// ErrPermanent marks a handler error that retrying cannot fix: the message
// is terminated instead of redelivered.
var ErrPermanent = errors.New("permanent")

// Handler processes one message. Returning nil acks it; an error wrapping
// ErrPermanent terminates it; any other error naks it for redelivery later.
type Handler func(ctx context.Context, msg jetstream.Msg) error

// ConsumeConfig says which durable consumer to attach to.
type ConsumeConfig struct {
	Stream   string
	Consumer jetstream.ConsumerConfig
	// RetryDelay is how long a failed message waits before redelivery.
	RetryDelay time.Duration
	Log        *slog.Logger
}

// PullHeartbeat is the idle heartbeat every pull consumer asks for: two
// missed in a row renew a pull that was lost (see Consume).
const PullHeartbeat = 2 * time.Second

// InProcessPullHeartbeat is the idle heartbeat of a pull consumer on a
// connection to a server in this process (ConnectInProcess: graspd's
// embedded NATS). A pull is lost when the consumer is not yet reachable
// from the node the client is connected to, which needs a cluster; a single
// server in the process has none, and the heartbeats every 2 s of ~20 idle
// consumers were ~10 of the ~16 messages a second graspd's NATS carried at
// rest (docs/measurements/2026-12-06-issue32-lease-renewals.md). 15 s is
// the most nats.go allows with its default 30 s pull expiry.
const InProcessPullHeartbeat = 15 * time.Second

// PullHeartbeatInterval is the idle heartbeat b's pull consumers ask for:
// PullHeartbeat, or InProcessPullHeartbeat in process.
func (b *Bus) PullHeartbeatInterval() time.Duration {
	if b.inProcess {
		return InProcessPullHeartbeat
	}
	return PullHeartbeat
}

// Consume attaches to (creating if needed) a durable pull consumer with
// explicit acks and runs handle for each message, one at a time, until ctx is
// done. Processing in order keeps per-relay ordering of commands and reports.
//
// It returns ctx's error when ctx ends, and an error when the consumer
// cannot be created or stops under it (deleted, its stream recreated, the
// iterator closed): the caller decides whether to attach again, see
// ConsumeRestarting. It never returns nil while ctx is alive, so a caller
// cannot mistake a dead consumer for a finished one.
func (b *Bus) Consume(ctx context.Context, cfg ConsumeConfig, handle Handler) error {
	return b.ConsumeBatches(ctx, cfg, 1, func(ctx context.Context, msgs []jetstream.Msg) error {
		return handle(ctx, msgs[0])
	})
}

// BatchHandler processes messages that were waiting together, in the
// stream's order. Returning nil acks them all; an error wrapping
// ErrPermanent terminates them all; any other error naks them all for
// redelivery later.
type BatchHandler func(ctx context.Context, msgs []jetstream.Msg) error

// ConsumeBatches is Consume for a handler whose cost is per call rather
// than per message: each call gets the message the consumer delivered next
// and whatever else had already arrived behind it, up to maxBatch, so a
// backlog is handled in a few calls and a lone message is not held back
// waiting for company. The planner handles its reports this way: one flush
// of commands and relay records per batch of reports, where each flush is a
// round trip to every replica of a replicated stream
// (docs/decisions/0072-planner-reports-in-batches.md).
func (b *Bus) ConsumeBatches(ctx context.Context, cfg ConsumeConfig, maxBatch int, handle BatchHandler) error {
	maxBatch = max(maxBatch, 1)
	cc := cfg.Consumer
	cc.AckPolicy = jetstream.AckExplicitPolicy
	cons, err := EnsureConsumer(ctx, b.JS, cfg.Stream, cc)
	if err != nil {
		return err
	}
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	delay := cfg.RetryDelay
	if delay == 0 {
		delay = time.Second
	}
	// Missing heartbeats are reported so that a consumer that vanished
	// without a "consumer deleted" notice (its stream lost or recreated
	// while we were disconnected) is noticed: pulls on it go nowhere.
	// They are also how a pull request that was lost gets renewed: in a
	// cluster, a consumer just created may not be reachable yet from the
	// node we are connected to, and nats.go swallows that pull's "no
	// responders" answer and waits for it until heartbeats are missed — by
	// default 2 × 15 s, during which nothing is delivered (a planner
	// starting in a cluster ignored every report for 30 s). A 2 s heartbeat
	// renews such a pull within about 4 s, at the cost of one heartbeat
	// message every 2 s per idle consumer (every 15 s in process, where
	// there is no cluster: InProcessPullHeartbeat).
	it, err := cons.Messages(jetstream.PullMaxMessages(256), jetstream.PullHeartbeat(b.PullHeartbeatInterval()),
		jetstream.WithMessagesErrOnMissingHeartbeat(true))
	if err != nil {
		return fmt.Errorf("consume %s on %s: %w", cc.Durable, cfg.Stream, err)
	}
	// The iterator's Next blocks, so a reader owned by this call hands its
	// results over a channel; what is already in the channel is what "had
	// arrived" means for a batch. The channel holds at most maxBatch, on top
	// of the iterator's own pull.
	type next struct {
		msg jetstream.Msg
		err error
	}
	results := make(chan next, maxBatch)
	quit := make(chan struct{})
	var reader sync.WaitGroup
	reader.Add(1)
	go func() {
		defer reader.Done()
		for {
			msg, err := it.Next()
			select {
			case results <- next{msg, err}:
			case <-quit:
				if msg != nil {
					_ = msg.Nak()
				}
				return
			}
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return
			}
		}
	}()
	stop := context.AfterFunc(ctx, it.Stop)
	defer func() {
		stop()
		it.Stop()
		close(quit)
		reader.Wait()
		// Delivered to us and never handled: back to the stream now rather
		// than after the ack wait.
		for {
			select {
			case r := <-results:
				if r.msg != nil {
					_ = r.msg.Nak()
				}
			default:
				return
			}
		}
	}()

	var held *next // an error met while gathering a batch, handled next
	batch := make([]jetstream.Msg, 0, maxBatch)
	for {
		var r next
		if held != nil {
			r, held = *held, nil
		} else {
			select {
			case r = <-results:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if r.err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			err := r.err
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || errors.Is(err, jetstream.ErrConsumerDeleted) ||
				errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrBadRequest) {
				return fmt.Errorf("consumer %s on %s stopped: %w", cc.Durable, cfg.Stream, err)
			}
			if errors.Is(err, jetstream.ErrNoHeartbeat) {
				// Silence is normal while the connection is down or the
				// consumer's leader moves; a consumer the server no longer
				// has is not.
				ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, ierr := cons.Info(ictx)
				cancel()
				if errors.Is(ierr, jetstream.ErrConsumerNotFound) || errors.Is(ierr, jetstream.ErrStreamNotFound) {
					return fmt.Errorf("consumer %s on %s is gone: %w", cc.Durable, cfg.Stream, ierr)
				}
			}
			log.Warn("consumer fetch failed", "stream", cfg.Stream, "consumer", cc.Durable, "err", err)
			continue
		}
		batch = append(batch[:0], r.msg)
	gather:
		for len(batch) < maxBatch {
			select {
			case more := <-results:
				if more.err != nil {
					held = &more
					break gather
				}
				batch = append(batch, more.msg)
			default:
				break gather
			}
		}
		if err := handle(ctx, batch); err != nil {
			if errors.Is(err, ErrPermanent) {
				log.Warn("messages terminated", "subject", batch[0].Subject(), "messages", len(batch), "err", err)
				for _, m := range batch {
					_ = m.Term()
				}
				continue
			}
			if ctx.Err() != nil {
				for _, m := range batch {
					_ = m.Nak()
				}
				return ctx.Err()
			}
			log.Warn("messages will be redelivered", "subject", batch[0].Subject(), "messages", len(batch), "err", err)
			for _, m := range batch {
				_ = m.NakWithDelay(delay)
			}
			continue
		}
		for _, m := range batch {
			_ = m.Ack()
		}
	}
}

// RestartBackoff shapes ConsumeRestarting's waits between attachments.
type RestartBackoff struct {
	// Min is the first wait; each failure in a row doubles it up to Max.
	// A consumer that ran for at least Max before failing starts again
	// from Min.
	Min, Max time.Duration
}

// ConsumeRestarting runs Consume until ctx is done, attaching again with
// backoff whenever the consumer cannot be created or stops (a NATS node
// lost, the stream recreated). A service that holds work by lease — a shard
// — must use it: a held lease whose consumer stopped for good means nobody
// handles that work, and no other replica takes it over. It returns only
// ctx's error.
func (b *Bus) ConsumeRestarting(ctx context.Context, clk clock.Clock, bo RestartBackoff, cfg ConsumeConfig, handle Handler) error {
	if bo.Min <= 0 {
		bo.Min = 500 * time.Millisecond
	}
	if bo.Max < bo.Min {
		bo.Max = max(bo.Min, 30*time.Second)
	}
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	wait := bo.Min
	for {
		started := clk.Now()
		err := b.Consume(ctx, cfg, handle)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if clk.Now().Sub(started) >= bo.Max {
			wait = bo.Min
		}
		// A stop is expected when a NATS node fails over, and the retry
		// usually succeeds: a warning. One that keeps failing until the
		// backoff is at its longest is an error an operator must see.
		level := slog.LevelWarn
		if wait >= bo.Max {
			level = slog.LevelError
		}
		log.Log(ctx, level, "consumer stopped; attaching again", "stream", cfg.Stream, "consumer", cfg.Consumer.Durable,
			"retry_in", wait, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-clk.After(wait):
		}
		wait = min(2*wait, bo.Max)
	}
}

// EventMsgID is the Nats-Msg-Id of an event on EventsSubject: its id and a
// digest of its signature (the first 128 bits of its SHA-256, base64url).
// The same event fetched from many relays carries the same signature and is
// ingested once; a forged copy (same id, another signature) that a hostile
// relay sends first cannot make the stream drop the genuine event as a
// duplicate for the whole dedup window: that would take a second preimage
// of the digest. A digest, not the 128-digit signature: the stream holds
// every id of its 2-minute window in memory (and each message carries it),
// ~300 bytes an entry with the signature, ~110 with the digest
// (docs/measurements/2026-12-04-design-scale-memory.md).
func EventMsgID(id, sig string) string {
	d := sha256.Sum256([]byte(sig))
	return id + ":" + base64.RawURLEncoding.EncodeToString(d[:16])
}
