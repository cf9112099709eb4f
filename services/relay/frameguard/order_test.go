package frameguard

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"testing"
)

func TestSecondString(t *testing.T) {
	tests := []struct {
		msg  string
		want string
		ok   bool
	}{
		{`["EOSE","x"]`, "x", true},
		{` [ "CLOSED" , "a\"b" , "reason"]`, `a"b`, true},
		{`["NEG-MSG","n","` + strings.Repeat("ab", 1000), "n", true}, // first frame of a long message
		{`["OK",1]`, "", false},
		{`["EOSE"]`, "", false},
		{`{"a":1}`, "", false},
		{`["NOTICE","unterminated`, "", false},
	}
	for _, tt := range tests {
		got, ok := secondString([]byte(tt.msg))
		if got != tt.want || ok != tt.ok {
			t.Errorf("secondString(%.40s) = %q, %v; want %q, %v", tt.msg, got, ok, tt.want, tt.ok)
		}
	}
}

func TestAwaitedEnds(t *testing.T) {
	req := answer("x", "EOSE", "CLOSED")
	event := answer("", "OK")
	tests := []struct {
		a    awaited
		msg  string
		want bool
	}{
		{req, `["EOSE","x"]`, true},
		{req, `["CLOSED","x","blocked: no"]`, true},
		{req, `["EOSE","y"]`, false},
		{req, `["EVENT","x",{}]`, false},
		{req, `["NOTICE","failed to parse envelope: bad"]`, true},
		{req, `["NOTICE","something else"]`, false},
		{event, `["OK","` + strings.Repeat("a", 64) + `",true,""]`, true},
		{event, `["EVENT","x",{}]`, false},
		{event, `["AUTH","challenge"]`, false},
		{awaited{kind: awaitClose, sub: "x"}, `["CLOSED","x",""]`, false},
	}
	for _, tt := range tests {
		if got := tt.a.ends([]byte(tt.msg)); got != tt.want {
			t.Errorf("%+v ends %s = %v", tt.a, tt.msg, got)
		}
	}
}

// The guard hands khatru the next message only after khatru's answer to the
// previous one (or, for a CLOSE, after the subscription's contexts end),
// and precedes a REQ reusing an open id with a CLOSE of it. Here the test
// plays khatru: it reads what the guard forwards and answers.
func TestGuardOrdersMessages(t *testing.T) {
	lim := Limits{MaxMessage: 1000, MaxFilters: 2, MaxSubs: 10, MaxSubIDLen: 64}
	evt := `["EVENT",{"id":"` + strings.Repeat("e", 64) + `"}]`
	in := clientFrames(`["REQ","a",{}]`, evt, `["REQ","a",{"kinds":[1]}]`, `["CLOSE","a"]`, `["EOSE","a"]`, `["REQ","b",{}]`)
	pc := &pipeConn{in: bytes.NewReader(in)}
	g := New(pc, lim, nil, nil, nil)
	g.upgraded = true
	g.subs = NewSubscriptions()

	// khatru's reading goroutine.
	forwarded := make(chan string)
	go func() {
		defer close(forwarded)
		var buf []byte
		tmp := make([]byte, 5)
		for {
			n, err := g.Read(tmp)
			buf = append(buf, tmp[:n]...)
			for {
				h, ok, _ := parseHeader(buf)
				if !ok || len(buf) < h.headLen+int(h.length) {
					break
				}
				p := append([]byte(nil), buf[h.headLen:h.headLen+int(h.length)]...)
				unmask(p, h.mask, 0)
				buf = buf[h.headLen+int(h.length):]
				if !h.control() {
					forwarded <- string(p)
				}
			}
			if err != nil {
				return
			}
		}
	}()
	reply := func(msg string) {
		t.Helper()
		if _, err := g.Write(appendFrame(nil, opText, true, false, []byte(msg))); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(want string) {
		t.Helper()
		if got := <-forwarded; got != want {
			t.Fatalf("khatru got %s, want %s", got, want)
		}
	}

	expect(`["REQ","a",{}]`)
	ctx1, cancel1 := context.WithCancel(context.Background())
	g.subs.Add("a", ctx1) // khatru's filter hook
	reply(`["EVENT","a",{}]`)
	reply(`["EOSE","a"]`)
	expect(evt)
	reply(`["OK","` + strings.Repeat("e", 64) + `",true,""]`)
	expect(`["CLOSE","a"]`) // the guard's, for the REQ that replaces "a"
	cancel1()               // khatru removes the subscription
	expect(`["REQ","a",{"kinds":[1]}]`)
	ctx2, cancel2 := context.WithCancel(context.Background())
	g.subs.Add("a", ctx2)
	reply(`["EOSE","a"]`)
	expect(`["CLOSE","a"]`) // the client's
	cancel2()
	// ["EOSE","a"] from the client is dropped: khatru ignores it.
	expect(`["REQ","b",{}]`)
	reply(`["EOSE","b"]`)
	if m, ok := <-forwarded; ok {
		t.Fatalf("khatru got %s after the last message", m)
	}
}

// A wait for khatru ends when the connection closes.
func TestGuardWaitEndsOnClose(t *testing.T) {
	lim := Limits{MaxMessage: 1000, MaxFilters: 2, MaxSubs: 10, MaxSubIDLen: 64}
	client, server := net.Pipe()
	defer client.Close()
	g := New(server, lim, nil, nil, nil)
	g.upgraded = true
	g.subs = NewSubscriptions()
	// The first REQ is never answered; the second waits until Close.
	go func() { _, _ = client.Write(clientFrames(`["REQ","a",{}]`, `["REQ","b",{}]`)) }()
	first := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 512)
		if _, err := g.Read(buf); err != nil { // the first REQ, whole
			done <- err
			return
		}
		close(first)
		for { // the ping inside the second REQ passes; the REQ waits
			n, err := g.Read(buf)
			if bytes.Contains(buf[:n], []byte(`"b"`)) {
				err = errors.New("the second REQ went to khatru before the first was answered")
			}
			if err != nil {
				done <- err
				return
			}
		}
	}()
	select {
	case <-first:
	case err := <-done:
		t.Fatal(err)
	}
	_ = g.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read ended with %v, want net.ErrClosed", err)
	}
}
