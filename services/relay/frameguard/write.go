package frameguard

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nbd-wtf/go-nostr"
)

// The guard's server side (see conn.go): khatru's frames pass to the
// client, NEG-ERROR rewritten, and the guard's own answers go between
// khatru's messages.

// rewriteServerMessage turns khatru's non-standard NEG-ERROR into NIP-77's
// NEG-ERR with a prefixed reason, and reports CLOSED subscription ids. It
// returns msg itself when there is nothing to change.
func rewriteServerMessage(msg []byte) (out []byte, closedID string) {
	switch label(msg) {
	case "NEG-ERROR":
		var parts []string
		if err := json.Unmarshal(msg, &parts); err != nil || len(parts) < 2 {
			return bytes.Replace(msg, []byte(`"NEG-ERROR"`), []byte(`"NEG-ERR"`), 1), ""
		}
		reason := ""
		if len(parts) > 2 {
			reason = parts[2]
		}
		b, _ := json.Marshal([]string{"NEG-ERR", parts[1], negReason(reason)})
		return b, ""
	case "CLOSED":
		var parts []string
		if json.Unmarshal(msg, &parts) == nil && len(parts) >= 2 {
			return msg, parts[1]
		}
	}
	return msg, ""
}

// negReason gives khatru's negentropy errors the machine-readable prefixes
// NIP-77 uses ("closed:" for a session the relay no longer has, "blocked:"
// and "error:" otherwise).
func negReason(r string) string {
	switch {
	case r == "CLOSED":
		return "closed: unknown or expired negentropy session"
	case strings.HasPrefix(r, "invalid limit"):
		return "blocked: " + r
	case r == "":
		return "error: negentropy failed"
	}
	return nostr.NormalizeOKMessage(r, "error")
}

func (c *Conn) refuse(what string, reply []byte) {
	if c.onRefuse != nil {
		c.onRefuse(what)
	}
	if reply != nil {
		_ = c.inject(reply)
	}
}

// inject sends a guard answer, between khatru's messages.
func (c *Conn) inject(msg []byte) error {
	frame := appendFrame(nil, opText, true, false, msg)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	// Bytes in wbuf are not on the wire yet, so only a fragmented server
	// message in progress makes the answer wait.
	if c.wmsg {
		c.pending = append(c.pending, frame)
		return nil
	}
	if !c.upgraded {
		c.pending = append(c.pending, frame)
		return nil
	}
	// After any stored events held back (coalesce), in order.
	c.obuf = append(c.obuf, frame...)
	return c.flush()
}

// send writes to the client within the write timeout; c.wmu held. A client
// that stops reading is disconnected rather than allowed to block khatru's
// writers (a broadcast holds khatru's lock over every subscription).
func (c *Conn) send(b []byte) error {
	timeout := c.lim.WriteTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	_ = c.netConn.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := c.netConn.Write(b); err != nil {
		_ = c.Close()
		return err
	}
	return nil
}

// Coalescing the answer to a REQ (docs/decisions/0045-relay-req-answer-few-writes.md): khatru writes every event as its own
// websocket message, in frames of at most 1 KiB (its upgrader's write
// buffer), and each frame as its own write to the socket: a REQ answered
// with 500 events cost about a thousand write system calls, a fifth of the
// relay's CPU. While a REQ's answer is pending (the guard forwards one
// message at a time and knows which it waits for, order.go), EVENT frames
// are collected in obuf and written together: at coalesceBytes, with the
// REQ's EOSE or CLOSED (or any other message), or coalesceDelay after the
// first one held (defaultCoalesceDelay), whichever comes first. Live events outside a REQ's
// answer are written at once, as before.
const (
	coalesceBytes        = 64 << 10
	defaultCoalesceDelay = 5 * time.Millisecond
)

// obufPool holds coalescing buffers between REQs, so that an idle
// connection keeps none.
var obufPool = sync.Pool{New: func() any { return new([]byte) }}

// holding reports whether server EVENT frames may be held back now: a
// REQ's (or COUNT's) answer is pending. c.wmu held.
func (c *Conn) holding() bool {
	c.seqMu.Lock()
	defer c.seqMu.Unlock()
	p := c.waiting
	return p != nil && !p.answered && p.await.kind == awaitAnswer && slices.Contains(p.await.labels, "EOSE")
}

// flush writes what obuf holds; c.wmu held.
func (c *Conn) flush() error {
	if c.flushArmed {
		c.flushTimer.Stop()
		c.flushArmed = false
	}
	if len(c.obuf) == 0 {
		return nil
	}
	err := c.send(c.obuf)
	b := c.obuf[:0]
	c.obuf = nil
	if cap(b) <= 2*coalesceBytes {
		obufPool.Put(&b)
	}
	return err
}

// hold keeps obuf for a later write, within c.coalesceDelay; c.wmu held.
func (c *Conn) hold() {
	if c.flushArmed {
		return
	}
	if c.flushTimer == nil {
		c.flushTimer = time.AfterFunc(c.coalesceDelay, c.timedFlush)
	} else {
		c.flushTimer.Reset(c.coalesceDelay)
	}
	c.flushArmed = true
}

