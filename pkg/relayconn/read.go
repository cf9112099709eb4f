package relayconn

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/mailru/easyjson"
	"github.com/nbd-wtf/go-nostr"
	"github.com/tidwall/gjson"

	"github.com/grasp-sync/grasp-sync/pkg/relaylimits"
)

// readLoop reads the relay's messages and dispatches each, until the
// connection ends; then it ends every subscription and channel.
func (c *Conn) readLoop() {
	defer c.loops.Done()
	defer func() {
		c.mu.Lock()
		for _, s := range c.subs {
			s.end()
		}
		for _, ch := range c.channels {
			ch.end()
		}
		c.subs = map[string]*Subscription{}
		c.channels = map[string]*Channel{}
		c.mu.Unlock()
	}()
	for {
		_, r, err := c.ws.Reader(c.ctx)
		if err != nil {
			c.cancel(fmt.Errorf("read from %s: %w", c.url, err))
			return
		}
		// A buffer holds the message only while it is dispatched (an
		// EVENT is decoded into fresh strings, anything handed on is
		// copied), so a connection waiting for its next message holds
		// none: kept per connection they were ~7 MB of the upper world's
		// heap at rest, 500 relays that mostly send nothing
		// (docs/measurements/2026-12-06-issue32-lease-renewals.md).
		buf := readBufs.Get().(*bytes.Buffer)
		if _, err := buf.ReadFrom(r); err != nil {
			putReadBuf(buf)
			c.cancel(fmt.Errorf("read from %s: %w", c.url, err))
			return
		}
		data := buf.Bytes()
		c.BytesIn.Add(uint64(len(data)))
		if !c.heard.Load() {
			c.heard.Store(true)
		}
		c.dispatch(data)
		putReadBuf(buf)
	}
}

// readBufs are the buffers messages are read into, shared by every
// connection.
var readBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// readBufKeep is the largest read buffer returned to readBufs: one grown
// past it by a large message is dropped.
const readBufKeep = 64 << 10

func putReadBuf(b *bytes.Buffer) {
	if b.Cap() > readBufKeep {
		return
	}
	b.Reset()
	readBufs.Put(b)
}

// errBadEvent is an EVENT message that is not ["EVENT", id, {event}].
var errBadEvent = errors.New("malformed EVENT message")

// decodeEvent decodes the event of ["EVENT", subscription id, {event}]
// (exactly three elements, as go-nostr's EventEnvelope requires) without
// copying the message or building its array. data may be reused after it
// returns: easyjson copies every string it decodes.
func decodeEvent(data []byte) (*nostr.Event, error) {
	var obj gjson.Result
	n := 0
	gjson.Parse(unsafe.String(unsafe.SliceData(data), len(data))).ForEach(func(_, v gjson.Result) bool {
		if n == 2 {
			obj = v
		}
		n++
		return n <= 3
	})
	if n != 3 || !obj.IsObject() {
		return nil, errBadEvent
	}
	raw := []byte(nil)
	if obj.Index > 0 && obj.Index+len(obj.Raw) <= len(data) && string(data[obj.Index:obj.Index+len(obj.Raw)]) == obj.Raw {
		raw = data[obj.Index : obj.Index+len(obj.Raw)]
	} else {
		raw = []byte(obj.Raw) // the offset is unknown: copy
	}
	evt := new(nostr.Event)
	if err := easyjson.Unmarshal(raw, evt); err != nil {
		return nil, fmt.Errorf("%w: %w", errBadEvent, err)
	}
	return evt, nil
}

func (c *Conn) dispatch(data []byte) {
	label, subID, ok := peek(data)
	if !ok {
		c.malformed.Add(1)
		return
	}
	switch label {
	case "EVENT", "EOSE", "CLOSED":
		c.mu.Lock()
		s := c.subs[subID]
		if s != nil {
			delete(c.unanswered, s) // answered
		}
		c.mu.Unlock()
		if s == nil {
			return
		}
		s.bytes.Add(uint64(len(data)))
		switch label {
		case "EVENT":
			evt, err := decodeEvent(data)
			if err != nil {
				s.malformed.Add(1)
				return
			}
			if s.hd != nil {
				c.enqueue(s, delivery{evt: evt})
				return
			}
			deliver(c, s.events, evt, s.done)
		case "EOSE":
			s.eoseOnce.Do(func() {
				close(s.eose)
				if s.hd != nil {
					c.enqueue(s, delivery{eose: true})
				}
			})
		case "CLOSED":
			reason := gjson.GetBytes(data, "2").String()
			c.refused(s, relaylimits.Classify(reason), reason)
		}
	case "NOTICE":
		msg := gjson.GetBytes(data, "1").String()
		if r := relaylimits.Classify(msg); r.IsLimit() {
			// strfry and nostr-rs-relay refuse a subscription over their
			// count with a NOTICE naming none, and never answer it:
			// without this it would wait for an EOSE that never comes.
			// strfry's NIP-77 sessions are counted apart and refused in
			// their own words: those refuse a NEG-OPEN, not a REQ.
			if r == relaylimits.TooManySubscriptions && !relaylimits.SaysNegentropy(msg) {
				c.resendUnanswered(msg)
			} else {
				open := c.gate.inUse()
				if r == relaylimits.TooManySubscriptions {
					c.gate.lower(open - 1)
				}
				if c.opts.OnLimit != nil {
					c.opts.OnLimit(r, msg, open, 0, c.MaxWritten())
				}
			}
		}
		c.mu.Lock()
		for w := range c.watchers {
			select {
			case w.ch <- msg:
			default: // notices are advisory: a full watcher misses some
			}
		}
		c.mu.Unlock()
		if c.opts.OnNotice != nil {
			c.opts.OnNotice(msg)
		}
	default:
		c.mu.Lock()
		ch := c.channels[subID]
		c.mu.Unlock()
		if ch != nil && subID != "" {
			ch.bytes.Add(uint64(len(data)))
			m := Message{Label: label, Raw: bytes.Clone(data)}
			deliver(c, ch.msgs, m, ch.done)
			return
		}
		if c.opts.OnMessage != nil {
			c.opts.OnMessage(label, bytes.Clone(data))
		}
	}
}

// peek reads the label and, when it is a string, the second element of a
// relay message without decoding the rest. ok is false when the message is
// not a JSON array starting with a string label.
func peek(data []byte) (label, second string, ok bool) {
	if !gjson.ValidBytes(data) {
		return "", "", false
	}
	first := gjson.GetBytes(data, "0")
	if first.Type != gjson.String {
		return "", "", false
	}
	return first.String(), gjson.GetBytes(data, "1").String(), true
}
