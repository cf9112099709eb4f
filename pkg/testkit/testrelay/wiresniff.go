package testrelay

import (
	"bytes"
	"encoding/binary"
	"net"
	"strings"
	"sync"
	"sync/atomic"
)

// The farm counts what crosses each relay's sockets below khatru: bytes
// both ways, and the label of every websocket message ("REQ", "NEG-OPEN",
// "EVENT" …), read from the first bytes of each message. Counting at the
// socket sees what khatru itself never reports, such as a NEG-OPEN sent to
// a relay without NIP-77 (khatru answers it with a NOTICE and no hook runs).
// khatru's upgrader negotiates no compression, so payloads are plain JSON
// (masked from clients, RFC 6455 §5.3).

// labelPrefix is how many payload bytes are kept to read a message's label:
// `["NEG-CLOSE",` is the longest label of interest.
const labelPrefix = 16

// maxPrefix is the most payload bytes a sniffer keeps for onPrefix: enough
// for `["CLOSED",` and a subscription id of NIP-01's 64 characters.
const maxPrefix = 96

// frameSniffer follows the websocket frames of one direction of a
// connection fed in arbitrary chunks, and calls onLabel with the label of
// every data message's first frame (and onPrefix, if set, with its first
// keep bytes).
type frameSniffer struct {
	onLabel  func(label string)
	onPrefix func(prefix []byte)
	keep     int // payload bytes kept for onPrefix (0: labelPrefix; at most maxPrefix)
	// inHTTP is set while the HTTP upgrade (request or response) that
	// precedes the frames is being skipped; onHeaders then gets its
	// first line.
	inHTTP    bool
	crlf      int // bytes of "\r\n\r\n" matched so far
	line      []byte
	onHeaders func(firstLine string)

	hdr    [14]byte
	hn     int // header bytes collected
	need   int // header length once known (0: not yet)
	inBody bool
	remain uint64 // payload bytes left in the current frame
	mask   [4]byte
	masked bool
	pos    uint64 // payload offset, for unmasking
	want   bool   // this frame starts a data message whose label is wanted
	pre    [maxPrefix]byte
	pn     int
}

// keepN is how many payload bytes are kept per message.
func (s *frameSniffer) keepN() int {
	if s.keep <= 0 {
		return labelPrefix
	}
	return min(s.keep, maxPrefix)
}

// feed consumes b.
func (s *frameSniffer) feed(b []byte) {
	for len(b) > 0 {
		if s.inHTTP {
			c := b[0]
			b = b[1:]
			if s.line != nil && len(s.line) < 64 && c != '\r' && c != '\n' {
				s.line = append(s.line, c)
			} else if c == '\r' || c == '\n' {
				if s.line != nil && s.onHeaders != nil {
					s.onHeaders(string(s.line))
				}
				s.line = nil
			}
			if c == "\r\n\r\n"[s.crlf] {
				s.crlf++
			} else if c == '\r' {
				s.crlf = 1
			} else {
				s.crlf = 0
			}
			if s.crlf == 4 {
				s.inHTTP = false
			}
			continue
		}
		if !s.inBody {
			if s.hn < 2 {
				s.hdr[s.hn] = b[0]
				s.hn++
				b = b[1:]
				if s.hn == 2 {
					s.need = 2
					switch s.hdr[1] & 0x7f {
					case 126:
						s.need += 2
					case 127:
						s.need += 8
					}
					if s.hdr[1]&0x80 != 0 {
						s.need += 4
					}
				}
			} else {
				k := min(len(b), s.need-s.hn)
				copy(s.hdr[s.hn:], b[:k])
				s.hn += k
				b = b[k:]
			}
			if s.hn < 2 || s.hn < s.need {
				continue
			}
			s.startBody()
			continue
		}
		k := uint64(len(b))
		if k > s.remain {
			k = s.remain
		}
		if s.want {
			keep := s.keepN()
			for i := uint64(0); i < k && s.pn < keep; i++ {
				c := b[i]
				if s.masked {
					c ^= s.mask[(s.pos+i)%4]
				}
				s.pre[s.pn] = c
				s.pn++
			}
			if s.pn == keep {
				s.emit()
			}
		}
		s.pos += k
		s.remain -= k
		b = b[k:]
		if s.remain == 0 {
			s.endFrame()
		}
	}
}

