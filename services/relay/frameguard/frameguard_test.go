package frameguard

import (
	"bytes"
	"net"
	"strings"
	"testing"
	"time"
)

func TestFrameRoundTrip(t *testing.T) {
	tests := []struct {
		name    string
		opcode  byte
		fin     bool
		masked  bool
		payload []byte
		headLen int
	}{
		{"small text", opText, true, false, []byte(`["EOSE","x"]`), 2},
		{"small masked", opText, true, true, []byte(`["REQ","x",{}]`), 6},
		{"16-bit length", opText, false, false, bytes.Repeat([]byte("a"), 300), 4},
		{"64-bit length masked", opContinuation, true, true, bytes.Repeat([]byte("b"), 70000), 14},
		{"empty ping", opPing, true, true, nil, 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			frame := appendFrame(nil, tt.opcode, tt.fin, tt.masked, tt.payload)
			for cut := 0; cut < tt.headLen; cut++ {
				if _, ok, err := parseHeader(frame[:cut]); ok || err != nil {
					t.Fatalf("header parsed from %d of %d bytes (err %v)", cut, tt.headLen, err)
				}
			}
			h, ok, err := parseHeader(frame)
			if !ok || err != nil {
				t.Fatalf("parse: %v %v", ok, err)
			}
			if h.opcode != tt.opcode || h.fin != tt.fin || h.masked != tt.masked || h.length != uint64(len(tt.payload)) || h.headLen != tt.headLen {
				t.Fatalf("header %+v", h)
			}
			if !bytes.Equal(frame[h.headLen:], tt.payload) {
				t.Fatal("payload changed (the zero mask must leave it as is)")
			}
		})
	}
}

