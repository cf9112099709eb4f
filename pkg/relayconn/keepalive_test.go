package relayconn_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
)

// pingCountingServer is a websocket endpoint that counts the pings it
// receives and, when chatty, pings the client every 10 ms itself (as
// khatru and strfry ping their clients).
func pingCountingServer(t *testing.T, chatty bool) (url string, pings *atomic.Int64) {
	t.Helper()
	pings = new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{
			OnPingReceived: func(context.Context, []byte) bool { pings.Add(1); return true },
		})
		if err != nil {
			return
		}
		defer c.CloseNow()
		ctx := c.CloseRead(r.Context())
		if !chatty {
			<-ctx.Done()
			return
		}
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_ = c.Ping(pctx)
				cancel()
			}
		}
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http"), pings
}

// The keepalive pings a silent relay every interval but not one that pings
// us itself: a relay heard from is alive. Both connections run side by
// side for as long as the silent relay takes to receive 8 pings, so a
// loaded machine slows both alike; the relay that pings every 10 ms gets
// at most one ping in that time (a keepalive round that started before its
// first ping arrived).
func TestKeepalivePingsOnlySilentRelays(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	silentURL, silentPings := pingCountingServer(t, false)
	chattyURL, chattyPings := pingCountingServer(t, true)
	opts := relayconn.Options{PingInterval: 100 * time.Millisecond, PongTimeout: 10 * time.Second}
	silent, err := relayconn.Dial(ctx, silentURL, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	chatty, err := relayconn.Dial(ctx, chattyURL, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer chatty.Close()
	for silentPings.Load() < 8 {
		select {
		case <-ctx.Done():
			t.Fatalf("the silent relay got %d pings, want 8: keepalive not pinging", silentPings.Load())
		case <-silent.Context().Done():
			t.Fatalf("silent but answering relay declared dead: %v", context.Cause(silent.Context()))
		case <-time.After(10 * time.Millisecond):
		}
	}
	if n := chattyPings.Load(); n > 1 {
		t.Errorf("the relay that pings every 10 ms got %d pings while the silent one got 8, want at most 1", n)
	}
	if err := chatty.Context().Err(); err != nil {
		t.Errorf("chatty relay's connection ended: %v", context.Cause(chatty.Context()))
	}
}