// startBody parses the collected header and enters the payload.
func (s *frameSniffer) startBody() {
	op := s.hdr[0] & 0x0f
	n := uint64(s.hdr[1] & 0x7f)
	off := 2
	switch n {
	case 126:
		n = uint64(binary.BigEndian.Uint16(s.hdr[2:4]))
		off = 4
	case 127:
		n = binary.BigEndian.Uint64(s.hdr[2:10])
		off = 10
	}
	s.masked = s.hdr[1]&0x80 != 0
	if s.masked {
		copy(s.mask[:], s.hdr[off:off+4])
	}
	s.remain, s.pos, s.pn = n, 0, 0
	s.want = op == 1 || op == 2 // text or binary: a message's first frame
	s.inBody = true
	if s.remain == 0 {
		s.endFrame()
	}
}

// endFrame reports a short message's label and waits for the next header.
func (s *frameSniffer) endFrame() {
	if s.want {
		s.emit()
	}
	s.inBody, s.hn, s.need = false, 0, 0
}

// emit reports the label of the current message once.
func (s *frameSniffer) emit() {
	s.want = false
	if s.onLabel != nil {
		s.onLabel(messageLabel(s.pre[:min(s.pn, labelPrefix)]))
	}
	if s.onPrefix != nil {
		s.onPrefix(s.pre[:s.pn])
	}
}

// messageLabel is the first string of a JSON array prefix (`["REQ",…` →
// "REQ"), or "" when the prefix is not one.
func messageLabel(p []byte) string {
	p = bytes.TrimLeft(p, " \t\r\n")
	if len(p) < 2 || p[0] != '[' {
		return ""
	}
	p = bytes.TrimLeft(p[1:], " \t\r\n")
	if len(p) == 0 || p[0] != '"' {
		return ""
	}
	p = p[1:]
	i := bytes.IndexByte(p, '"')
	if i < 0 {
		return ""
	}
	return string(p[:i])
}

// sniffConn counts a connection's bytes and messages into a relay's
// counters.
type sniffConn struct {
	net.Conn
	c *farmCounters
	// upgraded is set once the relay answered 101: a plain HTTP exchange
	// (NIP-11) has no frames to count.
	upgraded atomic.Bool

	in     frameSniffer // read by the one goroutine reading the conn
	outMu  sync.Mutex   // writes may come from several goroutines
	out    frameSniffer
	closed sync.Once
}

func newSniffConn(conn net.Conn, c *farmCounters) *sniffConn {
	s := &sniffConn{Conn: conn, c: c}
	s.in = frameSniffer{inHTTP: true, line: []byte{}, onLabel: func(l string) {
		if s.upgraded.Load() {
			c.countIn(l)
		}
	}}
	s.out = frameSniffer{inHTTP: true, line: []byte{}, onLabel: c.countOut, onHeaders: func(status string) {
		s.upgraded.Store(strings.HasPrefix(status, "HTTP/1.1 101"))
	}}
	return s
}

func (s *sniffConn) Read(p []byte) (int, error) {
	n, err := s.Conn.Read(p)
	if n > 0 {
		s.c.bytesIn.Add(int64(n))
		s.in.feed(p[:n])
	}
	return n, err
}

func (s *sniffConn) Write(p []byte) (int, error) {
	n, err := s.Conn.Write(p)
	if n > 0 {
		s.c.bytesOut.Add(int64(n))
		s.outMu.Lock()
		s.out.feed(p[:n])
		s.outMu.Unlock()
	}
	return n, err
}

func (s *sniffConn) Close() error {
	s.closed.Do(func() {
		s.c.tcpOpen.Add(-1)
		s.c.conns.Delete(s)
	})
	return s.Conn.Close()
}

// sniffListener wraps every accepted connection in a sniffConn.
type sniffListener struct {
	net.Listener
	c *farmCounters
}

func (l sniffListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.c.tcpAccepted.Add(1)
	l.c.tcpOpen.Add(1)
	s := newSniffConn(conn, l.c)
	l.c.conns.Store(s, struct{}{})
	return s, nil
}