func TestParseHeaderRefusesBadFrames(t *testing.T) {
	tests := []struct {
		name  string
		frame []byte
	}{
		{"reserved bit", []byte{0x80 | 0x40 | opText, 0}},
		{"unknown opcode", []byte{0x80 | 0x3, 0}},
		{"fragmented control frame", []byte{opPing, 0}},
		{"oversized control frame", []byte{0x80 | opClose, 126, 0, 200}},
		{"length with the top bit set", append([]byte{0x80 | opText, 127}, 0x80, 0, 0, 0, 0, 0, 0, 0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, _, err := parseHeader(tt.frame); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func TestUnmaskIsPositional(t *testing.T) {
	mask := [4]byte{1, 2, 3, 4}
	p := []byte("hello, websocket")
	m := append([]byte(nil), p...)
	unmask(m, mask, 0)
	unmask(m[:5], mask, 0)
	unmask(m[5:], mask, 5)
	if !bytes.Equal(m, p) {
		t.Fatalf("got %q", m)
	}
}

func TestInspect(t *testing.T) {
	lim := Limits{MaxMessage: 1000, MaxFilters: 2, MaxSubs: 2, MaxSubIDLen: 8}
	id := strings.Repeat("a", 64)
	pk, sig := strings.Repeat("b", 64), strings.Repeat("c", 128)
	type step struct {
		msg       string
		forward   bool
		replyHas  string // substring of the reply (empty: no reply)
		eventDeny bool
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"event allowed", []step{{msg: `["EVENT",{"id":"` + id + `"}]`, forward: true}}},
		{"event rate-limited, answered with its id", []step{
			{msg: `["EVENT",{"kind":1,"id":"` + id + `"}]`, eventDeny: true, replyHas: `["OK","` + id + `",false,"rate-limited: `},
		}},
		{"filters per REQ", []step{
			{msg: `["REQ","a",{},{}]`, forward: true},
			{msg: `["REQ","b",{},{},{}]`, replyHas: `["CLOSED","b","blocked: too many filters`},
		}},
		{"subscriptions per connection, CLOSE frees one, re-REQ of an open id is free", []step{
			{msg: `["REQ","a",{}]`, forward: true},
			{msg: `["REQ","b",{}]`, forward: true},
			{msg: `["REQ","a",{"kinds":[1]}]`, forward: true},
			{msg: `["REQ","c",{}]`, replyHas: `["CLOSED","c","blocked: too many open subscriptions`},
			{msg: `["CLOSE","a"]`, forward: true},
			{msg: `["REQ","c",{}]`, forward: true},
		}},
		{"long subscription id", []step{{msg: `["REQ","123456789",{}]`, replyHas: `"invalid: subscription id longer than 8`}}},
		{"search refused before khatru", []step{{msg: `["REQ","s",{},{"search":"x"}]`, replyHas: `["CLOSED","s","unsupported: full-text search`}}},
		{"unparsable messages answered as khatru would", []step{
			{msg: `["REQ"`, replyHas: `["NOTICE","failed to parse envelope: `},
			{msg: `["REQ","x",1]`, replyHas: `["NOTICE","failed to parse envelope: `},
			{msg: `["NEG-OPEN","n"]`, replyHas: `["NOTICE","failed to parse envelope: unknown envelope label"]`},
			{msg: `["WHAT","n"]`, replyHas: `["NOTICE","failed to parse envelope: unknown envelope label"]`},
		}},
		{"no label: never reaches khatru (its NIP-77 parser panics on some)", []step{
			{msg: `[","]`, replyHas: `["NOTICE","failed to parse envelope: `},
			{msg: `"",`, replyHas: `["NOTICE","failed to parse envelope: `},
			{msg: `not json`, replyHas: `["NOTICE","failed to parse envelope: `},
		}},
		{"relay-to-client labels dropped, CLOSE of no subscription dropped", []step{
			{msg: `["EOSE","a"]`}, {msg: `["OK","a",true,""]`}, {msg: `["NEG-ERR","a","x"]`}, {msg: `["CLOSE","zz"]`},
		}},
		{"oversized pubkey or signature refused before khatru verifies (libsecp256k1 panics on them)", []step{
			{msg: `["EVENT",{"id":"` + id + `","pubkey":"` + pk + `00","sig":"` + sig + `"}]`, replyHas: `["OK","` + id + `",false,"invalid: pubkey must be 64`},
			{msg: `["EVENT",{"id":"` + id + `","pubkey":"` + pk + `","sig":"` + sig + `0000"}]`, replyHas: `["OK","` + id + `",false,"invalid: signature must be 128`},
			{msg: `["EVENT","sub",{"id":"` + id + `","pubkey":"` + pk + `00"}]`, replyHas: `"invalid: pubkey must be 64`},
			// The decoder keeps the last of duplicate keys.
			{msg: `["EVENT",{"id":"` + id + `","pubkey":"` + pk + `","pubkey":"` + pk + `00"}]`, replyHas: `"invalid: pubkey must be 64`},
			{msg: `["EVENT",{"id":"` + id + `","pubkey":"\u0030` + pk + `"}]`, replyHas: `"invalid: pubkey must be 64`},
			{msg: `["AUTH",{"id":"` + id + `","kind":22242,"pubkey":"` + pk + `00","sig":"` + sig + `","tags":[]}]`, replyHas: `["OK","` + id + `",false,"invalid: pubkey must be 64`},
			{msg: `["EVENT",{"id":"` + id + `","pubkey":"` + pk + `","sig":"` + sig + `"}]`, forward: true},
			{msg: `["AUTH",{"id":"` + id + `","kind":22242,"pubkey":"` + pk + `","sig":"` + sig + `","tags":[]}]`, forward: true},
		}},
		{"NIP-77 passes", []step{{msg: `["NEG-OPEN","n",{},"61"]`, forward: true}, {msg: `["NEG-MSG","n","61"]`, forward: true}, {msg: `["NEG-CLOSE","n"]`, forward: true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := newConnState()
			for i, s := range tt.steps {
				allowed := func() bool { return !s.eventDeny }
				v := inspect([]byte(s.msg), st, lim, allowed)
				if v.forward != s.forward {
					t.Fatalf("step %d %s: forward = %v", i, s.msg, v.forward)
				}
				if s.replyHas == "" && v.reply != nil || s.replyHas != "" && !strings.Contains(string(v.reply), s.replyHas) {
					t.Fatalf("step %d %s: reply %s, want it to contain %s", i, s.msg, v.reply, s.replyHas)
				}
			}
		})
	}
}

func TestLabelAndEventID(t *testing.T) {
	id := strings.Repeat("0f", 32)
	tests := []struct{ msg, label, id string }{
		{` [ "EVENT" , {"id" : "` + id + `"`, "EVENT", id},
		{`["EVENT",{"content":"x","id":"` + id + `","sig":"`, "EVENT", id},
		{`["REQ","x"]`, "REQ", ""},
		{`{"EVENT"}`, "", ""},
		{`["AVERYLONGLABELTHATISNOTALABEL"]`, "", ""},
		{`["EVENT",{"id":"` + strings.ToUpper(id) + `"}]`, "EVENT", ""},
	}
	for _, tt := range tests {
		if got := label([]byte(tt.msg)); got != tt.label {
			t.Errorf("label(%s) = %q, want %q", tt.msg, got, tt.label)
		}
		if got := eventID([]byte(tt.msg)); got != tt.id {
			t.Errorf("eventID(%s) = %q, want %q", tt.msg, got, tt.id)
		}
	}
	if got := string(oversized([]byte(`["EVENT",{"id":"`+id+`"`), 10)); !strings.HasPrefix(got, `["OK","`+id+`",false,"invalid: event too large`) {
		t.Errorf("oversized EVENT answer %s", got)
	}
	if got := string(oversized([]byte(`["REQ","x",`), 10)); !strings.HasPrefix(got, `["NOTICE","invalid: message too large`) {
		t.Errorf("oversized REQ answer %s", got)
	}
}

func TestRewriteServerMessage(t *testing.T) {
	tests := []struct {
		name, in, want, closedID string
	}{
		{"closed session", `["NEG-ERROR","s1","CLOSED"]`, `["NEG-ERR","s1","closed: unknown or expired negentropy session"]`, ""},
		{"prefixed reason kept", `["NEG-ERROR","s1","blocked: too many"]`, `["NEG-ERR","s1","blocked: too many"]`, ""},
		{"unprefixed reason", `["NEG-ERROR","s1","invalid limit 0"]`, `["NEG-ERR","s1","blocked: invalid limit 0"]`, ""},
		{"engine error", `["NEG-ERROR","s1","parse failure"]`, `["NEG-ERR","s1","error: parse failure"]`, ""},
		{"already standard", `["NEG-ERR","s1","closed: x"]`, `["NEG-ERR","s1","closed: x"]`, ""},
		{"closed subscription noted", `["CLOSED","sub","error: x"]`, `["CLOSED","sub","error: x"]`, "sub"},
		{"events untouched", `["EVENT","sub",{"content":"[\"NEG-ERROR\"]"}]`, `["EVENT","sub",{"content":"[\"NEG-ERROR\"]"}]`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, id := rewriteServerMessage([]byte(tt.in))
			if string(out) != tt.want || id != tt.closedID {
				t.Fatalf("got %s %q, want %s %q", out, id, tt.want, tt.closedID)
			}
		})
	}
}

// pipeConn is one end of an in-memory connection whose writes are
// collected, to drive the guard without sockets.
type pipeConn struct {
	net.Conn
	in      *bytes.Reader
	written bytes.Buffer
}

func (p *pipeConn) Read(b []byte) (int, error)          { return p.in.Read(b) }
func (p *pipeConn) Write(b []byte) (int, error)         { return p.written.Write(b) }
func (p *pipeConn) SetWriteDeadline(time.Time) error    { return nil }
func (p *pipeConn) frames(t *testing.T) (msgs []string) { return decodeFrames(t, p.written.Bytes()) }

func decodeFrames(t *testing.T, b []byte) (msgs []string) {
	t.Helper()
	for len(b) > 0 {
		h, ok, err := parseHeader(b)
		if !ok || err != nil {
			t.Fatalf("bad frame stream at %q: %v", b, err)
		}
		p := append([]byte(nil), b[h.headLen:h.headLen+int(h.length)]...)
		if h.masked {
			unmask(p, h.mask, 0)
		}
		msgs = append(msgs, string(p))
		b = b[h.headLen+int(h.length):]
	}
	return msgs
}

// clientFrames builds what a client sends: masked frames with a real key,
// the second message fragmented.
func clientFrames(msgs ...string) []byte {
	var out []byte
	mask := [4]byte{9, 8, 7, 6}
	frame := func(op byte, fin bool, p string) {
		b := appendFrame(nil, op, fin, true, []byte(p))
		h, _, _ := parseHeader(b)
		copy(b[h.headLen-4:], mask[:])
		unmask(b[h.headLen:], mask, 0)
		out = append(out, b...)
	}
	for i, m := range msgs {
		if i == 1 && len(m) > 4 {
			frame(opText, false, m[:3])
			frame(opPing, true, "")
			frame(opContinuation, true, m[3:])
			continue
		}
		frame(opText, true, m)
	}
	return out
}

func TestGuardConnReadSide(t *testing.T) {
	lim := Limits{MaxMessage: 200, MaxFilters: 1, MaxSubs: 10, MaxSubIDLen: 64}
	big := `["EVENT",{"id":"` + strings.Repeat("c", 64) + `","content":"` + strings.Repeat("x", 300) + `"}]`
	in := clientFrames(`["REQ","a",{}]`, `["REQ","b",{},{}]`, big, `["CLOSE","a"]`)
	pc := &pipeConn{in: bytes.NewReader(in)}
	g := New(pc, lim, nil, nil, nil)
	g.upgraded = true
	var got bytes.Buffer
	buf := make([]byte, 7) // small reads: khatru's reader may ask for any size
	for {
		n, err := g.Read(buf)
		got.Write(buf[:n])
		if err != nil {
			break
		}
	}
	forwarded := decodeFrames(t, got.Bytes())
	want := []string{`["REQ","a",{}]`, "", `["CLOSE","a"]`} // the ping passes through
	if len(forwarded) != len(want) {
		t.Fatalf("forwarded %q, want %q", forwarded, want)
	}
	for i := range want {
		if forwarded[i] != want[i] {
			t.Fatalf("forwarded %q, want %q", forwarded, want)
		}
	}
	answers := pc.frames(t)
	if len(answers) != 2 || !strings.Contains(answers[0], `"CLOSED","b","blocked: too many filters`) ||
		!strings.Contains(answers[1], `"OK","`+strings.Repeat("c", 64)+`",false,"invalid: event too large`) {
		t.Fatalf("answers %q", answers)
	}
}

func TestGuardConnWriteSide(t *testing.T) {
	pc := &pipeConn{in: bytes.NewReader(nil)}
	g := New(pc, Limits{MaxMessage: 100, MaxFilters: 1, MaxSubs: 10, MaxSubIDLen: 64}, nil, nil, nil)
	handshake := "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"
	if _, err := g.Write([]byte(handshake)); err != nil {
		t.Fatal(err)
	}
	// A fragmented server message; an answer injected in the middle waits.
	first := appendFrame(nil, opText, false, false, []byte(`["EVENT","s",`))
	rest := appendFrame(nil, opContinuation, true, false, []byte(`{}]`))
	negErr := appendFrame(nil, opText, true, false, []byte(`["NEG-ERROR","n","CLOSED"]`))
	stream := append(append(append([]byte(nil), first...), rest...), negErr...)
	if _, err := g.Write(stream[:len(first)+1]); err != nil { // cut inside the second frame
		t.Fatal(err)
	}
	if err := g.inject([]byte(`["NOTICE","later"]`)); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Write(stream[len(first)+1:]); err != nil {
		t.Fatal(err)
	}
	out := pc.written.String()
	if !strings.HasPrefix(out, handshake) {
		t.Fatalf("handshake not passed through: %q", out)
	}
	msgs := decodeFrames(t, []byte(out[len(handshake):]))
	want := []string{`["EVENT","s",`, `{}]`, `["NOTICE","later"]`, `["NEG-ERR","n","closed: unknown or expired negentropy session"]`}
	if len(msgs) != len(want) {
		t.Fatalf("got %q, want %q", msgs, want)
	}
	for i := range want {
		if msgs[i] != want[i] {
			t.Fatalf("got %q, want %q", msgs, want)
		}
	}
}

// FuzzGuardRead feeds arbitrary client bytes through the guard: no panic,
// no endless loop, and what reaches khatru is a well-formed frame stream
// whose messages respect the size limit.
func FuzzGuardRead(f *testing.F) {
	f.Add(clientFrames(`["REQ","a",{}]`, `["REQ","b",{},{}]`, `["CLOSE","a"]`))
	f.Add(clientFrames(`["EVENT",{"id":"` + strings.Repeat("1", 64) + `","content":"` + strings.Repeat("x", 300) + `"}]`))
	f.Add([]byte{0x81, 0xff, 0, 0, 0, 0, 0, 0, 0x10, 0, 1, 2, 3, 4})
	f.Add([]byte{0x01, 0x82, 1, 2, 3, 4, 'a', 'b', 0x80, 0x81, 1, 2, 3, 4, 'c'})
	f.Fuzz(func(t *testing.T, data []byte) {
		lim := Limits{MaxMessage: 256, MaxFilters: 2, MaxSubs: 2, MaxSubIDLen: 8}
		pc := &pipeConn{in: bytes.NewReader(data)}
		g := New(pc, lim, nil, func() bool { return true }, nil)
		g.upgraded = true
		var got bytes.Buffer
		buf := make([]byte, 512)
		for i := 0; ; i++ {
			if i > len(data)+100 {
				t.Fatal("guard does not terminate")
			}
			n, err := g.Read(buf)
			got.Write(buf[:n])
			if err != nil {
				break
			}
		}
		b := got.Bytes()
		for len(b) > 0 {
			h, ok, err := parseHeader(b)
			if !ok || err != nil || uint64(len(b)) < uint64(h.headLen)+h.length {
				t.Fatalf("guard forwarded a broken frame stream: %x", got.Bytes())
			}
			if !h.control() && h.length > uint64(lim.MaxMessage) {
				t.Fatalf("guard forwarded a %d-byte message", h.length)
			}
			b = b[uint64(h.headLen)+h.length:]
		}
	})
}
