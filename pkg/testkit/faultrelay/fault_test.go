package faultrelay

import (
	"bytes"
	"net"
	"testing"
	"time"
)

// A pipe stalled before the proxy's upgrade response has gone through still
// forwards that response, and nothing after it: the proxy stalls right after
// accepting the upgrade, possibly before the pipe has read the response, and
// a client that never sees it fails to dial instead of meeting a silent open
// connection (a clean-clone CI run lost that race under load, and
// TestStalledRelayDeclaredDead failed to dial after 60 s).
func TestStalledPipeForwardsUpgradeResponse(t *testing.T) {
	for _, tc := range []struct {
		name   string
		writes []string
	}{
		{"one write", []string{"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\nFRAME"}},
		{"split blank line", []string{"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r", "\nFRAME"}},
		{"frame later", []string{"HTTP/1.1 101 Switching Protocols\r\n\r\n", "FRAME"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clientEnd, client := net.Pipe() // client: the pipe's client side
			proxy, inner := net.Pipe()      // inner: the pipe's proxy side
			p := &pipe{client: client, inner: inner, stalled: make(chan struct{})}
			p.stall()
			done := make(chan struct{})
			go func() { defer close(done); p.copy(client, inner, true) }()
			got := make(chan []byte, 1)
			go func() {
				var b bytes.Buffer
				buf := make([]byte, 1024)
				for {
					_ = clientEnd.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
					n, err := clientEnd.Read(buf)
					b.Write(buf[:n])
					if err != nil {
						got <- b.Bytes()
						return
					}
				}
			}()
			for _, w := range tc.writes {
				if _, err := proxy.Write([]byte(w)); err != nil {
					t.Fatal(err)
				}
			}
			received := string(<-got)
			_ = proxy.Close()
			<-done
			want := "HTTP/1.1 101"
			if !bytes.HasPrefix([]byte(received), []byte(want)) || !bytes.HasSuffix([]byte(received), []byte("\r\n\r\n")) {
				t.Fatalf("client received %q, want the whole upgrade response", received)
			}
		})
	}
}
