package frameguard

import (
	"encoding/binary"
	"errors"
)

// Websocket frame codec (RFC 6455 §5.2), just enough for the guard (see
// conn.go) to read client messages before khatru does and to rewrite or add
// server messages. No extensions are negotiated (khatru's upgrader does not
// enable compression), so payloads are plain.

// Frame opcodes.
const (
	opContinuation = 0x0
	opText         = 0x1
	opBinary       = 0x2
	opClose        = 0x8
	opPing         = 0x9
	opPong         = 0xA
)

// frameHeader is a parsed frame header.
type frameHeader struct {
	fin     bool
	opcode  byte
	masked  bool
	mask    [4]byte
	length  uint64 // payload length
	headLen int    // bytes of header, mask key included
}

func (h frameHeader) control() bool { return h.opcode&0x8 != 0 }

// errBadFrame is a frame no peer may send (reserved bits, oversized or
// fragmented control frame).
var errBadFrame = errors.New("websocket: malformed frame")

// parseHeader parses the frame header at the start of b. ok is false when b
// holds only part of it.
func parseHeader(b []byte) (h frameHeader, ok bool, err error) {
	if len(b) < 2 {
		return h, false, nil
	}
	if b[0]&0x70 != 0 {
		return h, false, errBadFrame // RSV bits: no extension was negotiated
	}
	h.fin = b[0]&0x80 != 0
	h.opcode = b[0] & 0x0f
	h.masked = b[1]&0x80 != 0
	n := 2
	switch l := b[1] & 0x7f; l {
	case 126:
		if len(b) < n+2 {
			return h, false, nil
		}
		h.length = uint64(binary.BigEndian.Uint16(b[n:]))
		n += 2
	case 127:
		if len(b) < n+8 {
			return h, false, nil
		}
		h.length = binary.BigEndian.Uint64(b[n:])
		if h.length>>63 != 0 {
			return h, false, errBadFrame
		}
		n += 8
	default:
		h.length = uint64(l)
	}
	if h.masked {
		if len(b) < n+4 {
			return h, false, nil
		}
		copy(h.mask[:], b[n:n+4])
		n += 4
	}
	if h.control() && (h.length > 125 || !h.fin) {
		return h, false, errBadFrame
	}
	switch h.opcode {
	case opContinuation, opText, opBinary, opClose, opPing, opPong:
	default:
		return h, false, errBadFrame
	}
	h.headLen = n
	return h, true, nil
}

// unmask XORs payload with the mask key, starting at offset off of the
// payload (masking is position-dependent).
func unmask(payload []byte, mask [4]byte, off int) {
	for i := range payload {
		payload[i] ^= mask[(off+i)&3]
	}
}

// appendFrame appends one complete frame carrying payload. A masked frame
// (client to server) uses the all-zero key, which leaves the payload as is:
// the guard re-emits client messages this way without copying them twice.
func appendFrame(dst []byte, opcode byte, fin, masked bool, payload []byte) []byte {
	b0 := opcode
	if fin {
		b0 |= 0x80
	}
	var m byte
	if masked {
		m = 0x80
	}
	n := len(payload)
	switch {
	case n < 126:
		dst = append(dst, b0, m|byte(n))
	case n <= 0xffff:
		dst = append(dst, b0, m|126, byte(n>>8), byte(n))
	default:
		dst = append(dst, b0, m|127)
		dst = binary.BigEndian.AppendUint64(dst, uint64(n))
	}
	if masked {
		dst = append(dst, 0, 0, 0, 0)
	}
	return append(dst, payload...)
}
