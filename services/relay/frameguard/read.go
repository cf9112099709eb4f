package frameguard

import (
	"encoding/json"
	"errors"

	"github.com/nbd-wtf/go-nostr"
)

// The guard's client side (see conn.go): client frames are reassembled
// into messages, each is inspected (inspect.go) and, if khatru gets it,
// handed on re-framed once khatru has finished the one before (order.go).

// Read hands khatru the client's frames after inspection, each message only
// once khatru has finished the one before (order.go).
func (c *Conn) Read(p []byte) (int, error) {
	for len(c.out) == 0 {
		if c.held != nil {
			err := c.settle()
			if err == nil {
				c.forward(c.heldOp, c.held, c.heldAwait)
			} else {
				c.rerr = err
			}
			c.held = nil
			continue
		}
		if c.rerr != nil {
			return 0, c.rerr
		}
		progressed, err := c.step()
		if err != nil {
			// Let khatru see what came before, then the error.
			c.rerr = err
			continue
		}
		if !progressed {
			if err := c.fill(); err != nil {
				c.rerr = err
			}
		}
	}
	n := copy(p, c.out)
	c.out = c.out[n:]
	if len(c.out) == 0 {
		c.out = nil
	}
	return n, nil
}

// fill reads more client bytes.
func (c *Conn) fill() error {
	var tmp [32 << 10]byte
	n, err := c.netConn.Read(tmp[:])
	c.rbuf = append(c.rbuf, tmp[:n]...)
	if n > 0 {
		return nil
	}
	if err == nil {
		err = errors.New("websocket: empty read")
	}
	return err
}

// step consumes what it can from rbuf; false when it needs more bytes.
func (c *Conn) step() (bool, error) {
	if c.skip > 0 {
		if len(c.rbuf) == 0 {
			return false, nil
		}
		n := min(uint64(len(c.rbuf)), c.skip)
		c.rbuf = c.rbuf[n:]
		c.skip -= n
		return true, nil
	}
	h, ok, err := parseHeader(c.rbuf)
	if err != nil {
		return false, err
	}
	if !ok {
		return false, nil
	}
	if h.control() {
		total := h.headLen + int(h.length)
		if len(c.rbuf) < total {
			return false, nil
		}
		c.out = append(c.out, c.rbuf[:total]...)
		c.rbuf = c.rbuf[total:]
		return true, nil
	}
	starts := h.opcode != opContinuation
	if starts == c.inMsg {
		return false, errBadFrame // continuation without a message, or a new message inside one
	}
	if c.dropping || uint64(len(c.msg))+h.length > uint64(c.lim.MaxMessage) {
		if !c.dropping {
			// Answered after khatru's answer to the message before.
			if err := c.settle(); err != nil {
				return false, err
			}
		}
		return c.drop(h), nil
	}
	total := h.headLen + int(h.length)
	if len(c.rbuf) < total {
		return false, nil
	}
	payload := c.rbuf[h.headLen:total]
	if h.masked {
		unmask(payload, h.mask, 0)
	}
	if starts {
		c.inMsg, c.msgOp, c.msg = true, h.opcode, c.msg[:0]
	}
	c.msg = append(c.msg, payload...)
	c.rbuf = c.rbuf[total:]
	if h.fin {
		c.inMsg = false
		err := c.deliver()
		c.msg = c.msg[:0]
		if err != nil {
			return false, err
		}
	}
	return true, nil
}

// drop starts or continues discarding an oversized message, answering it
// once from its first bytes.
func (c *Conn) drop(h frameHeader) bool {
	if !c.dropping {
		head := append([]byte(nil), c.msg...)
		avail := c.rbuf[h.headLen:min(len(c.rbuf), h.headLen+int(min(h.length, 4096)))]
		chunk := append([]byte(nil), avail...)
		if h.masked {
			unmask(chunk, h.mask, 0)
		}
		head = append(head, chunk...)
		c.dropping = true
		c.msg = c.msg[:0]
		c.refuse("message-too-large", oversized(head, c.lim.MaxMessage))
	}
	c.inMsg = !h.fin
	if h.fin {
		c.dropping = false
	}
	c.rbuf = c.rbuf[h.headLen:]
	c.skip = h.length
	return true
}

// deliver decides on a complete client message, once khatru has finished
// the previous one. khatru treats binary messages as text, so does the
// guard.
func (c *Conn) deliver() error {
	if err := c.settle(); err != nil {
		return err
	}
	v := inspect(c.msg, c.st, c.lim, c.eventAllowed)
	if !v.forward {
		if v.reply != nil {
			c.refuse(v.what, v.reply)
		}
		return nil
	}
	if v.replaces {
		b, _ := json.Marshal(nostr.CloseEnvelope(v.await.sub))
		c.forward(opText, b, awaited{kind: awaitClose, sub: v.await.sub})
		c.held = append([]byte(nil), c.msg...)
		c.heldOp, c.heldAwait = c.msgOp, v.await
		return nil
	}
	c.forward(c.msgOp, c.msg, v.await)
	return nil
}