// timedFlush is the coalescing timer's: it writes what is still held.
func (c *Conn) timedFlush() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !c.flushArmed {
		return // flushed meanwhile; the timer fired late
	}
	c.flushArmed = false
	_ = c.flush()
}

// queue appends a frame to obuf, from the pool when obuf has none.
func (c *Conn) queue(frame []byte) {
	if c.obuf == nil {
		c.obuf = *obufPool.Get().(*[]byte)
	}
	c.obuf = append(c.obuf, frame...)
}

// Write passes khatru's frames on, rewriting NEG-ERROR, once each frame is
// whole.
func (c *Conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !c.upgraded {
		// The upgrader writes the HTTP 101 response through this
		// connection first, in one write.
		end := bytes.Index(p, []byte("\r\n\r\n"))
		if end < 0 {
			return c.netConn.Write(p)
		}
		c.upgraded = true
		if _, err := c.netConn.Write(p[:end+4]); err != nil {
			return 0, err
		}
		if n, err := c.writeFrames(p[end+4:]); err != nil {
			return end + 4 + n, err
		}
		return len(p), nil
	}
	return c.writeFrames(p)
}

// writeFrames is Write once the connection speaks websocket; c.wmu held.
// Frames are parsed from p itself when no partial frame is buffered, so a
// frame is copied once (into obuf), not twice.
func (c *Conn) writeFrames(p []byte) (int, error) {
	buf := p
	if len(c.wbuf) > 0 {
		c.wbuf = append(c.wbuf, p...)
		buf = c.wbuf
	}
	holding := c.subs != nil && c.holding()
	for {
		h, ok, err := parseHeader(buf)
		if err != nil {
			// Not a frame stream we understand: pass everything through.
			c.queue(buf)
			c.wbuf = nil
			if werr := c.flush(); werr != nil {
				return 0, werr
			}
			return len(p), nil
		}
		total := uint64(h.headLen) + h.length
		if !ok || uint64(len(buf)) < total {
			break
		}
		frame := buf[:total]
		starts := !h.control() && h.opcode != opContinuation && !h.masked
		if starts {
			c.wevent = label(frame[h.headLen:]) == "EVENT"
		}
		if starts && h.fin {
			payload := frame[h.headLen:]
			if out, closedID := rewriteServerMessage(payload); closedID != "" {
				c.st.forget(closedID)
			} else if len(out) != len(payload) || !bytes.Equal(out, payload) {
				frame = appendFrame(nil, h.opcode, true, false, out)
			}
		} else if starts && bytes.HasPrefix(frame[h.headLen:], []byte(`["NEG-ERROR"`)) {
			// A fragmented NEG-ERROR (a very long reason): fix the label.
			payload := bytes.Replace(frame[h.headLen:], []byte(`"NEG-ERROR"`), []byte(`"NEG-ERR"`), 1)
			frame = appendFrame(nil, h.opcode, false, false, payload)
		}
		c.queue(frame)
		if starts {
			c.observe(buf[h.headLen:total])
		}
		buf = buf[total:]
		if !h.control() {
			c.wmsg = !h.fin
		}
		if !c.wmsg && len(c.pending) > 0 {
			for _, f := range c.pending {
				c.queue(f)
			}
			c.pending = nil
		}
		// Only the frames of EVENT messages of a pending REQ's answer
		// wait; anything else goes out at once, with what was held.
		if !holding || h.control() || !c.wevent || len(c.obuf) >= coalesceBytes {
			if err := c.flush(); err != nil {
				return 0, err
			}
			holding = holding && c.holding()
		}
	}
	if len(c.obuf) > 0 {
		c.hold()
	}
	// Keep the partial frame left, if any, for the next write.
	if len(buf) == 0 {
		c.wbuf = nil
	} else {
		c.wbuf = append(c.wbuf[:0], buf...)
	}
	return len(p), nil
}

// CloseServiceRestart is the websocket close code (RFC 6455 §7.4.1, 1012
// "service restart") of a connection the relay ends so that its client
// subscribes again (Drop).
const CloseServiceRestart = 1012

// Drop ends the connection from the server side: a NOTICE saying why, then
// a close frame with code and the same reason, both after what khatru has
// already written, then the connection is closed. The relay drops its
// clients when its own live feed may have missed events (a client that
// subscribes again reads them from the store); nothing else ends a live
// subscription that way, and a client cannot tell a relay that stopped
// broadcasting from a quiet one.
func (c *Conn) Drop(code int, reason string) error {
	notice, _ := json.Marshal([]string{"NOTICE", reason})
	// A close frame's payload is at most 125 bytes: the code, then as much
	// of the reason as fits.
	payload := []byte{byte(code >> 8), byte(code)}
	payload = append(payload, reason[:min(len(reason), 123)]...)
	c.wmu.Lock()
	// Frames of a message khatru is still writing stay unsent (wbuf): the
	// client gets no half message, and loses it anyway by being dropped.
	if c.upgraded && !c.wmsg {
		c.obuf = appendFrame(c.obuf, opText, true, false, notice)
		c.obuf = appendFrame(c.obuf, opClose, true, false, payload)
		_ = c.flush()
	}
	c.wmu.Unlock()
	return c.Close()
}
