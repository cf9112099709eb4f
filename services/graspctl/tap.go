// Package graspctl is the operator's command line: it reads what the
// services say to each other on NATS and what they keep in KV.
package graspctl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	// Registers the grasp.v1 types Render looks up by Grasp-Type.
	_ "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
)

// Render turns one message into a line: control messages (Grasp-Type
// header) as protobuf JSON, anything else (nostr events) as it is.
func Render(subject string, header nats.Header, data []byte) string {
	typ := header.Get(bus.HeaderType)
	if typ == "" {
		return fmt.Sprintf("%s %s", subject, data)
	}
	m, err := decodeControl(typ, data)
	if err != nil {
		return fmt.Sprintf("%s [%s: %v] %x", subject, typ, err, data)
	}
	js, _ := protojson.MarshalOptions{}.Marshal(m)
	return fmt.Sprintf("%s %s %s", subject, typ, js)
}

func decodeControl(typ string, data []byte) (proto.Message, error) {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(typ))
	if err != nil {
		return nil, errors.New("unknown type")
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(data, m); err != nil {
		return nil, fmt.Errorf("undecodable: %w", err)
	}
	return m, nil
}

// TapFilter selects messages; zero fields match everything.
type TapFilter struct {
	// Relay keeps messages about this relay URL (Grasp-Relay header or a
	// relay_url field).
	Relay string
	// Repo keeps messages that mention this repository coordinate.
	Repo string
	// Kind keeps only nostr events of this kind (control messages dropped).
	Kind int
}

// TapLine is one tapped message as printed: control messages carry their
// protobuf type and decoded message, nostr events the event as it came.
type TapLine struct {
	Subject string          `json:"subject"`
	Type    string          `json:"type,omitempty"`
	Relay   string          `json:"relay,omitempty"`
	Message json.RawMessage `json:"message,omitempty"`
	Event   json.RawMessage `json:"event,omitempty"`
	Error   string          `json:"error,omitempty"`
}

// Line decodes a message into a TapLine, and says whether filter keeps it.
func Line(subject string, header nats.Header, data []byte, f TapFilter) (TapLine, bool) {
	l := TapLine{Subject: subject, Relay: header.Get(bus.HeaderRelay)}
	typ := header.Get(bus.HeaderType)
	var text string // what the relay and repo filters search
	if typ == "" {
		var probe struct {
			Kind int `json:"kind"`
		}
		if json.Valid(data) {
			l.Event = json.RawMessage(data)
			_ = json.Unmarshal(data, &probe)
		} else {
			l.Error = "not JSON"
			l.Message, _ = json.Marshal(string(data))
		}
		if f.Kind != 0 && probe.Kind != f.Kind {
			return l, false
		}
		text = string(data)
	} else {
		l.Type = typ
		m, err := decodeControl(typ, data)
		if err != nil {
			l.Error = err.Error()
		} else {
			l.Message, _ = protojson.MarshalOptions{}.Marshal(m)
			text = string(l.Message)
			if l.Relay == "" {
				if fd := m.ProtoReflect().Descriptor().Fields().ByName("relay_url"); fd != nil {
					l.Relay = m.ProtoReflect().Get(fd).String()
				}
			}
		}
	}
	if f.Kind != 0 && typ != "" {
		return l, false // a kind filter asks for nostr events only
	}
	if f.Relay != "" && l.Relay != f.Relay && !strings.Contains(text, f.Relay) {
		return l, false
	}
	if f.Repo != "" && !strings.Contains(text, f.Repo) {
		return l, false
	}
	return l, true
}

// Lines decodes a message into the TapLines filter keeps: one per event for
// a message carrying a batch of events (bus.HeaderEvents), so tap shows
// events one by one however they travel; else what Line gives.
func Lines(subject string, header nats.Header, data []byte, f TapFilter) []TapLine {
	if header.Get(bus.HeaderType) != "" || !bus.IsEventBatch(header) {
		if l, ok := Line(subject, header, data, f); ok {
			return []TapLine{l}
		}
		return nil
	}
	// Each event alone, with the batch's headers but the batch marker.
	h := nats.Header{}
	for k, v := range header {
		if k != bus.HeaderEvents {
			h[k] = v
		}
	}
	var out []TapLine
	for _, evt := range bus.SplitEvents(header, data) {
		if l, ok := Line(subject, h, evt, f); ok {
			out = append(out, l)
		}
	}
	return out
}

