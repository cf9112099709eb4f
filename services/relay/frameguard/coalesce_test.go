package frameguard

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// writesConn records each write to the client separately.
type writesConn struct {
	net.Conn
	mu     sync.Mutex
	writes [][]byte
}

func (w *writesConn) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes = append(w.writes, append([]byte(nil), b...))
	return len(b), nil
}
func (w *writesConn) SetWriteDeadline(time.Time) error { return nil }
func (w *writesConn) Close() error                     { return nil }

func (w *writesConn) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.writes)
}

// messages decodes every write so far into messages (fragments joined),
// in order.
func (w *writesConn) messages(t *testing.T) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var all []byte
	for _, b := range w.writes {
		all = append(all, b...)
	}
	var msgs []string
	var cur []byte
	for len(all) > 0 {
		h, ok, err := parseHeader(all)
		if !ok || err != nil {
			t.Fatalf("bad frame stream: %v", err)
		}
		cur = append(cur, all[h.headLen:h.headLen+int(h.length)]...)
		all = all[h.headLen+int(h.length):]
		if h.fin {
			msgs = append(msgs, string(cur))
			cur = nil
		}
	}
	return msgs
}

// khatruEvent writes an EVENT message as khatru does: frames of at most
// 1 KiB (its upgrader's write buffer), each frame a write of its own.
func khatruEvent(t *testing.T, g *Conn, sub string, n int) string {
	t.Helper()
	msg := fmt.Sprintf(`["EVENT",%q,{"id":"%064d","content":"%s"}]`, sub, n, strings.Repeat("x", 1500))
	b := []byte(msg)
	for first := true; len(b) > 0; first = false {
		part := b[:min(1024, len(b))]
		b = b[len(part):]
		op := byte(opText)
		if !first {
			op = opContinuation
		}
		if _, err := g.Write(appendFrame(nil, op, len(b) == 0, false, part)); err != nil {
			t.Fatal(err)
		}
	}
	return msg
}

func khatruWrite(t *testing.T, g *Conn, msg string) {
	t.Helper()
	if _, err := g.Write(appendFrame(nil, opText, true, false, []byte(msg))); err != nil {
		t.Fatal(err)
	}
}

// While a REQ's answer is pending, its EVENT frames reach the client
// together with the EOSE, in order, in one write; outside a REQ's answer
// an event is written at once; what is held is written after the delay
// even without an EOSE, and at coalesceBytes.
func TestGuardCoalescesREQAnswer(t *testing.T) {
	lim := Limits{MaxMessage: 1000, MaxFilters: 2, MaxSubs: 10, MaxSubIDLen: 64}
	wc := &writesConn{}
	g := New(wc, lim, nil, nil, nil)
	g.upgraded = true
	g.subs = NewSubscriptions()
	g.coalesceDelay = time.Hour

	g.forward(opText, []byte(`["REQ","a",{}]`), answer("a", "EOSE", "CLOSED"))
	var want []string
	for i := range 20 {
		want = append(want, khatruEvent(t, g, "a", i))
	}
	if n := wc.count(); n != 0 {
		t.Fatalf("%d writes to the client before the EOSE, want none (held)", n)
	}
	khatruWrite(t, g, `["EOSE","a"]`)
	want = append(want, `["EOSE","a"]`)
	if n := wc.count(); n != 1 {
		t.Fatalf("%d writes for 20 events and the EOSE, want 1", n)
	}
	if got := wc.messages(t); !sameMessages(got, want) {
		t.Fatalf("the client got %d messages, not the %d written in order", len(got), len(want))
	}

	// A live event: no REQ pending.
	want = append(want, khatruEvent(t, g, "a", 100))
	if n := wc.count(); n != 3 { // its two frames
		t.Fatalf("%d writes after a live event, want 3 (written at once)", n)
	}

	// Held events go out after the delay, without an EOSE.
	g.wmu.Lock()
	g.coalesceDelay = 10 * time.Millisecond
	g.wmu.Unlock()
	g.forward(opText, []byte(`["REQ","b",{}]`), answer("b", "EOSE", "CLOSED"))
	want = append(want, khatruEvent(t, g, "b", 1))
	deadline := time.Now().Add(5 * time.Second)
	for wc.count() == 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := wc.messages(t); !sameMessages(got, want) {
		t.Fatalf("held event not written after the delay: the client has %d messages, want %d", len(got), len(want))
	}

	// More than coalesceBytes: written before the EOSE.
	g.wmu.Lock()
	g.coalesceDelay = time.Hour
	g.wmu.Unlock()
	before := wc.count()
	for i := range 2 * coalesceBytes / 1500 {
		want = append(want, khatruEvent(t, g, "b", 1000+i))
	}
	if n := wc.count() - before; n < 1 || n > 3 {
		t.Fatalf("%d writes for %d KiB of events, want 1 to 3", n, 2*coalesceBytes>>10)
	}
	khatruWrite(t, g, `["CLOSED","b","error: done"]`)
	want = append(want, `["CLOSED","b","error: done"]`)
	if got := wc.messages(t); !sameMessages(got, want) {
		t.Fatalf("the client got %d messages, want the %d written, in order", len(got), len(want))
	}
}

func sameMessages(got, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}
