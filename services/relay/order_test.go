package relay

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

// These tests speak to the relay with a websocket library of their own
// (the gorilla fork khatru itself uses), not through the guard's codec or
// testkit's client, so that they share no assumption with the code under
// test about how messages are framed or dispatched.

// wsClient is one raw websocket connection to the relay.
type wsClient struct {
	t    *testing.T
	conn *websocket.Conn
}

func dialWS(t *testing.T, url string) *wsClient {
	t.Helper()
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
	conn, resp, err := d.Dial(url, http.Header{})
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	_ = resp.Body.Close()
	t.Cleanup(func() { _ = conn.Close() })
	return &wsClient{t: t, conn: conn}
}

// send writes each message as its own websocket message, one after the
// other, without waiting for any answer.
func (c *wsClient) send(msgs ...any) {
	c.t.Helper()
	for _, m := range msgs {
		b, err := json.Marshal(m)
		if err != nil {
			c.t.Fatal(err)
		}
		_ = c.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
		if err := c.conn.WriteMessage(websocket.TextMessage, b); err != nil {
			c.t.Fatalf("write: %v", err)
		}
	}
}

// sendOneWrite writes the messages as client frames (masked, RFC 6455
// §5.3) in a single write on the TCP connection, so they reach the relay
// back to back in one segment where the transport allows.
func (c *wsClient) sendOneWrite(msgs ...any) {
	c.t.Helper()
	var out []byte
	for _, m := range msgs {
		p, err := json.Marshal(m)
		if err != nil {
			c.t.Fatal(err)
		}
		out = append(out, 0x81) // FIN, text
		switch n := len(p); {
		case n < 126:
			out = append(out, 0x80|byte(n))
		case n <= 0xffff:
			out = append(out, 0x80|126)
			out = binary.BigEndian.AppendUint16(out, uint16(n))
		default:
			out = append(out, 0x80|127)
			out = binary.BigEndian.AppendUint64(out, uint64(n))
		}
		var key [4]byte
		_, _ = rand.Read(key[:])
		out = append(out, key[:]...)
		for i, b := range p {
			out = append(out, b^key[i%4])
		}
	}
	nc := c.conn.UnderlyingConn()
	_ = nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := nc.Write(out); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// read returns the next message as raw JSON elements.
func (c *wsClient) read() []json.RawMessage {
	c.t.Helper()
	_ = c.conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, b, err := c.conn.ReadMessage()
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(b, &parts); err != nil || len(parts) < 2 {
		c.t.Fatalf("relay sent %q", b)
	}
	return parts
}

func str(raw json.RawMessage) string {
	var s string
	_ = json.Unmarshal(raw, &s)
	return s
}

// untilEOSE reads the answer to REQ id: the ids of its events up to its
// EOSE. Any other message (a CLOSED, an event for another subscription)
// fails the test.
func (c *wsClient) untilEOSE(id string) []string {
	c.t.Helper()
	var got []string
	for {
		parts := c.read()
		label, sub := str(parts[0]), str(parts[1])
		switch {
		case label == "EVENT" && sub == id && len(parts) == 3:
			var evt nostr.Event
			if err := json.Unmarshal(parts[2], &evt); err != nil {
				c.t.Fatal(err)
			}
			got = append(got, evt.ID)
		case label == "EOSE" && sub == id:
			return got
		default:
			c.t.Fatalf("while waiting for EOSE %s, got %s", id, parts)
		}
	}
}

// storedNotes fills the relay's store with n notes and returns their ids.
func storedNotes(t *testing.T, s *server, n int) []string {
	t.Helper()
	k := testkit.NewKey()
	ids := make([]string, n)
	for i := range ids {
		evt := k.Note(fmt.Sprintf("note %d", i))
		if _, err := s.store.Save(context.Background(), evt); err != nil {
			t.Fatal(err)
		}
		ids[i] = evt.ID
	}
	return ids
}

// chunk returns the i-th chunk of size n of ids, wrapping around.
func chunk(ids []string, i, n int) []string {
	out := make([]string, n)
	for j := range out {
		out[j] = ids[(i*n+j)%len(ids)]
	}
	return out
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// A client fetching ids in chunks over one reused subscription id, as the
// rust-nostr SDK does after a NIP-77 sync: REQ x … EOSE, then CLOSE x and at
// once REQ x with the next chunk. Every chunk must arrive complete before its
// EOSE. khatru handles each message in a goroutine of its own, so without
// the guard's ordering the CLOSE could run after the next REQ had started
// and cancel it: no events, then EOSE (docs/decisions/0019-messages-of-one-connection-in-order.md).
func TestReusedSubscriptionIDServesEveryChunk(t *testing.T) {
	chunks, size := 1000, 20
	if testing.Short() {
		chunks = 200
	}
	s := startServer(t, serverOpts{})
	ids := storedNotes(t, s, 300)

	t.Run("separate writes", func(t *testing.T) {
		c := dialWS(t, s.url)
		c.send(nostr.ReqEnvelope{SubscriptionID: "x", Filters: nostr.Filters{{IDs: chunk(ids, 0, size)}}})
		for i := 0; i < chunks; i++ {
			want := chunk(ids, i, size)
			if got := c.untilEOSE("x"); !sameSet(got, want) {
				t.Fatalf("chunk %d: %d of %d events before EOSE", i, len(got), len(want))
			}
			next := nostr.ReqEnvelope{SubscriptionID: "x", Filters: nostr.Filters{{IDs: chunk(ids, i+1, size)}}}
			c.send(nostr.CloseEnvelope("x"), next)
		}
	})

	// REQ x, CLOSE x and REQ x in one write: the first REQ is answered
	// completely (its EOSE comes before the CLOSE takes effect), then the
	// second.
	t.Run("one write", func(t *testing.T) {
		c := dialWS(t, s.url)
		for i := 0; i < chunks; i += 2 {
			first, second := chunk(ids, i, size), chunk(ids, i+1, size)
			c.sendOneWrite(
				nostr.ReqEnvelope{SubscriptionID: "x", Filters: nostr.Filters{{IDs: first}}},
				nostr.CloseEnvelope("x"),
				nostr.ReqEnvelope{SubscriptionID: "x", Filters: nostr.Filters{{IDs: second}}},
			)
			if got := c.untilEOSE("x"); !sameSet(got, first) {
				t.Fatalf("chunk %d: %d of %d events before EOSE", i, len(got), len(first))
			}
			if got := c.untilEOSE("x"); !sameSet(got, second) {
				t.Fatalf("chunk %d: %d of %d events before EOSE", i+1, len(got), len(second))
			}
			c.send(nostr.CloseEnvelope("x"))
		}
	})
}

// NIP-01: a REQ with the id of an open subscription replaces it. The old
// filter must no longer deliver live events.
func TestREQReplacesSubscriptionWithSameID(t *testing.T) {
	s := startServer(t, serverOpts{})
	alice := testkit.NewKey()
	pub := dial(t, s.url)
	if ok, m := pub.publish(served(alice, "repo")); !ok {
		t.Fatal(m)
	}
	issue := alice.Issue(testkit.RepoRef(alice.PubKey, "repo"), "live")

	sub := dialWS(t, s.url)
	sub.send(nostr.ReqEnvelope{SubscriptionID: "x", Filters: nostr.Filters{{IDs: []string{issue.ID}}}})
	if got := sub.untilEOSE("x"); len(got) != 0 {
		t.Fatalf("stored events for an unpublished id: %v", got)
	}
	sub.send(nostr.ReqEnvelope{SubscriptionID: "x", Filters: nostr.Filters{{Kinds: []int{1}, LimitZero: true}}})
	if got := sub.untilEOSE("x"); len(got) != 0 {
		t.Fatalf("stored events for a limit-0 filter: %v", got)
	}
	if ok, m := pub.publish(issue); !ok {
		t.Fatal(m)
	}
	// The relay broadcasts before it answers OK, so a broadcast to the
	// replaced filter would be on the wire before the answer to this REQ.
	sub.send(nostr.ReqEnvelope{SubscriptionID: "probe", Filters: nostr.Filters{{IDs: []string{issue.ID}}}})
	for {
		parts := sub.read()
		label, id := str(parts[0]), str(parts[1])
		if label == "EVENT" && id == "x" {
			t.Fatal("the replaced subscription still delivers live events")
		}
		if label == "EOSE" && id == "probe" {
			return
		}
	}
}

// One connection sends events back to back without waiting for OKs; each is
// judged after those sent before it, so events that depend on an earlier
// one (issues tagging an announcement) are accepted.
func TestEventsJudgedInOrderSent(t *testing.T) {
	n := 300
	if testing.Short() {
		n = 100
	}
	s := startServer(t, serverOpts{})
	owner := testkit.NewKey()
	ann := served(owner, "repo")
	msgs := []any{nostr.EventEnvelope{Event: *ann}}
	for i := 0; i < n; i++ {
		issue := testkit.NewKey().Issue(testkit.RepoRef(owner.PubKey, "repo"), fmt.Sprint("issue ", i))
		msgs = append(msgs, nostr.EventEnvelope{Event: *issue})
	}
	c := dialWS(t, s.url)
	c.sendOneWrite(msgs...)
	for i := range msgs {
		parts := c.read()
		if str(parts[0]) != "OK" || len(parts) < 4 {
			t.Fatalf("message %d: got %s", i, parts)
		}
		var ok bool
		_ = json.Unmarshal(parts[2], &ok)
		if !ok {
			t.Fatalf("%s refused: %s", str(parts[1]), str(parts[3]))
		}
	}
}

// Messages without a proper label are answered by the relay and never reach
// khatru: its NIP-77 fallback parser panics on some (`[","]`), which took
// the whole process down. Each malformed message gets a NOTICE, in order,
// and the connection keeps working.
func TestMalformedMessagesAnsweredInOrder(t *testing.T) {
	s := startServer(t, serverOpts{})
	c := dialWS(t, s.url)
	bad := []string{`[","]`, `"",`, `["REQ"]`, `["NEG-OPEN","n"]`, `["WHAT","x"]`, `["EVENT",1]`}
	for _, m := range bad {
		if err := c.conn.WriteMessage(websocket.TextMessage, []byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	c.send(nostr.ReqEnvelope{SubscriptionID: "after", Filters: nostr.Filters{{Kinds: []int{1}, Limit: 1}}})
	for _, m := range bad {
		parts := c.read()
		if str(parts[0]) != "NOTICE" {
			t.Fatalf("answer to %s: %s", m, parts)
		}
	}
	if got := c.untilEOSE("after"); len(got) != 0 {
		t.Fatalf("events: %v", got)
	}
}
