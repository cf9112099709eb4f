package graspd_test

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/services/graspd"
)

// A client importing a repository sends its announcement and then the
// issues tagging it on one connection, without waiting for each OK. Each
// event must be judged after those sent before it, also right after graspd
// starts (docs/decisions/0019-messages-of-one-connection-in-order.md): all are accepted. The client is a plain websocket (the gorilla
// fork khatru uses), writing the whole burst in one write.
//
// 20 fresh graspd, 1,000 issues each (about 2 s a run here); with -race,
// which makes each event some twenty times slower, 2 runs; with -short, 2
// runs of 300 issues. Before the fix every run of 300 lost issues.
func TestAnnouncementThenDependentEventsInOneBurst(t *testing.T) {
	runs, issues := 20, 1000
	switch {
	case testing.Short():
		runs, issues = 2, 300
	case raceDetector:
		runs = 2
	}
	for run := 0; run < runs; run++ {
		t.Run(fmt.Sprint("run ", run), func(t *testing.T) {
			app := startGraspd(t, graspd.AllServices)
			owner := testkit.NewKey()
			ann := owner.Announcement("burst",
				[]string{testkit.GraspCloneURL(app.PublicURL(), owner.PubKey, "burst")},
				[]string{app.PublicURL()}, nil)
			repo := testkit.RepoRef(owner.PubKey, "burst")
			evts := []*nostr.Event{ann}
			for i := 0; i < issues; i++ {
				evts = append(evts, testkit.NewKey().Issue(repo, fmt.Sprint("issue ", i)))
			}
			burst := clientFrames(t, evts)

			d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
			conn, resp, err := d.Dial(app.RelayURL(), http.Header{})
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			_ = resp.Body.Close()
			defer conn.Close()
			wrote := make(chan error, 1)
			go func() {
				nc := conn.UnderlyingConn()
				_ = nc.SetWriteDeadline(time.Now().Add(60 * time.Second))
				_, err := nc.Write(burst)
				wrote <- err
			}()
			refused := 0
			for range evts {
				_ = conn.SetReadDeadline(time.Now().Add(60 * time.Second))
				_, msg, err := conn.ReadMessage()
				if err != nil {
					t.Fatalf("read: %v", err)
				}
				var ok nostr.OKEnvelope
				if err := ok.FromJSON(string(msg)); err != nil {
					t.Fatalf("relay sent %s", msg)
				}
				if !ok.OK {
					if refused == 0 {
						t.Errorf("%s refused: %s", ok.EventID, ok.Reason)
					}
					refused++
				}
			}
			if err := <-wrote; err != nil {
				t.Fatalf("write: %v", err)
			}
			if refused > 0 {
				t.Fatalf("%d of %d events refused", refused, len(evts))
			}
		})
	}
}

// clientFrames encodes each event as an EVENT message in a masked client
// frame (RFC 6455 §5.2, §5.3), back to back.
func clientFrames(t *testing.T, evts []*nostr.Event) []byte {
	t.Helper()
	var out []byte
	for _, evt := range evts {
		p, err := json.Marshal(nostr.EventEnvelope{Event: *evt})
		if err != nil {
			t.Fatal(err)
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
	return out
}