// TapOptions are graspctl tap's flags.
type TapOptions struct {
	Subjects []string
	Filter   TapFilter
	// Pretty indents each object for a human reader.
	Pretty bool
	// FromStart replays what the streams still hold before following live
	// traffic (work-queue streams hold only unacknowledged messages).
	FromStart bool
	// Ready, when set, is called once the subscriptions are in place on the
	// server: from then on no live message is missed.
	Ready func()
	// Errors receives warnings (streams that cannot be replayed).
	Errors io.Writer
}

// writeLine prints one TapLine as one JSON object per line (or indented).
func writeLine(out io.Writer, l TapLine, pretty bool) error {
	data, err := json.Marshal(l)
	if err != nil {
		return err
	}
	if pretty {
		var buf bytes.Buffer
		if json.Indent(&buf, data, "", "  ") == nil {
			data = buf.Bytes()
		}
	}
	_, err = fmt.Fprintf(out, "%s\n", data)
	return err
}

// Tap prints every message on the subjects (NATS wildcards allowed) until
// ctx is done. With FromStart it first replays the grasp streams' retained
// messages on those subjects, then follows live traffic.
func Tap(ctx context.Context, b *bus.Bus, opts TapOptions, out io.Writer) error {
	if len(opts.Subjects) == 0 {
		opts.Subjects = []string{b.Names.AllSubjects()}
	}
	// Bounded: a slow terminal makes NATS drop messages for this
	// subscription (reported as a slow consumer) instead of growing memory.
	ch := make(chan *nats.Msg, 4096)
	for _, s := range opts.Subjects {
		sub, err := b.Conn.ChanSubscribe(s, ch)
		if err != nil {
			return fmt.Errorf("subscribe %s: %w", s, err)
		}
		defer sub.Unsubscribe()
	}
	if err := b.Conn.FlushTimeout(5 * time.Second); err != nil {
		return fmt.Errorf("subscribe %v: %w", opts.Subjects, err)
	}
	if opts.Ready != nil {
		opts.Ready()
	}
	if opts.FromStart {
		if err := replay(ctx, b, opts, out); err != nil && ctx.Err() == nil {
			return err
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-ch:
			for _, l := range Lines(m.Subject, m.Header, m.Data, opts.Filter) {
				if err := writeLine(out, l, opts.Pretty); err != nil {
					return fmt.Errorf("write: %w", err)
				}
			}
		}
	}
}

// replayWait bounds the wait for the next retained message of a stream.
const replayWait = 2 * time.Second

// replay prints the retained messages of every grasp stream whose subjects
// match, through an ordered (ephemeral, ack-less) consumer per stream.
func replay(ctx context.Context, b *bus.Bus, opts TapOptions, out io.Writer) error {
	n := b.Names
	for _, stream := range []string{n.FetchCmdStream(), n.FetchReportStream(), n.EventsStream(), n.ParkedStream(), n.ParkedWakeStream()} {
		st, err := b.JS.Stream(ctx, stream)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("open stream %s: %w", stream, err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			return fmt.Errorf("stream %s: %w", stream, err)
		}
		if info.State.Msgs == 0 {
			continue
		}
		last := info.State.LastSeq
		cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
		if err != nil {
			if opts.Errors != nil {
				fmt.Fprintf(opts.Errors, "graspctl: cannot replay %s (%v); following live traffic only\n", stream, err)
			}
			continue
		}
		for {
			// Bounded wait: on a work-queue stream the last message may be
			// consumed (deleted) between Info and here.
			nctx, cancel := context.WithTimeout(ctx, replayWait)
			msg, err := cons.Next(jetstream.FetchContext(nctx))
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				if nctx.Err() != nil {
					break // nothing more retained
				}
				return fmt.Errorf("replay %s: %w", stream, err)
			}
			meta, _ := msg.Metadata()
			if matchesAny(opts.Subjects, msg.Subject()) {
				for _, l := range Lines(msg.Subject(), msg.Headers(), msg.Data(), opts.Filter) {
					if err := writeLine(out, l, opts.Pretty); err != nil {
						return fmt.Errorf("write: %w", err)
					}
				}
			}
			if meta == nil || meta.Sequence.Stream >= last {
				break
			}
		}
	}
	return nil
}

func matchesAny(patterns []string, subject string) bool {
	for _, p := range patterns {
		if SubjectMatches(p, subject) {
			return true
		}
	}
	return false
}

// SubjectMatches applies NATS wildcard rules: "*" matches one token, a final
// ">" one or more.
func SubjectMatches(pattern, subject string) bool {
	pt, st := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, p := range pt {
		if p == ">" {
			return len(st) > i
		}
		if i >= len(st) || (p != "*" && p != st[i]) {
			return false
		}
	}
	return len(pt) == len(st)
}
