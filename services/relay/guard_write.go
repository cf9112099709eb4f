package relay

import (
	"bytes"
	"encoding/json"
	"strings"
	"time"

	"github.com/nbd-wtf/go-nostr"
)

// The guard's server side (see guard.go): khatru's frames pass to the
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

func (c *guardConn) refuse(what string, reply []byte) {
	if c.onRefuse != nil {
		c.onRefuse(what)
	}
	if reply != nil {
		_ = c.inject(reply)
	}
}

// inject sends a guard answer, between khatru's messages.
func (c *guardConn) inject(msg []byte) error {
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
	return c.send(frame)
}

// send writes to the client within the write timeout; c.wmu held. A client
// that stops reading is disconnected rather than allowed to block khatru's
// writers (a broadcast holds khatru's lock over every subscription).
func (c *guardConn) send(b []byte) error {
	timeout := c.lim.writeTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	_ = c.Conn.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := c.Conn.Write(b); err != nil {
		_ = c.Close()
		return err
	}
	return nil
}

// Write passes khatru's frames on, rewriting NEG-ERROR, once each frame is
// whole.
func (c *guardConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !c.upgraded {
		// The upgrader writes the HTTP 101 response through this
		// connection first, in one write.
		end := bytes.Index(p, []byte("\r\n\r\n"))
		if end < 0 {
			return c.Conn.Write(p)
		}
		c.upgraded = true
		if _, err := c.Conn.Write(p[:end+4]); err != nil {
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
func (c *guardConn) writeFrames(p []byte) (int, error) {
	c.wbuf = append(c.wbuf, p...)
	for {
		h, ok, err := parseHeader(c.wbuf)
		if err != nil {
			// Not a frame stream we understand: pass everything through.
			werr := c.send(c.wbuf)
			c.wbuf = nil
			if werr != nil {
				return 0, werr
			}
			return len(p), nil
		}
		total := uint64(h.headLen) + h.length
		if !ok || uint64(len(c.wbuf)) < total {
			break
		}
		frame := c.wbuf[:total]
		starts := !h.control() && h.opcode != opContinuation && !h.masked
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
		if err := c.send(frame); err != nil {
			return 0, err
		}
		if starts {
			c.observe(c.wbuf[h.headLen:total])
		}
		c.wbuf = c.wbuf[total:]
		if !h.control() {
			c.wmsg = !h.fin
		}
		if !c.wmsg && len(c.pending) > 0 {
			for _, f := range c.pending {
				if err := c.send(f); err != nil {
					return 0, err
				}
			}
			c.pending = nil
		}
	}
	if len(c.wbuf) == 0 {
		c.wbuf = nil
	}
	return len(p), nil
}
