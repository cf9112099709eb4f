package relay

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/store"
)

// TestShutdownClosesClients: when Run ends, the relay closes its clients'
// websocket connections, which http.Server.Shutdown leaves open (it does not
// track hijacked connections).
func TestShutdownClosesClients(t *testing.T) {
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Addr: ln.Addr().String(), PublicURL: service, TrustedAddresses: "127.0.0.1"}
	r := newRelay(cfg, st, nil, discard(), time.Now)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, ln) }()
	c := dial(t, "ws://"+cfg.Addr)
	stillServed(t, c)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("relay: %v", err)
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	if _, raw, err := c.c.Read(rctx); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("after the relay stopped the client read %q, %v; want its connection closed", raw, err)
	}
}
