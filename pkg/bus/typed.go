package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
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

// Consume attaches to (creating if needed) a durable pull consumer with
// explicit acks and runs handle for each message, one at a time, until ctx is
// done. Processing in order keeps per-relay ordering of commands and reports.
func (b *Bus) Consume(ctx context.Context, cfg ConsumeConfig, handle Handler) error {
	cc := cfg.Consumer
	cc.AckPolicy = jetstream.AckExplicitPolicy
	cons, err := b.JS.CreateOrUpdateConsumer(ctx, cfg.Stream, cc)
	if err != nil {
		return fmt.Errorf("consumer %s on %s: %w", cc.Durable, cfg.Stream, err)
	}
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	delay := cfg.RetryDelay
	if delay == 0 {
		delay = time.Second
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(256))
	if err != nil {
		return fmt.Errorf("consume %s on %s: %w", cc.Durable, cfg.Stream, err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return ctx.Err()
			}
			log.Warn("consumer fetch failed", "stream", cfg.Stream, "consumer", cc.Durable, "err", err)
			continue
		}
		if err := handle(ctx, msg); err != nil {
			if errors.Is(err, ErrPermanent) {
				log.Warn("message terminated", "subject", msg.Subject(), "err", err)
				_ = msg.Term()
				continue
			}
			if ctx.Err() != nil {
				_ = msg.Nak()
				return ctx.Err()
			}
			log.Warn("message will be redelivered", "subject", msg.Subject(), "err", err)
			_ = msg.NakWithDelay(delay)
			continue
		}
		_ = msg.Ack()
	}
}

// EventMsgID is the Nats-Msg-Id of an event on EventsSubject: its id and
// signature. The same event fetched from many relays carries the same
// signature and is ingested once; a forged copy (same id, another
// signature) that a hostile relay sends first cannot make the stream drop
// the genuine event as a duplicate for the whole dedup window.
func EventMsgID(id, sig string) string { return id + ":" + sig }
